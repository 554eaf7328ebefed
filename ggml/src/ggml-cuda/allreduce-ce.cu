// pyllama_so: copy-engine AllReduce for two GPUs, and the routing of the CUDA comm context.
//
// Without peer access, NCCL and the internal pipeline move data through host memory with SMs.
// Here the copy engines do it: each GPU converts its F32 part to BF16 (one small kernel), copies it
// to pinned host memory in 512 KiB chunks on its send stream, and on its receive stream copies the
// peer's chunks back as soon as each has landed. A small kernel then adds the two BF16 values in F32,
// always as part0 + part1, so both GPUs hold bit-identical results.
//
// Ordering is done with events only (no host waits, nothing that breaks stream capture). The work
// is cut into rounds of at most one slot; two slots alternate, so round r+1 converts and sends while
// round r is still in transfer, and a slot is only rewritten after every reader of its previous
// round (own D2H, peer's H2D, own add kernel) has been waited for with an event.

#include "allreduce-ce.cuh"
#include "pyllama-so-allreduce.h"

#include "ggml-backend.h"
#include "ggml-cuda.h"
#include "ggml-impl.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Counters (all platforms)
// ---------------------------------------------------------------------------------------------

static std::atomic<uint64_t> g_ce_calls[PYLLAMA_SO_AR_PATH_COUNT];
static std::atomic<uint64_t> g_ce_bytes[PYLLAMA_SO_AR_PATH_COUNT];
static std::atomic<uint64_t> g_ce_rounds;
static std::atomic<uint64_t> g_ce_buffer_allocs;
static std::atomic<uint64_t> g_ce_alloc_failures;

static void ggml_cuda_ce_count(int path, size_t nbytes) {
    g_ce_calls[path].fetch_add(1, std::memory_order_relaxed);
    g_ce_bytes[path].fetch_add(nbytes, std::memory_order_relaxed);
}

static int ggml_cuda_ce_stats_get(pyllama_so_allreduce_stats * out) {
    if (out == nullptr || out->size != sizeof(struct pyllama_so_allreduce_stats)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    for (int i = 0; i < PYLLAMA_SO_AR_PATH_COUNT; ++i) {
        out->calls[i] = g_ce_calls[i].load(std::memory_order_relaxed);
        out->bytes[i] = g_ce_bytes[i].load(std::memory_order_relaxed);
    }
    out->ce_rounds         = g_ce_rounds.load(std::memory_order_relaxed);
    out->ce_buffer_allocs  = g_ce_buffer_allocs.load(std::memory_order_relaxed);
    out->ce_alloc_failures = g_ce_alloc_failures.load(std::memory_order_relaxed);
    return PYLLAMA_SO_AR_OK;
}

static void ggml_cuda_ce_stats_reset(void) {
    for (int i = 0; i < PYLLAMA_SO_AR_PATH_COUNT; ++i) {
        g_ce_calls[i].store(0, std::memory_order_relaxed);
        g_ce_bytes[i].store(0, std::memory_order_relaxed);
    }
    g_ce_rounds.store(0, std::memory_order_relaxed);
    g_ce_buffer_allocs.store(0, std::memory_order_relaxed);
    g_ce_alloc_failures.store(0, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

static constexpr size_t GGML_CUDA_CE_CHUNK_BYTES       = 512 * 1024;      // one cudaMemcpyAsync
static constexpr int    GGML_CUDA_CE_N_SLOTS           = 2;
static constexpr size_t GGML_CUDA_CE_SLOT_BYTES        = 4 * 1024 * 1024; // BF16 bytes per slot and direction
static constexpr int    GGML_CUDA_CE_SLOT_CHUNKS       = (int) (GGML_CUDA_CE_SLOT_BYTES / GGML_CUDA_CE_CHUNK_BYTES);
static constexpr int64_t GGML_CUDA_CE_SLOT_ELEMS       = (int64_t) (GGML_CUDA_CE_SLOT_BYTES / sizeof(uint16_t));
static constexpr size_t GGML_CUDA_CE_VRAM_BYTES        = 2 * GGML_CUDA_CE_N_SLOTS * GGML_CUDA_CE_SLOT_BYTES; // send + recv: 16 MiB
static constexpr size_t GGML_CUDA_CE_HOST_BYTES        = GGML_CUDA_CE_N_SLOTS * GGML_CUDA_CE_SLOT_BYTES;     // 8 MiB
static constexpr size_t GGML_CUDA_CE_MIN_BYTES_DEFAULT = 512 * 1024;

static_assert(GGML_CUDA_CE_SLOT_BYTES % GGML_CUDA_CE_CHUNK_BYTES == 0, "a slot must hold whole chunks");

// GGML_CUDA_AR_CE: -1 auto (unset), 0 off, 1 force.
static int ggml_cuda_ce_env_mode() {
    const char * v = getenv("GGML_CUDA_AR_CE");
    if (v == nullptr || v[0] == '\0') {
        return -1;
    }
    if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "false") == 0) {
        return 0;
    }
    if (strcmp(v, "1") == 0 || strcmp(v, "on") == 0 || strcmp(v, "true") == 0 || strcmp(v, "force") == 0) {
        return 1;
    }
    GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_CE=\"%s\" (expected 0 or 1)\n", __func__, v);
    return -1;
}

static size_t ggml_cuda_ce_env_min_bytes() {
    const char * v = getenv("GGML_CUDA_AR_CE_MIN_BYTES");
    if (v == nullptr || v[0] == '\0') {
        return GGML_CUDA_CE_MIN_BYTES_DEFAULT;
    }
    char * end = nullptr;
    const unsigned long long parsed = strtoull(v, &end, 10);
    if (end == v || *end != '\0' || parsed == 0 || v[0] == '-') {
        GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_CE_MIN_BYTES=\"%s\" (expected a byte count >= 1)\n", __func__, v);
        return GGML_CUDA_CE_MIN_BYTES_DEFAULT;
    }
    return (size_t) parsed;
}

static bool ggml_cuda_ce_env_fail_alloc() {
    const char * v = getenv("GGML_CUDA_AR_CE_FAIL_ALLOC");
    return v != nullptr && v[0] != '\0' && strcmp(v, "0") != 0;
}

// ---------------------------------------------------------------------------------------------
// Copy-engine transfer (CUDA only)
// ---------------------------------------------------------------------------------------------

struct ggml_cuda_ce_device {
    int          device = -1;
    cudaStream_t send   = nullptr; // D2H of our parts
    cudaStream_t recv   = nullptr; // H2D of the peer's parts
    char *       vram   = nullptr; // [slot] send part, then [slot] recv part (BF16)
    char *       host   = nullptr; // pinned, portable: [slot] our part, read by the peer

    cudaEvent_t conv_done[GGML_CUDA_CE_N_SLOTS]                          = {}; // compute: send part written
    cudaEvent_t d2h_chunk[GGML_CUDA_CE_N_SLOTS][GGML_CUDA_CE_SLOT_CHUNKS] = {}; // send: chunk is in host memory
    cudaEvent_t d2h_done [GGML_CUDA_CE_N_SLOTS]                          = {}; // send: done reading send part
    cudaEvent_t h2d_done [GGML_CUDA_CE_N_SLOTS]                          = {}; // recv: recv part written, peer's host slot read
    cudaEvent_t add_done [GGML_CUDA_CE_N_SLOTS]                          = {}; // compute: done reading both parts

    uint16_t * send_part(int slot) const { return (uint16_t *) (vram + (size_t) slot * GGML_CUDA_CE_SLOT_BYTES); }
    uint16_t * recv_part(int slot) const {
        return (uint16_t *) (vram + (size_t) (GGML_CUDA_CE_N_SLOTS + slot) * GGML_CUDA_CE_SLOT_BYTES);
    }
    char * host_part(int slot) const { return host + (size_t) slot * GGML_CUDA_CE_SLOT_BYTES; }
};

enum ggml_cuda_ce_state {
    GGML_CUDA_CE_STATE_UNALLOCATED,
    GGML_CUDA_CE_STATE_READY,
    GGML_CUDA_CE_STATE_FAILED,
};

struct ggml_cuda_ce_router {
    ggml_backend_t     backends[2] = {};
    int                dev_ids[2]  = {};
    size_t             n_backends  = 0;
    ggml_cuda_ce_paths paths;

    bool   ce_enabled = false; // large F32 reductions go to the copy engines
    size_t min_bytes  = GGML_CUDA_CE_MIN_BYTES_DEFAULT;
    bool   fail_alloc = false;

    ggml_cuda_ce_state  state   = GGML_CUDA_CE_STATE_UNALLOCATED;
    uint64_t            round   = 0; // rounds issued so far; slot = round % N_SLOTS
    ggml_cuda_ce_device dev[2];
    bool                capture_logged = false;
};

#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)

#define GGML_CUDA_CE_SUPPORTED 1

// Round to nearest even, NaN kept quiet; integer arithmetic so that -use_fast_math cannot change it.
static __device__ __forceinline__ uint16_t ggml_cuda_ce_f32_to_bf16(const float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x0040u);
    }
    return (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float ggml_cuda_ce_bf16_to_f32(const uint16_t h) {
    return __uint_as_float((uint32_t) h << 16);
}

// Plain IEEE add: no .ftz, so denormals survive the -use_fast_math that ggml-cuda is built with.
static __device__ __forceinline__ float ggml_cuda_ce_add_rn(const float a, const float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

static __global__ void ggml_cuda_ce_to_bf16_kernel(const float * __restrict__ src, uint16_t * __restrict__ dst, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = ggml_cuda_ce_f32_to_bf16(src[i]);
    }
}

// dst = part0 + part1 in this order on both GPUs, so both results are bit-identical.
static __global__ void ggml_cuda_ce_add_kernel(
        const uint16_t * __restrict__ part0, const uint16_t * __restrict__ part1, float * __restrict__ dst, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = ggml_cuda_ce_add_rn(ggml_cuda_ce_bf16_to_f32(part0[i]), ggml_cuda_ce_bf16_to_f32(part1[i]));
    }
}

static dim3 ggml_cuda_ce_grid(const int n) {
    const int block = 256;
    return dim3((unsigned) std::max(1, std::min((n + block - 1) / block, 1024)));
}

static void ggml_cuda_ce_free_buffers(ggml_cuda_ce_router * r) {
    // Teardown only: drain whatever still reads or writes our buffers on either device.
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_ce_device & d = r->dev[i];
        if (d.device < 0) {
            continue;
        }
        ggml_cuda_set_device(d.device);
        if (d.send) { CUDA_CHECK(cudaStreamSynchronize(d.send)); }
        if (d.recv) { CUDA_CHECK(cudaStreamSynchronize(d.recv)); }
        if (r->state == GGML_CUDA_CE_STATE_READY) {
            auto * cuda_ctx = static_cast<ggml_backend_cuda_context *>(r->backends[i]->context);
            CUDA_CHECK(cudaStreamSynchronize(cuda_ctx->stream()));
        }
    }
    for (int i = 0; i < 2; ++i) {
        ggml_cuda_ce_device & d = r->dev[i];
        if (d.device < 0) {
            continue;
        }
        ggml_cuda_set_device(d.device);
        for (int s = 0; s < GGML_CUDA_CE_N_SLOTS; ++s) {
            cudaEvent_t * evs[] = { &d.conv_done[s], &d.d2h_done[s], &d.h2d_done[s], &d.add_done[s] };
            for (cudaEvent_t * ev : evs) {
                if (*ev) { CUDA_CHECK(cudaEventDestroy(*ev)); *ev = nullptr; }
            }
            for (int c = 0; c < GGML_CUDA_CE_SLOT_CHUNKS; ++c) {
                if (d.d2h_chunk[s][c]) { CUDA_CHECK(cudaEventDestroy(d.d2h_chunk[s][c])); d.d2h_chunk[s][c] = nullptr; }
            }
        }
        if (d.send) { CUDA_CHECK(cudaStreamDestroy(d.send)); d.send = nullptr; }
        if (d.recv) { CUDA_CHECK(cudaStreamDestroy(d.recv)); d.recv = nullptr; }
        if (d.vram) { CUDA_CHECK(cudaFree(d.vram));          d.vram = nullptr; }
        if (d.host) { CUDA_CHECK(cudaFreeHost(d.host));      d.host = nullptr; }
        d.device = -1;
    }
}

// Allocation errors are expected (out of memory) and must not abort: collect them here.
#define GGML_CUDA_CE_TRY(call) do { if (err == cudaSuccess) { err = (call); } } while (0)

static bool ggml_cuda_ce_alloc_buffers(ggml_cuda_ce_router * r) {
    cudaError_t err = r->fail_alloc ? cudaErrorMemoryAllocation : cudaSuccess;
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) {
        ggml_cuda_ce_device & d = r->dev[i];
        d.device = r->dev_ids[i];
        ggml_cuda_set_device(d.device);
        GGML_CUDA_CE_TRY(cudaMalloc((void **) &d.vram, GGML_CUDA_CE_VRAM_BYTES));
        // portable: the peer GPU copies from it too
        GGML_CUDA_CE_TRY(cudaHostAlloc((void **) &d.host, GGML_CUDA_CE_HOST_BYTES, cudaHostAllocPortable));
        GGML_CUDA_CE_TRY(cudaStreamCreateWithFlags(&d.send, cudaStreamNonBlocking));
        GGML_CUDA_CE_TRY(cudaStreamCreateWithFlags(&d.recv, cudaStreamNonBlocking));
        for (int s = 0; s < GGML_CUDA_CE_N_SLOTS; ++s) {
            GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&d.conv_done[s], cudaEventDisableTiming));
            GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&d.d2h_done[s],  cudaEventDisableTiming));
            GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&d.h2d_done[s],  cudaEventDisableTiming));
            GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&d.add_done[s],  cudaEventDisableTiming));
            for (int c = 0; c < GGML_CUDA_CE_SLOT_CHUNKS; ++c) {
                GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&d.d2h_chunk[s][c], cudaEventDisableTiming));
            }
        }
    }
    if (err != cudaSuccess) {
        (void) cudaGetLastError(); // clear the sticky error of the failed call
        ggml_cuda_ce_free_buffers(r);
        r->state = GGML_CUDA_CE_STATE_FAILED;
        g_ce_alloc_failures.fetch_add(1, std::memory_order_relaxed);
        GGML_LOG_WARN("%s: copy-engine AllReduce disabled for devices %d,%d: buffer allocation failed (%s%s); "
                      "large reductions go to %s\n", __func__, r->dev_ids[0], r->dev_ids[1], cudaGetErrorString(err),
                      r->fail_alloc ? ", GGML_CUDA_AR_CE_FAIL_ALLOC" : "",
                      r->paths.nccl ? "NCCL" : "the internal pipeline");
        return false;
    }
    r->state = GGML_CUDA_CE_STATE_READY;
    g_ce_buffer_allocs.fetch_add(1, std::memory_order_relaxed);
    GGML_LOG_INFO("%s: copy-engine AllReduce on devices %d,%d: %zu MiB VRAM + %zu MiB pinned host memory per GPU, "
                  "reductions from %zu bytes\n", __func__, r->dev_ids[0], r->dev_ids[1],
                  GGML_CUDA_CE_VRAM_BYTES >> 20, GGML_CUDA_CE_HOST_BYTES >> 20, r->min_bytes);
    return true;
}

#undef GGML_CUDA_CE_TRY

// Host issue order per round r (slot s = r % 2, p = peer), every wait issued after the record it
// means and before that event is recorded again for round r + 2:
//   A(r) compute: wait d2h_done[s] (own D2H of r-2); convert (or zero) -> send part; record conv_done[s]
//   B(r) send:    wait conv_done[s]; wait peer h2d_done[s] (peer read our host slot of r-2);
//                 D2H chunks, record d2h_chunk[s][c] each; record d2h_done[s]
//   C(r) recv:    wait add_done[s] (own add of r-2 read the recv part); per chunk: wait peer
//                 d2h_chunk[s][c], H2D; record h2d_done[s]
//   D(r) compute: wait h2d_done[s]; add part0 + part1 -> tensor; record add_done[s]
// Issued as A B C (both GPUs) for round r, then D for round r-1: the compute stream converts the
// next piece before it blocks on the previous piece's transfer.
static bool ggml_cuda_ce_allreduce(ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    cudaStream_t compute[2];
    for (int i = 0; i < 2; ++i) {
        auto * cuda_ctx = static_cast<ggml_backend_cuda_context *>(r->backends[i]->context);
        GGML_ASSERT(cuda_ctx->device == r->dev_ids[i]);
        compute[i] = cuda_ctx->stream();
        // Events recorded before a capture cannot be waited on inside it; the meta backend reduces
        // between captured subgraphs, so this is a guard, not a path.
        ggml_cuda_set_device(r->dev_ids[i]);
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(compute[i], &capture));
        if (capture != cudaStreamCaptureStatusNone) {
            if (!r->capture_logged) {
                GGML_LOG_DEBUG("%s: stream is capturing; leaving this reduction to the next path\n", __func__);
                r->capture_logged = true;
            }
            return false;
        }
    }

    if (r->state == GGML_CUDA_CE_STATE_UNALLOCATED) {
        ggml_cuda_ce_alloc_buffers(r);
    }
    if (r->state != GGML_CUDA_CE_STATE_READY) {
        return false;
    }

    const int64_t ne       = ggml_nelements(tensors[0]);
    const int64_t n_rounds = (ne + GGML_CUDA_CE_SLOT_ELEMS - 1) / GGML_CUDA_CE_SLOT_ELEMS;
    bool active[2];
    float * data[2];
    for (int i = 0; i < 2; ++i) {
        active[i] = (tensors[i]->flags & GGML_TENSOR_FLAG_COMPUTE) != 0;
        data[i]   = static_cast<float *>(tensors[i]->data);
    }

    for (int64_t k = 0; k <= n_rounds; ++k) {
        if (k < n_rounds) {
            const uint64_t rnd    = r->round + (uint64_t) k;
            const int      s      = (int) (rnd % GGML_CUDA_CE_N_SLOTS);
            const bool     reused = rnd >= GGML_CUDA_CE_N_SLOTS;
            const int64_t  off    = k * GGML_CUDA_CE_SLOT_ELEMS;
            const int      m      = (int) std::min(GGML_CUDA_CE_SLOT_ELEMS, ne - off);
            const size_t   bytes  = (size_t) m * sizeof(uint16_t);
            const int      chunks = (int) ((bytes + GGML_CUDA_CE_CHUNK_BYTES - 1) / GGML_CUDA_CE_CHUNK_BYTES);

            for (int i = 0; i < 2; ++i) { // A, B
                const int p = 1 - i;
                ggml_cuda_ce_device & d  = r->dev[i];
                ggml_cuda_ce_device & dp = r->dev[p];
                ggml_cuda_set_device(d.device);

                if (reused) {
                    CUDA_CHECK(cudaStreamWaitEvent(compute[i], d.d2h_done[s], 0));
                }
                if (active[i]) {
                    ggml_cuda_ce_to_bf16_kernel<<<ggml_cuda_ce_grid(m), 256, 0, compute[i]>>>(data[i] + off, d.send_part(s), m);
                    CUDA_CHECK(cudaGetLastError());
                } else {
                    // inactive shard / empty slice: contributes zeros, as on the NCCL and internal paths
                    CUDA_CHECK(cudaMemsetAsync(d.send_part(s), 0, bytes, compute[i]));
                }
                CUDA_CHECK(cudaEventRecord(d.conv_done[s], compute[i]));

                CUDA_CHECK(cudaStreamWaitEvent(d.send, d.conv_done[s], 0));
                if (reused) {
                    CUDA_CHECK(cudaStreamWaitEvent(d.send, dp.h2d_done[s], 0));
                }
                for (int c = 0; c < chunks; ++c) {
                    const size_t c_off   = (size_t) c * GGML_CUDA_CE_CHUNK_BYTES;
                    const size_t c_bytes = std::min(GGML_CUDA_CE_CHUNK_BYTES, bytes - c_off);
                    CUDA_CHECK(cudaMemcpyAsync(d.host_part(s) + c_off, (const char *) d.send_part(s) + c_off, c_bytes,
                                               cudaMemcpyDeviceToHost, d.send));
                    CUDA_CHECK(cudaEventRecord(d.d2h_chunk[s][c], d.send));
                }
                CUDA_CHECK(cudaEventRecord(d.d2h_done[s], d.send));
            }

            for (int i = 0; i < 2; ++i) { // C
                const int p = 1 - i;
                ggml_cuda_ce_device & d  = r->dev[i];
                ggml_cuda_ce_device & dp = r->dev[p];
                ggml_cuda_set_device(d.device);

                if (reused) {
                    CUDA_CHECK(cudaStreamWaitEvent(d.recv, d.add_done[s], 0));
                }
                for (int c = 0; c < chunks; ++c) {
                    const size_t c_off   = (size_t) c * GGML_CUDA_CE_CHUNK_BYTES;
                    const size_t c_bytes = std::min(GGML_CUDA_CE_CHUNK_BYTES, bytes - c_off);
                    CUDA_CHECK(cudaStreamWaitEvent(d.recv, dp.d2h_chunk[s][c], 0));
                    CUDA_CHECK(cudaMemcpyAsync((char *) d.recv_part(s) + c_off, dp.host_part(s) + c_off, c_bytes,
                                               cudaMemcpyHostToDevice, d.recv));
                }
                CUDA_CHECK(cudaEventRecord(d.h2d_done[s], d.recv));
            }
        }

        if (k > 0) { // D for the previous round
            const uint64_t rnd = r->round + (uint64_t) (k - 1);
            const int      s   = (int) (rnd % GGML_CUDA_CE_N_SLOTS);
            const int64_t  off = (k - 1) * GGML_CUDA_CE_SLOT_ELEMS;
            const int      m   = (int) std::min(GGML_CUDA_CE_SLOT_ELEMS, ne - off);

            for (int i = 0; i < 2; ++i) {
                ggml_cuda_ce_device & d = r->dev[i];
                ggml_cuda_set_device(d.device);
                CUDA_CHECK(cudaStreamWaitEvent(compute[i], d.h2d_done[s], 0));
                const uint16_t * part0 = i == 0 ? d.send_part(s) : d.recv_part(s);
                const uint16_t * part1 = i == 0 ? d.recv_part(s) : d.send_part(s);
                ggml_cuda_ce_add_kernel<<<ggml_cuda_ce_grid(m), 256, 0, compute[i]>>>(part0, part1, data[i] + off, m);
                CUDA_CHECK(cudaGetLastError());
                CUDA_CHECK(cudaEventRecord(d.add_done[s], compute[i]));
            }
        }
    }

    r->round += (uint64_t) n_rounds;
    g_ce_rounds.fetch_add((uint64_t) n_rounds, std::memory_order_relaxed);
    return true;
}

#else // GGML_USE_HIP || GGML_USE_MUSA

#define GGML_CUDA_CE_SUPPORTED 0

static void ggml_cuda_ce_free_buffers(ggml_cuda_ce_router *) {
}

static bool ggml_cuda_ce_allreduce(ggml_cuda_ce_router *, ggml_tensor **) {
    return false;
}

#endif // !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)

// ---------------------------------------------------------------------------------------------
// Router (all platforms)
// ---------------------------------------------------------------------------------------------

static bool ggml_cuda_ce_peer_access(const int dev0, const int dev1) {
#if !GGML_CUDA_CE_SUPPORTED
    GGML_UNUSED(dev0);
    GGML_UNUSED(dev1);
    return false;
#else
    const ggml_cuda_device_info & info = ggml_cuda_info();
    const int p0 = info.devices[dev0].physical_device;
    const int p1 = info.devices[dev1].physical_device;
    if (p0 == p1) {
        return false; // virtual devices on one GPU: no NCCL there, and nothing to peer with
    }
    int a = 0;
    int b = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&a, p0, p1));
    CUDA_CHECK(cudaDeviceCanAccessPeer(&b, p1, p0));
    return a && b;
#endif // !GGML_CUDA_CE_SUPPORTED
}

ggml_cuda_ce_router * ggml_cuda_ce_router_init(
        ggml_backend_t * backends, const int * dev_ids, size_t n_backends, const ggml_cuda_ce_paths & paths) {
    auto * r = new ggml_cuda_ce_router;
    r->paths      = paths;
    r->n_backends = n_backends;
    for (size_t i = 0; i < n_backends && i < 2; ++i) {
        r->backends[i] = backends[i];
        r->dev_ids[i]  = dev_ids[i];
    }
    r->min_bytes  = ggml_cuda_ce_env_min_bytes();
    r->fail_alloc = ggml_cuda_ce_env_fail_alloc();

    const int mode = ggml_cuda_ce_env_mode();
    const char * why = nullptr;
    if (!GGML_CUDA_CE_SUPPORTED) {
        why = "unsupported on this platform";
    } else if (n_backends != 2) {
        why = "needs exactly two devices";
    } else if (paths.none) {
        why = "GGML_CUDA_ALLREDUCE selects no backend AllReduce";
    } else if (mode == 0) {
        why = "GGML_CUDA_AR_CE=0";
    } else if (mode != 1 && ggml_cuda_ce_peer_access(dev_ids[0], dev_ids[1])) {
        why = "peer access available (GGML_CUDA_AR_CE=1 forces it)";
    }
    if (why != nullptr) {
        GGML_LOG_DEBUG("%s: copy-engine AllReduce off: %s\n", __func__, why);
        return r;
    }

    r->ce_enabled = true;
    // The internal pipeline takes the reductions below the threshold; bring it up if the init
    // chain chose NCCL. It needs Volta or newer; without it small reductions go to NCCL.
    if (paths.ar_pipeline != nullptr && *paths.ar_pipeline == nullptr) {
        *paths.ar_pipeline = ggml_cuda_ar_pipeline_init(dev_ids, n_backends);
        if (*paths.ar_pipeline == nullptr) {
            (void) cudaGetLastError();
        }
    }
    GGML_LOG_DEBUG("%s: copy-engine AllReduce on for devices %d,%d from %zu bytes%s\n", __func__,
                   dev_ids[0], dev_ids[1], r->min_bytes, mode == 1 ? " (forced)" : "");
    return r;
}

void ggml_cuda_ce_router_free(ggml_cuda_ce_router * r) {
    if (r == nullptr) {
        return;
    }
    ggml_cuda_ce_free_buffers(r);
    delete r;
}

// F32, same shape, contiguous, on both devices: what the copy engines take.
static bool ggml_cuda_ce_eligible(const ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    if (r->n_backends != 2 || tensors[0] == nullptr || tensors[1] == nullptr) {
        return false;
    }
    const int64_t ne = ggml_nelements(tensors[0]);
    for (int i = 0; i < 2; ++i) {
        const ggml_tensor * t = tensors[i];
        if (t->type != GGML_TYPE_F32 || ggml_nelements(t) != ne || !ggml_is_contiguous(t) || t->data == nullptr) {
            return false;
        }
    }
    return true;
}

// The internal pipeline asserts (instead of declining) on sizes that are not a multiple of 16 bytes,
// so such reductions must not be routed there.
static bool ggml_cuda_ce_internal_takes(const ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    for (size_t i = 0; i < r->n_backends; ++i) {
        if (tensors[i] != nullptr && (ggml_nbytes(tensors[i]) & 0xF) != 0) {
            return false;
        }
    }
    return true;
}

static bool ggml_cuda_ce_try(ggml_cuda_ce_router * r, const int path, ggml_tensor ** tensors) {
    switch (path) {
        case PYLLAMA_SO_AR_PATH_CE:
            return ggml_cuda_ce_allreduce(r, tensors);
        case PYLLAMA_SO_AR_PATH_NCCL:
            return r->paths.nccl != nullptr && r->paths.nccl(r->paths.comm_ctx, tensors);
        case PYLLAMA_SO_AR_PATH_INTERNAL:
            return r->paths.ar_pipeline != nullptr && *r->paths.ar_pipeline != nullptr &&
                   r->paths.internal != nullptr && ggml_cuda_ce_internal_takes(r, tensors) &&
                   r->paths.internal(r->paths.comm_ctx, tensors);
        default:
            return false;
    }
}

bool ggml_cuda_ce_router_allreduce(ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    if (r == nullptr) {
        return false;
    }
    if (tensors[0] != nullptr && ggml_nelements(tensors[0]) == 0) {
        return true; // empty output (e.g. no outputs in this ubatch): nothing to reduce, as upstream
    }
    const size_t nbytes = tensors[0] != nullptr ? ggml_nbytes(tensors[0]) : 0;

    int order[3];
    int n_order = 0;
    if (!r->ce_enabled) {
        // upstream's choice, unchanged: the one path its init chain brought up
        order[n_order++] = r->paths.nccl != nullptr ? PYLLAMA_SO_AR_PATH_NCCL : PYLLAMA_SO_AR_PATH_INTERNAL;
    } else if (ggml_cuda_ce_eligible(r, tensors)) {
        if (nbytes >= r->min_bytes) {
            order[n_order++] = PYLLAMA_SO_AR_PATH_CE;
            order[n_order++] = PYLLAMA_SO_AR_PATH_NCCL;
            order[n_order++] = PYLLAMA_SO_AR_PATH_INTERNAL;
        } else {
            order[n_order++] = PYLLAMA_SO_AR_PATH_INTERNAL;
            order[n_order++] = PYLLAMA_SO_AR_PATH_NCCL;
        }
    } else {
        order[n_order++] = PYLLAMA_SO_AR_PATH_NCCL;
        order[n_order++] = PYLLAMA_SO_AR_PATH_INTERNAL;
    }

    for (int k = 0; k < n_order; ++k) {
        if (ggml_cuda_ce_try(r, order[k], tensors)) {
            ggml_cuda_ce_count(order[k], nbytes);
            return true;
        }
    }
    ggml_cuda_ce_count(PYLLAMA_SO_AR_PATH_FALLBACK, nbytes);
    return false;
}

// ---------------------------------------------------------------------------------------------
// Test and benchmark entries: reductions on two CUDA backends, without a model
// ---------------------------------------------------------------------------------------------

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

    int init(const int32_t * devices, bool with_comm) {
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
        return comm != nullptr ? PYLLAMA_SO_AR_OK : PYLLAMA_SO_AR_ENOCOMM;
    }

    cudaStream_t stream(int i) const {
        return static_cast<ggml_backend_cuda_context *>(backends[i]->context)->stream();
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

static int ggml_cuda_ce_run(const pyllama_so_allreduce_run_params * p) {
    if (p == nullptr || p->size != sizeof(*p) || p->n < 0 || p->n_iter < 1 ||
        p->input[0] == nullptr || p->input[1] == nullptr || p->output[0] == nullptr || p->output[1] == nullptr) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    ggml_cuda_ce_rig rig;
    int rc = rig.init(p->devices, /*with_comm =*/ true);
    if (rc != PYLLAMA_SO_AR_OK) {
        return rc;
    }
    const size_t row   = (size_t) p->n * sizeof(float);
    const size_t total = row * (size_t) p->n_iter;
    ggml_tensor * t[2];
    if (!rig.alloc_work(p->n) || !rig.work_tensors(p->n, p->inactive, t)) {
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
        if (!rig.allreduce(rig.comm, t)) {
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

// Both GPUs copy `bytes` device->pinned host and pinned host->device at once, n times: the
// traffic of a copy-engine AllReduce of that wire size, without any synchronization between GPUs.
static int ggml_cuda_ce_bench_ceiling(ggml_cuda_ce_rig & rig, const int32_t * devices, size_t bytes,
                                      int n_warmup, int n_iter, double * us) {
    struct side {
        cudaStream_t d2h = nullptr, h2d = nullptr;
        cudaEvent_t  start = nullptr, h2d_end = nullptr, end = nullptr;
        char *       src = nullptr;
        char *       dst = nullptr;
        char *       host_out = nullptr;
        char *       host_in  = nullptr;
    } s[2];
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
                    CUDA_CHECK(cudaMemcpyAsync(s[i].host_out, s[i].src, bytes, cudaMemcpyDeviceToHost, s[i].d2h));
                    CUDA_CHECK(cudaMemcpyAsync(s[i].dst, s[i].host_in, bytes, cudaMemcpyHostToDevice, s[i].h2d));
                }
            }
            for (int i = 0; i < 2; ++i) {
                ggml_cuda_set_device(devices[i]);
                CUDA_CHECK(cudaEventRecord(s[i].h2d_end, s[i].h2d));
                CUDA_CHECK(cudaStreamWaitEvent(s[i].d2h, s[i].h2d_end, 0));
                CUDA_CHECK(cudaEventRecord(s[i].end, s[i].d2h));
            }
            double worst = 0.0;
            for (int i = 0; i < 2; ++i) {
                ggml_cuda_set_device(devices[i]);
                CUDA_CHECK(cudaEventSynchronize(s[i].end));
                float ms = 0.0f;
                CUDA_CHECK(cudaEventElapsedTime(&ms, s[i].start, s[i].end));
                worst = std::max(worst, (double) ms);
            }
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

static int ggml_cuda_ce_bench(const pyllama_so_allreduce_bench_params * p) {
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
    int rc = rig.init(p->devices, comm);
    if (rc != PYLLAMA_SO_AR_OK) {
        return rc;
    }
    if (!comm) {
        for (int k = 0; k < p->n_sizes && rc == PYLLAMA_SO_AR_OK; ++k) {
            rc = ggml_cuda_ce_bench_ceiling(rig, p->devices, (size_t) p->n_bytes[k], p->n_warmup, p->n_iter, &p->us_per_iter[k]);
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
        for (int i = 0; i < 2 && rc == PYLLAMA_SO_AR_OK; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            CUDA_CHECK(cudaEventRecord(start[i], rig.stream(i)));
        }
        for (int it = 0; it < p->n_iter && rc == PYLLAMA_SO_AR_OK; ++it) {
            if (!rig.allreduce(rig.comm, t)) {
                rc = PYLLAMA_SO_AR_EDECLINED;
            }
        }
        if (rc != PYLLAMA_SO_AR_OK) {
            break;
        }
        double worst = 0.0;
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            CUDA_CHECK(cudaEventRecord(end[i], rig.stream(i)));
        }
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_set_device(p->devices[i]);
            CUDA_CHECK(cudaEventSynchronize(end[i]));
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], end[i]));
            worst = std::max(worst, (double) ms);
        }
        p->us_per_iter[k] = worst * 1000.0 / p->n_iter;
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

static int ggml_cuda_ce_run(const pyllama_so_allreduce_run_params *) {
    return PYLLAMA_SO_AR_EUNSUPPORTED;
}

static int ggml_cuda_ce_bench(const pyllama_so_allreduce_bench_params *) {
    return PYLLAMA_SO_AR_EUNSUPPORTED;
}

#endif // GGML_CUDA_CE_SUPPORTED

void * ggml_cuda_ce_proc_address(const char * name) {
    if (strcmp(name, PYLLAMA_SO_AR_STATS_NAME) == 0) {
        return (void *) ggml_cuda_ce_stats_get;
    }
    if (strcmp(name, PYLLAMA_SO_AR_STATS_RESET_NAME) == 0) {
        return (void *) ggml_cuda_ce_stats_reset;
    }
    if (strcmp(name, PYLLAMA_SO_AR_RUN_NAME) == 0) {
        return (void *) ggml_cuda_ce_run;
    }
    if (strcmp(name, PYLLAMA_SO_AR_BENCH_NAME) == 0) {
        return (void *) ggml_cuda_ce_bench;
    }
    return nullptr;
}
