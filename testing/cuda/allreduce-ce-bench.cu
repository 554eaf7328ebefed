// pyllama_so test harness: test and benchmark entries of the copy-engine AllReduce (ggml/src/ggml-cuda/
// allreduce-ce.cu): reductions of host data on two CUDA backends through a fresh comm context, without a
// model, and the pinned-copy ceiling (allreduce-rig.h). Its own library, pyllama-so-allreduce-rig, linked
// against ggml-cuda; reached from Python through pyllama_so.bench.allreduce_rig.

#include "allreduce-ce.cuh"
#include "allreduce-rig.h"

#include "ggml-backend.h"
#include "ggml-cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#if GGML_CUDA_CE_SUPPORTED

namespace {

// Two CUDA backends and a comm context over them, as the meta backend would make them.
struct ggml_cuda_ce_rig {
    ggml_backend_t                       backends[2] = {};
    void *                               comm        = nullptr;
    ggml_backend_comm_free_t             comm_free   = nullptr;
    ggml_backend_comm_allreduce_tensor_t allreduce   = nullptr;
    ggml_context *                       ctx         = nullptr;
    ggml_backend_buffer_t                bufs[2]     = {};
    std::vector<void *>                  dev_allocs[2];

    // with_comm: a comm context too, with `settings` unless their size is 0 (then the defaults)
    int init(const int32_t * devices, bool with_comm, const pyllama_so_allreduce_params & settings) {
        const int n_dev = ggml_backend_cuda_get_device_count();
        if (devices[0] == devices[1]) {
            return PYLLAMA_SO_AR_EINVAL;
        }
        for (int i = 0; i < 2; ++i) {
            if (devices[i] < 0 || devices[i] >= n_dev) {
                return PYLLAMA_SO_AR_ENODEV;
            }
            backends[i] = ggml_backend_cuda_init(devices[i]);
            if (backends[i] == nullptr) {
                return PYLLAMA_SO_AR_ENODEV;
            }
        }
        ggml_init_params params = { /*.mem_size =*/ 256 * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true };
        ctx = ggml_init(params);
        if (!with_comm) {
            return PYLLAMA_SO_AR_OK;
        }
        ggml_backend_reg_t reg = ggml_backend_cuda_reg();
        auto comm_init = (ggml_backend_comm_init_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_init");
        comm_free = (ggml_backend_comm_free_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_free");
        allreduce = (ggml_backend_comm_allreduce_tensor_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_allreduce_tensor");
        if (comm_init == nullptr || comm_free == nullptr || allreduce == nullptr) {
            return PYLLAMA_SO_AR_ENOCOMM;
        }
        comm = comm_init(backends, 2);
        if (comm == nullptr) {
            return PYLLAMA_SO_AR_ENOCOMM;
        }
        if (settings.size == 0) {
            return PYLLAMA_SO_AR_OK;
        }
        auto configure = (pyllama_so_allreduce_comm_configure_t) ggml_backend_reg_get_proc_address(reg, PYLLAMA_SO_AR_COMM_CONFIGURE_NAME);
        return configure != nullptr ? configure(comm, &settings) : PYLLAMA_SO_AR_ENOCOMM;
    }

    cudaStream_t stream(int i) const {
        return static_cast<ggml_backend_cuda_context *>(backends[i]->context)->stream();
    }

    // ev[i] on device i's backend stream.
    void record(const int32_t * devices, cudaEvent_t ev[2]) const {
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(devices[i]);
            CUDA_CHECK(cudaEventRecord(ev[i], stream(i)));
        }
    }

    // One F32 buffer per device, holding `n_max` elements, for the work tensors.
    bool alloc_work(int64_t n_max) {
        for (int i = 0; i < 2; ++i) {
            bufs[i] = ggml_backend_alloc_buffer(backends[i], std::max<size_t>((size_t) n_max * sizeof(float), 256));
            if (bufs[i] == nullptr) {
                return false;
            }
        }
        return true;
    }

    // Work tensors of n elements on both devices, at the start of the work buffers.
    bool work_tensors(int64_t n, uint32_t inactive, ggml_tensor * out[2]) {
        for (int i = 0; i < 2; ++i) {
            out[i] = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
            if (out[i] == nullptr ||
                ggml_backend_tensor_alloc(bufs[i], out[i], ggml_backend_buffer_get_base(bufs[i])) != GGML_STATUS_SUCCESS) {
                return false;
            }
            if ((inactive & (1u << i)) == 0) {
                out[i]->flags |= GGML_TENSOR_FLAG_COMPUTE;
            }
        }
        return true;
    }

    void * dev_alloc(int i, size_t bytes) {
        ggml_cuda_set_device(static_cast<ggml_backend_cuda_context *>(backends[i]->context)->device);
        void * p = nullptr;
        if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) {
            (void) cudaGetLastError();
            return nullptr;
        }
        dev_allocs[i].push_back(p);
        return p;
    }

    void sync() {
        for (int i = 0; i < 2; ++i) {
            if (backends[i]) {
                ggml_backend_synchronize(backends[i]);
            }
        }
    }

    ~ggml_cuda_ce_rig() {
        sync();
        if (comm) {
            comm_free(comm);
        }
        for (int i = 0; i < 2; ++i) {
            if (backends[i]) {
                ggml_cuda_set_device(static_cast<ggml_backend_cuda_context *>(backends[i]->context)->device);
                for (void * p : dev_allocs[i]) {
                    CUDA_CHECK(cudaFree(p));
                }
            }
            if (bufs[i]) {
                ggml_backend_buffer_free(bufs[i]);
            }
        }
        if (ctx) {
            ggml_free(ctx);
        }
        for (int i = 0; i < 2; ++i) {
            if (backends[i]) {
                ggml_backend_free(backends[i]);
            }
        }
    }
};

} // namespace

int pyllama_so_allreduce_run(const pyllama_so_allreduce_run_params * p) {
    if (p == nullptr || p->size != sizeof(*p) || p->n < 0 || p->n_iter < 1 || p->n_alt < 0 || p->n_alt > p->n ||
        p->input[0] == nullptr || p->input[1] == nullptr || p->output[0] == nullptr || p->output[1] == nullptr) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    ggml_cuda_ce_rig rig;
    int rc = rig.init(p->devices, /*with_comm =*/ true, p->allreduce);
    if (rc != PYLLAMA_SO_AR_OK) {
        return rc;
    }
    const size_t row   = (size_t) p->n * sizeof(float);
    const size_t total = row * (size_t) p->n_iter;
    ggml_tensor * t[2];
    ggml_tensor * t_alt[2]; // the first n_alt elements of t, for the odd reductions
    if (!rig.alloc_work(p->n) || !rig.work_tensors(p->n, p->inactive, t) ||
        (p->n_alt > 0 && !rig.work_tensors(p->n_alt, p->inactive, t_alt))) {
        return PYLLAMA_SO_AR_ENOMEM;
    }
    char * in[2];
    char * out[2];
    for (int i = 0; i < 2; ++i) {
        in[i]  = (char *) rig.dev_alloc(i, total);
        out[i] = (char *) rig.dev_alloc(i, total);
        if (in[i] == nullptr || out[i] == nullptr) {
            return PYLLAMA_SO_AR_ENOMEM;
        }
        CUDA_CHECK(cudaMemcpy(in[i], p->input[i], total, cudaMemcpyHostToDevice));
    }

    // All on the backends' streams, no host sync between reductions: the race hunt.
    for (int32_t it = 0; it < p->n_iter && rc == PYLLAMA_SO_AR_OK; ++it) {
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            if (row > 0) {
                CUDA_CHECK(cudaMemcpyAsync(t[i]->data, in[i] + (size_t) it * row, row, cudaMemcpyDeviceToDevice, rig.stream(i)));
            }
        }
        if (!rig.allreduce(rig.comm, p->n_alt > 0 && it % 2 == 1 ? t_alt : t)) {
            rc = PYLLAMA_SO_AR_EDECLINED;
            break;
        }
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            if (row > 0) {
                CUDA_CHECK(cudaMemcpyAsync(out[i] + (size_t) it * row, t[i]->data, row, cudaMemcpyDeviceToDevice, rig.stream(i)));
            }
        }
    }
    rig.sync();
    if (rc == PYLLAMA_SO_AR_OK) {
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            CUDA_CHECK(cudaMemcpy(p->output[i], out[i], total, cudaMemcpyDeviceToHost));
        }
    }
    return rc;
}

// Milliseconds from start[i] to end[i] on the slower of the two devices, once both have ended.
static double ggml_cuda_ce_worst_ms(const int32_t * devices, cudaEvent_t const start[2], cudaEvent_t const end[2]) {
    double worst = 0.0;
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_set_device(devices[i]);
        CUDA_CHECK(cudaEventSynchronize(end[i]));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], end[i]));
        worst = std::max(worst, (double) ms);
    }
    return worst;
}

// Both GPUs copy `bytes` device->pinned host and pinned host->device at once, n times: the
// traffic of a copy-engine AllReduce of that wire size, without any synchronization between GPUs.
// With chunk > 0 each copy is issued as copies of that size, back to back on its stream: the
// ceiling of that chunk size, which shows the copy engines' own cost per copy.
static int ggml_cuda_ce_bench_ceiling(ggml_cuda_ce_rig & rig, const int32_t * devices, size_t bytes, size_t chunk,
                                      int n_warmup, int n_iter, double * us) {
    struct side {
        cudaStream_t d2h = nullptr, h2d = nullptr;
        cudaEvent_t  start = nullptr, h2d_end = nullptr, end = nullptr;
        char *       src = nullptr;
        char *       dst = nullptr;
        char *       host_out = nullptr;
        char *       host_in  = nullptr;
    } s[2];
    if (chunk == 0) {
        chunk = bytes;
    }
    int rc = PYLLAMA_SO_AR_OK;
    for (int i = 0; i < 2 && rc == PYLLAMA_SO_AR_OK; ++i) {
        s[i].src = (char *) rig.dev_alloc(i, bytes);
        s[i].dst = (char *) rig.dev_alloc(i, bytes);
        ggml_cuda_set_device(devices[i]);
        if (s[i].src == nullptr || s[i].dst == nullptr ||
            cudaHostAlloc((void **) &s[i].host_out, bytes, cudaHostAllocPortable) != cudaSuccess ||
            cudaHostAlloc((void **) &s[i].host_in,  bytes, cudaHostAllocPortable) != cudaSuccess) {
            (void) cudaGetLastError();
            rc = PYLLAMA_SO_AR_ENOMEM;
            break;
        }
        CUDA_CHECK(cudaStreamCreateWithFlags(&s[i].d2h, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamCreateWithFlags(&s[i].h2d, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreate(&s[i].start));
        CUDA_CHECK(cudaEventCreateWithFlags(&s[i].h2d_end, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreate(&s[i].end));
    }
    if (rc == PYLLAMA_SO_AR_OK) {
        for (int pass = 0; pass < 2; ++pass) {
            const int n = pass == 0 ? n_warmup : n_iter;
            for (int i = 0; i < 2; ++i) {
                ggml_cuda_set_device(devices[i]);
                CUDA_CHECK(cudaEventRecord(s[i].start, s[i].d2h));
                CUDA_CHECK(cudaStreamWaitEvent(s[i].h2d, s[i].start, 0));
            }
            for (int it = 0; it < n; ++it) {
                for (int i = 0; i < 2; ++i) {
                    ggml_cuda_set_device(devices[i]);
                    for (size_t off = 0; off < bytes; off += chunk) {
                        const size_t m = std::min(chunk, bytes - off);
                        CUDA_CHECK(cudaMemcpyAsync(s[i].host_out + off, s[i].src + off, m, cudaMemcpyDeviceToHost, s[i].d2h));
                        CUDA_CHECK(cudaMemcpyAsync(s[i].dst + off, s[i].host_in + off, m, cudaMemcpyHostToDevice, s[i].h2d));
                    }
                }
            }
            for (int i = 0; i < 2; ++i) {
                ggml_cuda_set_device(devices[i]);
                CUDA_CHECK(cudaEventRecord(s[i].h2d_end, s[i].h2d));
                CUDA_CHECK(cudaStreamWaitEvent(s[i].d2h, s[i].h2d_end, 0));
                CUDA_CHECK(cudaEventRecord(s[i].end, s[i].d2h));
            }
            const cudaEvent_t start[2] = { s[0].start, s[1].start };
            const cudaEvent_t end[2]   = { s[0].end,   s[1].end };
            const double worst = ggml_cuda_ce_worst_ms(devices, start, end);
            if (pass == 1) {
                *us = worst * 1000.0 / std::max(1, n_iter);
            }
        }
    }
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_set_device(devices[i]);
        if (s[i].d2h)      { CUDA_CHECK(cudaStreamSynchronize(s[i].d2h)); CUDA_CHECK(cudaStreamDestroy(s[i].d2h)); }
        if (s[i].h2d)      { CUDA_CHECK(cudaStreamSynchronize(s[i].h2d)); CUDA_CHECK(cudaStreamDestroy(s[i].h2d)); }
        if (s[i].start)    { CUDA_CHECK(cudaEventDestroy(s[i].start)); }
        if (s[i].h2d_end)  { CUDA_CHECK(cudaEventDestroy(s[i].h2d_end)); }
        if (s[i].end)      { CUDA_CHECK(cudaEventDestroy(s[i].end)); }
        if (s[i].host_out) { CUDA_CHECK(cudaFreeHost(s[i].host_out)); }
        if (s[i].host_in)  { CUDA_CHECK(cudaFreeHost(s[i].host_in)); }
    }
    return rc;
}

// Holds a stream for `ns` nanoseconds of wall-clock time.
static __global__ void ggml_cuda_ce_delay_kernel(const uint64_t ns) {
    uint64_t t0;
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// GPU time per reduction with the host's issue time left out: GPU 0 sits in a delay kernel (GPU 1
// waits for it) while the host queues n reductions, which then run back to back. NaN if the host
// had not queued them all when the delay ended (then its issue time would count again).
static double ggml_cuda_ce_bench_queued(ggml_cuda_ce_rig & rig, const int32_t * devices, ggml_tensor ** t, const int n,
                                        const double host_us_per_iter, cudaEvent_t start[2], cudaEvent_t end[2], bool * declined) {
    const double delay_us = std::max(5000.0, 4.0 * n * host_us_per_iter);
    cudaEvent_t go = nullptr;
    rig.sync();
    ggml_cuda_set_device(devices[0]);
    CUDA_CHECK(cudaEventCreateWithFlags(&go, cudaEventDisableTiming));
    ggml_cuda_ce_delay_kernel<<<1, 1, 0, rig.stream(0)>>>((uint64_t) (delay_us * 1000.0));
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(go, rig.stream(0)));
    ggml_cuda_set_device(devices[1]);
    CUDA_CHECK(cudaStreamWaitEvent(rig.stream(1), go, 0));
    rig.record(devices, start);
    const auto host_t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < n && !*declined; ++it) {
        *declined = !rig.allreduce(rig.comm, t);
    }
    const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_t0).count();
    rig.record(devices, end);
    const double worst = ggml_cuda_ce_worst_ms(devices, start, end);
    ggml_cuda_set_device(devices[0]);
    CUDA_CHECK(cudaEventDestroy(go));
    return host_us < delay_us ? worst * 1000.0 / n : std::nan("");
}

int pyllama_so_allreduce_bench(const pyllama_so_allreduce_bench_params * p) {
    if (p == nullptr || p->size != sizeof(*p) || p->n_sizes < 1 || p->n_bytes == nullptr || p->us_per_iter == nullptr ||
        p->n_warmup < 0 || p->n_iter < 1 ||
        (p->mode != PYLLAMA_SO_AR_BENCH_COMM && p->mode != PYLLAMA_SO_AR_BENCH_CEILING)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    int64_t max_bytes = 0;
    for (int k = 0; k < p->n_sizes; ++k) {
        if (p->n_bytes[k] < (int64_t) sizeof(float) || p->n_bytes[k] % sizeof(float) != 0) {
            return PYLLAMA_SO_AR_EINVAL;
        }
        max_bytes = std::max(max_bytes, p->n_bytes[k]);
    }
    const bool comm = p->mode == PYLLAMA_SO_AR_BENCH_COMM;
    ggml_cuda_ce_rig rig;
    int rc = rig.init(p->devices, comm, p->allreduce);
    if (rc != PYLLAMA_SO_AR_OK) {
        return rc;
    }
    if (!comm) {
        // the chunk size of the settings, as the router takes it: the ceiling issued in chunks of that size
        pyllama_so_allreduce_settings settings;
        if (pyllama_so_allreduce_resolve(p->allreduce.size != 0 ? &p->allreduce : nullptr, &settings) != PYLLAMA_SO_AR_OK) {
            return PYLLAMA_SO_AR_EINVAL;
        }
        const size_t chunk = (size_t) settings.chunk_bytes;
        for (int k = 0; k < p->n_sizes && rc == PYLLAMA_SO_AR_OK; ++k) {
            rc = ggml_cuda_ce_bench_ceiling(rig, p->devices, (size_t) p->n_bytes[k], chunk, p->n_warmup, p->n_iter,
                                            &p->us_per_iter[k]);
        }
        return rc;
    }

    if (!rig.alloc_work(max_bytes / (int64_t) sizeof(float))) {
        return PYLLAMA_SO_AR_ENOMEM;
    }
    for (int i = 0; i < 2; ++i) {
        ggml_backend_buffer_clear(rig.bufs[i], 0);
    }
    cudaEvent_t start[2] = {};
    cudaEvent_t end[2]   = {};
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_set_device(p->devices[i]);
        CUDA_CHECK(cudaEventCreate(&start[i]));
        CUDA_CHECK(cudaEventCreate(&end[i]));
    }
    for (int k = 0; k < p->n_sizes && rc == PYLLAMA_SO_AR_OK; ++k) {
        ggml_tensor * t[2];
        if (!rig.work_tensors(p->n_bytes[k] / (int64_t) sizeof(float), 0, t)) {
            rc = PYLLAMA_SO_AR_ENOMEM;
            break;
        }
        // At least one reduction before the start events, so both GPUs start from a common point.
        for (int it = 0; it < std::max(1, p->n_warmup) && rc == PYLLAMA_SO_AR_OK; ++it) {
            if (!rig.allreduce(rig.comm, t)) {
                rc = PYLLAMA_SO_AR_EDECLINED;
            }
        }
        if (rc == PYLLAMA_SO_AR_OK) {
            rig.record(p->devices, start);
        }
        const auto host_t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < p->n_iter && rc == PYLLAMA_SO_AR_OK; ++it) {
            if (!rig.allreduce(rig.comm, t)) {
                rc = PYLLAMA_SO_AR_EDECLINED;
            }
        }
        // host time to issue: when it is close to the GPU time, the path is bound by its API calls
        const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_t0).count();
        if (p->host_us_per_iter != nullptr) {
            p->host_us_per_iter[k] = host_us / p->n_iter;
        }
        if (rc != PYLLAMA_SO_AR_OK) {
            break;
        }
        rig.record(p->devices, end);
        p->us_per_iter[k] = ggml_cuda_ce_worst_ms(p->devices, start, end) * 1000.0 / p->n_iter;
        if (p->queued_us_per_iter != nullptr) {
            bool declined = false;
            p->queued_us_per_iter[k] = ggml_cuda_ce_bench_queued(rig, p->devices, t, std::min(p->n_iter, 8),
                                                                 host_us / p->n_iter, start, end, &declined);
            if (declined) {
                rc = PYLLAMA_SO_AR_EDECLINED;
            }
        }
    }
    rig.sync();
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_set_device(p->devices[i]);
        CUDA_CHECK(cudaEventDestroy(start[i]));
        CUDA_CHECK(cudaEventDestroy(end[i]));
    }
    return rc;
}

#else // !GGML_CUDA_CE_SUPPORTED

int pyllama_so_allreduce_run(const pyllama_so_allreduce_run_params *) {
    return PYLLAMA_SO_AR_EUNSUPPORTED;
}

int pyllama_so_allreduce_bench(const pyllama_so_allreduce_bench_params *) {
    return PYLLAMA_SO_AR_EUNSUPPORTED;
}

#endif // GGML_CUDA_CE_SUPPORTED
