// pyllama_so: copy-engine AllReduce for two GPUs, and the routing of the CUDA comm context.
//
// Without peer access, NCCL and the internal pipeline move data through host memory with SMs.
// Here the copy engines do it: each GPU converts its F32 part to BF16 on its compute stream, copies
// it to pinned host memory in chunks (1 or 2 MiB, see ggml_cuda_ce_chunk_bytes) on its send
// stream, and on its receive stream copies the peer's chunks back as soon as each has landed. A
// small kernel on the compute stream then adds the two BF16 values in F32, always as part0 + part1,
// so both GPUs hold bit-identical results.
//
// Ordering is done with events only (no host waits), and each GPU is ordered by its own compute
// stream: a GPU waits for its peer only where data crosses, never for the peer's whole reduction.
// The work is cut into rounds of at most one slot; two slots alternate, also across reductions, and
// a slot is only rewritten after every reader of its previous round has been waited for with an event.

#include "allreduce-ce.cuh"
#include "allreduce-ll.cuh"
#include "pyllama-so-allreduce.h"
#include "pyllama-so-test-hooks.h"

#include "ggml-backend.h"
#include "ggml-impl.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

// ---------------------------------------------------------------------------------------------
// Counters (all platforms)
// ---------------------------------------------------------------------------------------------

// Reductions and bytes per path and copy-engine rounds, kept for the process and for each comm context (read by
// other threads while the context reduces).
struct ggml_cuda_ce_counters {
    std::atomic<uint64_t> calls[PYLLAMA_SO_AR_PATH_COUNT] = {};
    std::atomic<uint64_t> bytes[PYLLAMA_SO_AR_PATH_COUNT] = {};
    std::atomic<uint64_t> rounds{0};

    void count(int path, size_t nbytes) {
        calls[path].fetch_add(1, std::memory_order_relaxed);
        bytes[path].fetch_add(nbytes, std::memory_order_relaxed);
    }

    void read(uint64_t * out_calls, uint64_t * out_bytes, uint64_t * out_rounds) const {
        for (int i = 0; i < PYLLAMA_SO_AR_PATH_COUNT; ++i) {
            out_calls[i] = calls[i].load(std::memory_order_relaxed);
            out_bytes[i] = bytes[i].load(std::memory_order_relaxed);
        }
        *out_rounds = rounds.load(std::memory_order_relaxed);
    }

    void reset() {
        for (int i = 0; i < PYLLAMA_SO_AR_PATH_COUNT; ++i) {
            calls[i].store(0, std::memory_order_relaxed);
            bytes[i].store(0, std::memory_order_relaxed);
        }
        rounds.store(0, std::memory_order_relaxed);
    }
};

static ggml_cuda_ce_counters g_ce_counters;
static std::atomic<uint64_t> g_ce_buffer_allocs;
static std::atomic<uint64_t> g_ce_alloc_failures;

static int ggml_cuda_ce_stats_get(pyllama_so_allreduce_stats * out) {
    if (out == nullptr || out->size != sizeof(struct pyllama_so_allreduce_stats)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    g_ce_counters.read(out->calls, out->bytes, &out->ce_rounds);
    out->ce_buffer_allocs  = g_ce_buffer_allocs.load(std::memory_order_relaxed);
    out->ce_alloc_failures = g_ce_alloc_failures.load(std::memory_order_relaxed);
    return PYLLAMA_SO_AR_OK;
}

static void ggml_cuda_ce_stats_reset(void) {
    g_ce_counters.reset();
    g_ce_buffer_allocs.store(0, std::memory_order_relaxed);
    g_ce_alloc_failures.store(0, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Configuration (the settings themselves: pyllama_so_allreduce_resolve, in ggml-base)
// ---------------------------------------------------------------------------------------------

static constexpr int    GGML_CUDA_CE_N_SLOTS     = 2;
static constexpr size_t GGML_CUDA_CE_SLOT_BYTES  = PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX; // BF16 bytes per slot and direction
static constexpr int    GGML_CUDA_CE_SLOT_CHUNKS = (int) (GGML_CUDA_CE_SLOT_BYTES / PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN);

// Upstream's rule for BF16 on the wire (allreduce.cu reads the same variable): F32 tensors of at least
// GGML_CUDA_AR_BF16_THRESHOLD bytes (default 1, i.e. all; 0: none). The low-latency path follows it, so that
// switching it on or off changes no result.
static size_t ggml_cuda_ll_env_bf16_threshold() {
    const char * v = getenv("GGML_CUDA_AR_BF16_THRESHOLD");
    if (v == nullptr || v[0] == '\0' || v[0] == '-') {
        return 1;
    }
    char * end = nullptr;
    const unsigned long long value = strtoull(v, &end, 10);
    return end != v && *end == '\0' ? (size_t) value : 1;
}

// ---------------------------------------------------------------------------------------------
// Copy-engine transfer (CUDA only)
// ---------------------------------------------------------------------------------------------

enum ggml_cuda_ce_stream_role {
    GGML_CUDA_CE_SEND, // D2H of our chunks into our pinned slot
    GGML_CUDA_CE_RECV, // H2D of the peer's chunks from its pinned slot
    GGML_CUDA_CE_N_STREAMS,
};

struct ggml_cuda_ce_device {
    int          device = -1;
    cudaStream_t streams[GGML_CUDA_CE_N_STREAMS] = {};
    char *       vram   = nullptr; // [slot] send part, [slot] recv part (BF16)
    char *       host   = nullptr; // pinned, portable: [slot] our part, read by the peer

    // per slot, the latest round in it on this device; the kernels run in two pieces, [0] and [1]
    cudaEvent_t conv_ev [GGML_CUDA_CE_N_SLOTS][2] = {};                        // first chunk / whole round converted
    cudaEvent_t d2h_ev  [GGML_CUDA_CE_N_SLOTS][GGML_CUDA_CE_SLOT_CHUNKS] = {};  // chunk in our host slot
    cudaEvent_t d2h_done[GGML_CUDA_CE_N_SLOTS] = {};                           // send part no longer read
    cudaEvent_t h2d_ev  [GGML_CUDA_CE_N_SLOTS][2] = {};                        // all but the last / all chunks received
    cudaEvent_t add_done[GGML_CUDA_CE_N_SLOTS] = {};                           // recv part no longer read

    uint16_t * send_part(int slot) const { return (uint16_t *) (vram + (size_t) slot * GGML_CUDA_CE_SLOT_BYTES); }
    uint16_t * recv_part(int slot) const {
        return (uint16_t *) (vram + (size_t) (GGML_CUDA_CE_N_SLOTS + slot) * GGML_CUDA_CE_SLOT_BYTES);
    }
    char * host_part(int slot) const { return host + (size_t) slot * GGML_CUDA_CE_SLOT_BYTES; }

    // Every event above, for creating and destroying them.
    template <typename F> void each_event(F && f) {
        for (int s = 0; s < GGML_CUDA_CE_N_SLOTS; ++s) {
            for (cudaEvent_t * ev : { &conv_ev[s][0], &conv_ev[s][1], &h2d_ev[s][0], &h2d_ev[s][1], &d2h_done[s], &add_done[s] }) {
                f(*ev);
            }
            for (cudaEvent_t & ev : d2h_ev[s]) {
                f(ev);
            }
        }
    }
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

    pyllama_so_allreduce_settings settings = {};
    bool   ce_enabled  = false; // large F32 reductions go to the copy engines
    size_t min_bytes   = PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT;
    bool   fail_alloc  = false; // the buffer allocation fails: only the test harness asks for it
    size_t chunk_bytes = 0;     // 0: automatic

    ggml_cuda_ce_state  state = GGML_CUDA_CE_STATE_UNALLOCATED;
    ggml_cuda_ce_device dev[2];
    int  next_slot      = 0; // slots alternate across reductions too
    bool capture_logged = false;

    size_t                  ll_max_bytes      = 0; // small F32 reductions go to the low-latency path; 0: off
    size_t                  ll_bf16_threshold = 1;
    ggml_cuda_ll_pipeline * ll                = nullptr; // allocated at the first such reduction
    bool                    ll_failed         = false;

    ggml_cuda_ce_counters counters;       // this comm context's reductions
    std::atomic<bool>     reduced{false}; // from the first reduction on, the settings stay
};

#if GGML_CUDA_CE_SUPPORTED

#include "allreduce-wire.cuh"

static constexpr size_t  GGML_CUDA_CE_CHUNK_SMALL      = 1024 * 1024;     // automatic chunk size below ...
static constexpr size_t  GGML_CUDA_CE_CHUNK_LARGE_FROM = 8 * 1024 * 1024; // ... this many BF16 bytes,
static constexpr size_t  GGML_CUDA_CE_CHUNK_LARGE      = 2 * 1024 * 1024; // and from there on
static constexpr int64_t GGML_CUDA_CE_SLOT_ELEMS       = (int64_t) (GGML_CUDA_CE_SLOT_BYTES / sizeof(uint16_t));
static constexpr size_t  GGML_CUDA_CE_VRAM_BYTES       = 2 * GGML_CUDA_CE_N_SLOTS * GGML_CUDA_CE_SLOT_BYTES; // send + recv: 16 MiB
static constexpr size_t  GGML_CUDA_CE_HOST_BYTES       = GGML_CUDA_CE_N_SLOTS * GGML_CUDA_CE_SLOT_BYTES;     // 8 MiB

static_assert(GGML_CUDA_CE_SLOT_BYTES % GGML_CUDA_CE_CHUNK_LARGE == 0, "a slot must hold whole chunks");

// Slot-sized rounds of a reduction of ne elements.
static int64_t ggml_cuda_ce_n_rounds(const int64_t ne) {
    return (ne + GGML_CUDA_CE_SLOT_ELEMS - 1) / GGML_CUDA_CE_SLOT_ELEMS;
}

// Bytes per copy for a reduction of `wire_bytes` (BF16). Receiving starts one chunk after sending,
// so small chunks shorten that lag; but each copy also costs the copy engines about 4-5 µs (the
// ceiling issued in chunks shows it without any synchronization) and four API calls per GPU. In the
// chunk-size sweeps on H200 (docs/benchmarks.md), 1 MiB chunks below 8 MiB and 2 MiB from 8 MiB were
// the fastest fixed size at each size, or within a few percent of it.
static size_t ggml_cuda_ce_chunk_bytes(const size_t fixed, const size_t wire_bytes) {
    if (fixed != 0) {
        return fixed;
    }
    return wire_bytes >= GGML_CUDA_CE_CHUNK_LARGE_FROM ? GGML_CUDA_CE_CHUNK_LARGE : GGML_CUDA_CE_CHUNK_SMALL;
}

// src == nullptr: inactive shard, contributes zeros.
static __global__ void ggml_cuda_ce_to_bf16_kernel(const float * __restrict__ src, uint16_t * __restrict__ dst, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = src != nullptr ? ggml_cuda_ce_f32_to_bf16(src[i]) : (uint16_t) 0;
    }
}

// dst = part0 + part1 in this order on both GPUs, so both results are bit-identical. Our part is
// rounded again from the tensor instead of read from the send part, so that the send part is free
// as soon as it is copied out. own == nullptr: inactive shard (zeros). own and dst may be the same
// tensor: each element is read before it is written, by the same thread.
static __global__ void ggml_cuda_ce_add_kernel(
        const float * own, const uint16_t * __restrict__ peer, float * dst, const bool own_first, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float a = ggml_cuda_ce_bf16_to_f32(own != nullptr ? ggml_cuda_ce_f32_to_bf16(own[i]) : (uint16_t) 0);
        const float b = ggml_cuda_ce_bf16_to_f32(peer[i]);
        dst[i] = own_first ? ggml_cuda_ce_add_rn(a, b) : ggml_cuda_ce_add_rn(b, a);
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
        for (cudaStream_t st : d.streams) {
            if (st) { CUDA_CHECK(cudaStreamSynchronize(st)); }
        }
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
        d.each_event([](cudaEvent_t & ev) {
            if (ev) { CUDA_CHECK(cudaEventDestroy(ev)); ev = nullptr; }
        });
        for (cudaStream_t & st : d.streams) {
            if (st) { CUDA_CHECK(cudaStreamDestroy(st)); st = nullptr; }
        }
        if (d.vram) { CUDA_CHECK(cudaFree(d.vram));     d.vram = nullptr; }
        if (d.host) { CUDA_CHECK(cudaFreeHost(d.host)); d.host = nullptr; }
        d.device = -1;
    }
}

// Out of memory at allocation must not abort: keep the first error.
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
        for (cudaStream_t & st : d.streams) {
            GGML_CUDA_CE_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        }
        d.each_event([&](cudaEvent_t & ev) { GGML_CUDA_CE_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); });
    }
    if (err != cudaSuccess) {
        (void) cudaGetLastError(); // clear the sticky error of the failed call
        ggml_cuda_ce_free_buffers(r);
        r->state = GGML_CUDA_CE_STATE_FAILED;
        g_ce_alloc_failures.fetch_add(1, std::memory_order_relaxed);
        GGML_LOG_WARN("%s: copy-engine AllReduce disabled for devices %d,%d: buffer allocation failed (%s%s); "
                      "large reductions go to %s\n", __func__, r->dev_ids[0], r->dev_ids[1], cudaGetErrorString(err),
                      r->fail_alloc ? ", failed on purpose by the test harness" : "",
                      r->paths.nccl ? "NCCL" : "the internal pipeline");
        return false;
    }
    r->state = GGML_CUDA_CE_STATE_READY;
    g_ce_buffer_allocs.fetch_add(1, std::memory_order_relaxed);
    GGML_LOG_INFO("%s: copy-engine AllReduce on devices %d,%d: %zu MiB VRAM + %zu MiB pinned host memory per GPU, "
                  "reductions from %zu bytes, chunks of %s\n", __func__,
                  r->dev_ids[0], r->dev_ids[1], GGML_CUDA_CE_VRAM_BYTES >> 20, GGML_CUDA_CE_HOST_BYTES >> 20,
                  r->min_bytes, r->chunk_bytes ? "the configured size" : "1 or 2 MiB by size");
    return true;
}

#undef GGML_CUDA_CE_TRY

// One reduction of ne elements; src[i] == nullptr: GPU i's shard is inactive. Per GPU i (p = peer),
// round k in slot s:
//   compute[i]: wait own d2h_done(s) (the send part was copied out); convert chunk 0 -> conv[0],
//               the rest -> conv[1]; then the sum of round k-2 (see below)
//   send[i]:    wait peer h2d[1](s) (the peer finished reading our host slot); per chunk: wait
//               conv[0] (chunk 0) or conv[1] (chunk 1), D2H -> d2h(c); then d2h_done
//   recv[i]:    wait own add_done(s) (the sum read the receive part); per chunk: wait peer d2h(c),
//               H2D; h2d[0] before the last chunk, h2d[1] after it
//   sum, on compute[i]: wait h2d[0], chunks 0..n-2; wait h2d[1], the last chunk -> add_done(s)
// The kernels run in two pieces so that the first copy waits for one chunk's conversion and the
// last sum covers one chunk; copies are per chunk so that receiving starts one chunk after sending.
// The sum of round k is put on the compute stream after the conversion of round k+2, so that the
// conversions do not queue behind the copies. Each wait is issued after the record it means, for
// both GPUs, and slots alternate across reductions, so consecutive reductions need no join: each GPU
// continues as soon as its own sum is done, and waits for the peer only where data crosses.
static void ggml_cuda_ce_issue(ggml_cuda_ce_router * r, cudaStream_t compute[2], const float * src[2],
                               float * dst[2], const int64_t ne) {
    const int64_t n_rounds    = ggml_cuda_ce_n_rounds(ne);
    const int64_t chunk_elems = (int64_t) (ggml_cuda_ce_chunk_bytes(r->chunk_bytes, (size_t) ne * sizeof(uint16_t)) / sizeof(uint16_t));
    const int     slot0       = r->next_slot;
    r->next_slot = (int) ((slot0 + n_rounds) % GGML_CUDA_CE_N_SLOTS);

    struct round_t { int s; int64_t off; int64_t m; int n; };
    auto round_of = [&](const int64_t k) {
        round_t rd;
        rd.s   = (int) ((slot0 + k) % GGML_CUDA_CE_N_SLOTS);
        rd.off = k * GGML_CUDA_CE_SLOT_ELEMS;
        rd.m   = std::min(GGML_CUDA_CE_SLOT_ELEMS, ne - rd.off);
        rd.n   = (int) ((rd.m + chunk_elems - 1) / chunk_elems);
        return rd;
    };
    // chunks [c0, c1) of a round: first element within the round, element count (<= 0: none)
    auto span = [&](const round_t & rd, const int c0, const int c1) {
        const int64_t e0 = c0 * chunk_elems;
        return std::make_pair(e0, (int) (std::min(c1 * chunk_elems, rd.m) - e0));
    };
    auto sum = [&](const int64_t k) {
        const round_t rd = round_of(k);
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_ce_device & d = r->dev[i];
            ggml_cuda_set_device(d.device);
            for (int piece = 0; piece < 2; ++piece) {
                const auto [e0, n] = piece == 0 ? span(rd, 0, rd.n - 1) : span(rd, rd.n - 1, rd.n);
                if (n <= 0) {
                    continue;
                }
                const int64_t at = rd.off + e0;
                CUDA_CHECK(cudaStreamWaitEvent(compute[i], d.h2d_ev[rd.s][piece], 0));
                ggml_cuda_ce_add_kernel<<<ggml_cuda_ce_grid(n), 256, 0, compute[i]>>>(
                    src[i] != nullptr ? src[i] + at : nullptr, d.recv_part(rd.s) + e0, dst[i] + at, i == 0, n);
                CUDA_CHECK(cudaGetLastError());
            }
            CUDA_CHECK(cudaEventRecord(d.add_done[rd.s], compute[i]));
        }
    };

    for (int64_t k = 0; k < n_rounds; ++k) {
        const round_t rd = round_of(k);
        const int s = rd.s;
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_ce_device & d = r->dev[i];
            ggml_cuda_set_device(d.device);
            CUDA_CHECK(cudaStreamWaitEvent(compute[i], d.d2h_done[s], 0));
            for (int piece = 0; piece < 2; ++piece) {
                const auto [e0, n] = piece == 0 ? span(rd, 0, 1) : span(rd, 1, rd.n);
                if (n > 0) {
                    ggml_cuda_ce_to_bf16_kernel<<<ggml_cuda_ce_grid(n), 256, 0, compute[i]>>>(
                        src[i] != nullptr ? src[i] + rd.off + e0 : nullptr, d.send_part(s) + e0, n);
                    CUDA_CHECK(cudaGetLastError());
                }
                CUDA_CHECK(cudaEventRecord(d.conv_ev[s][piece], compute[i]));
            }
        }
        if (k >= GGML_CUDA_CE_N_SLOTS) {
            sum(k - GGML_CUDA_CE_N_SLOTS);
        }
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_ce_device & d  = r->dev[i];
            ggml_cuda_ce_device & dp = r->dev[1 - i];
            cudaStream_t st = d.streams[GGML_CUDA_CE_SEND];
            ggml_cuda_set_device(d.device);
            CUDA_CHECK(cudaStreamWaitEvent(st, dp.h2d_ev[s][1], 0));
            for (int c = 0; c < rd.n; ++c) {
                if (c <= 1) {
                    CUDA_CHECK(cudaStreamWaitEvent(st, d.conv_ev[s][c], 0));
                }
                const auto [e0, n] = span(rd, c, c + 1);
                CUDA_CHECK(cudaMemcpyAsync(d.host_part(s) + e0 * sizeof(uint16_t), d.send_part(s) + e0,
                                           (size_t) n * sizeof(uint16_t), cudaMemcpyDeviceToHost, st));
                CUDA_CHECK(cudaEventRecord(d.d2h_ev[s][c], st));
            }
            CUDA_CHECK(cudaEventRecord(d.d2h_done[s], st));
        }
        for (int i = 0; i < 2; ++i) {
            ggml_cuda_ce_device & d  = r->dev[i];
            ggml_cuda_ce_device & dp = r->dev[1 - i];
            cudaStream_t st = d.streams[GGML_CUDA_CE_RECV];
            ggml_cuda_set_device(d.device);
            CUDA_CHECK(cudaStreamWaitEvent(st, d.add_done[s], 0));
            for (int c = 0; c < rd.n; ++c) {
                if (c == rd.n - 1) {
                    CUDA_CHECK(cudaEventRecord(d.h2d_ev[s][0], st)); // chunks 0..n-2 are in
                }
                const auto [e0, n] = span(rd, c, c + 1);
                CUDA_CHECK(cudaStreamWaitEvent(st, dp.d2h_ev[s][c], 0));
                CUDA_CHECK(cudaMemcpyAsync(d.recv_part(s) + e0, dp.host_part(s) + e0 * sizeof(uint16_t),
                                           (size_t) n * sizeof(uint16_t), cudaMemcpyHostToDevice, st));
            }
            CUDA_CHECK(cudaEventRecord(d.h2d_ev[s][1], st));
        }
    }
    for (int64_t k = std::max<int64_t>(0, n_rounds - GGML_CUDA_CE_N_SLOTS); k < n_rounds; ++k) {
        sum(k);
    }
}

// The backends' compute streams; false while one of them is capturing a CUDA graph. Events recorded before
// a capture cannot be waited on inside it, and a captured reduction would replay with a stale token; the meta
// backend reduces between captured subgraphs, so this is a guard, not a path.
static bool ggml_cuda_ce_compute_streams(ggml_cuda_ce_router * r, cudaStream_t compute[2]) {
    for (int i = 0; i < 2; ++i) {
        auto * cuda_ctx = static_cast<ggml_backend_cuda_context *>(r->backends[i]->context);
        GGML_ASSERT(cuda_ctx->device == r->dev_ids[i]);
        compute[i] = cuda_ctx->stream();
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
    return true;
}

static bool ggml_cuda_ce_allreduce(ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    cudaStream_t compute[2];
    if (!ggml_cuda_ce_compute_streams(r, compute)) {
        return false;
    }

    if (r->state == GGML_CUDA_CE_STATE_UNALLOCATED) {
        ggml_cuda_ce_alloc_buffers(r);
    }
    if (r->state != GGML_CUDA_CE_STATE_READY) {
        return false;
    }

    const int64_t ne = ggml_nelements(tensors[0]);
    const float * src[2];
    float *       dst[2];
    for (int i = 0; i < 2; ++i) {
        // inactive shard / empty slice: contributes zeros, as on the NCCL and internal paths
        dst[i] = static_cast<float *>(tensors[i]->data);
        src[i] = (tensors[i]->flags & GGML_TENSOR_FLAG_COMPUTE) != 0 ? dst[i] : nullptr;
    }
    ggml_cuda_ce_issue(r, compute, src, dst, ne);
    const uint64_t rounds = (uint64_t) ggml_cuda_ce_n_rounds(ne);
    g_ce_counters.rounds.fetch_add(rounds, std::memory_order_relaxed);
    r->counters.rounds.fetch_add(rounds, std::memory_order_relaxed);
    return true;
}

// Small F32 reductions: the low-latency path, its buffers allocated at the first one.
static bool ggml_cuda_ll_try(ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    cudaStream_t compute[2];
    if (r->ll_failed || !ggml_cuda_ce_compute_streams(r, compute)) {
        return false;
    }
    if (r->ll == nullptr) {
        r->ll = ggml_cuda_ll_init(r->dev_ids, r->ll_max_bytes);
        if (r->ll == nullptr) {
            r->ll_failed = true;
            return false;
        }
    }
    float * data[2];
    bool    active[2];
    for (int i = 0; i < 2; ++i) {
        data[i]   = static_cast<float *>(tensors[i]->data);
        active[i] = (tensors[i]->flags & GGML_TENSOR_FLAG_COMPUTE) != 0;
    }
    const size_t nbytes = ggml_nbytes(tensors[0]);
    const bool   bf16   = r->ll_bf16_threshold > 0 && nbytes >= r->ll_bf16_threshold;
    return ggml_cuda_ll_allreduce(r->ll, compute, data, active, ggml_nelements(tensors[0]), bf16);
}

// Teardown: the kernels still queued read and write the pinned lines.
static void ggml_cuda_ll_release(ggml_cuda_ce_router * r) {
    if (r->ll == nullptr) {
        return;
    }
    for (int i = 0; i < 2; ++i) {
        auto * cuda_ctx = static_cast<ggml_backend_cuda_context *>(r->backends[i]->context);
        ggml_cuda_set_device(r->dev_ids[i]);
        CUDA_CHECK(cudaStreamSynchronize(cuda_ctx->stream()));
    }
    ggml_cuda_ll_free(r->ll);
    r->ll = nullptr;
}

#else // !GGML_CUDA_CE_SUPPORTED

static void ggml_cuda_ce_free_buffers(ggml_cuda_ce_router *) {
}

static bool ggml_cuda_ce_allreduce(ggml_cuda_ce_router *, ggml_tensor **) {
    return false;
}

static bool ggml_cuda_ll_try(ggml_cuda_ce_router *, ggml_tensor **) {
    return false;
}

static void ggml_cuda_ll_release(ggml_cuda_ce_router *) {
}

#endif // GGML_CUDA_CE_SUPPORTED

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

// Why the copy engines stay off for these settings, or nullptr when they take the large reductions.
static const char * ggml_cuda_ce_off_reason(const ggml_cuda_ce_router * r) {
    if (!GGML_CUDA_CE_SUPPORTED) {
        return "unsupported on this platform";
    }
    if (r->n_backends != 2) {
        return "needs exactly two devices";
    }
    if (r->paths.none) {
        return "GGML_CUDA_ALLREDUCE selects no backend AllReduce";
    }
    if (r->settings.copy_engines == 0) {
        return "set off";
    }
    if (r->settings.copy_engines != 1 && ggml_cuda_ce_peer_access(r->dev_ids[0], r->dev_ids[1])) {
        return "peer access available (forcing the copy engines overrides it)";
    }
    return nullptr;
}

// Takes the settings (before the first reduction): thresholds, and whether the copy engines are on.
static void ggml_cuda_ce_router_apply(ggml_cuda_ce_router * r, const pyllama_so_allreduce_settings & settings) {
    r->settings     = settings;
    r->min_bytes    = (size_t) settings.min_bytes;
    r->chunk_bytes  = (size_t) settings.chunk_bytes;
    r->ll_max_bytes = (size_t) settings.ll_max_bytes;

    const char * why = ggml_cuda_ce_off_reason(r);
    r->ce_enabled = why == nullptr;
    if (why != nullptr) {
        GGML_LOG_DEBUG("%s: copy-engine AllReduce off: %s\n", __func__, why);
        return;
    }
    // The internal pipeline takes the reductions below the threshold; bring it up if the init
    // chain chose NCCL. It needs Volta or newer; without it small reductions go to NCCL.
    if (r->paths.ar_pipeline != nullptr && *r->paths.ar_pipeline == nullptr) {
        *r->paths.ar_pipeline = ggml_cuda_ar_pipeline_init(r->dev_ids, r->n_backends);
        if (*r->paths.ar_pipeline == nullptr) {
            (void) cudaGetLastError();
        }
    }
    GGML_LOG_DEBUG("%s: copy-engine AllReduce on for devices %d,%d from %zu bytes%s, low-latency path up to %zu bytes\n",
                   __func__, r->dev_ids[0], r->dev_ids[1], r->min_bytes, settings.copy_engines == 1 ? " (forced)" : "",
                   r->ll_max_bytes);
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
    r->fail_alloc        = pyllama_so_test_hook(PYLLAMA_SO_TEST_HOOK_CUDA_AR_CE_FAIL_ALLOC) != 0;
    r->ll_bf16_threshold = ggml_cuda_ll_env_bf16_threshold();

    pyllama_so_allreduce_settings settings;
    GGML_ASSERT(pyllama_so_allreduce_resolve(nullptr, &settings) == PYLLAMA_SO_AR_OK);
    ggml_cuda_ce_router_apply(r, settings); // the defaults, until the comm context is configured
    return r;
}

void ggml_cuda_ce_router_free(ggml_cuda_ce_router * r) {
    if (r == nullptr) {
        return;
    }
    ggml_cuda_ll_release(r);
    ggml_cuda_ce_free_buffers(r);
    delete r;
}

// F32, same shape, contiguous, on both devices: what the copy engines take.
static bool ggml_cuda_ce_eligible(const ggml_cuda_ce_router * r, ggml_tensor ** tensors) {
    if (tensors[0] == nullptr || tensors[1] == nullptr) {
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
        case PYLLAMA_SO_AR_PATH_LL:
            return ggml_cuda_ll_try(r, tensors);
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
    r->reduced.store(true);

    int order[4];
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
            if (nbytes <= r->ll_max_bytes) {
                order[n_order++] = PYLLAMA_SO_AR_PATH_LL;
            }
            order[n_order++] = PYLLAMA_SO_AR_PATH_INTERNAL;
            order[n_order++] = PYLLAMA_SO_AR_PATH_NCCL;
        }
    } else {
        order[n_order++] = PYLLAMA_SO_AR_PATH_NCCL;
        order[n_order++] = PYLLAMA_SO_AR_PATH_INTERNAL;
    }

    for (int k = 0; k < n_order; ++k) {
        if (ggml_cuda_ce_try(r, order[k], tensors)) {
            g_ce_counters.count(order[k], nbytes);
            r->counters.count(order[k], nbytes);
            return true;
        }
    }
    g_ce_counters.count(PYLLAMA_SO_AR_PATH_FALLBACK, nbytes);
    r->counters.count(PYLLAMA_SO_AR_PATH_FALLBACK, nbytes);
    return false;
}

// The per-context entry points (pyllama-so-allreduce.h): comm_ctx is a comm context of this backend.
static int ggml_cuda_ce_comm_configure(void * comm_ctx, const pyllama_so_allreduce_params * params) {
    ggml_cuda_ce_router * r = ggml_cuda_comm_ce_router(comm_ctx);
    pyllama_so_allreduce_settings settings;
    if (r == nullptr || pyllama_so_allreduce_resolve(params, &settings) != PYLLAMA_SO_AR_OK) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    if (r->reduced.load()) {
        return PYLLAMA_SO_AR_EBUSY;
    }
    ggml_cuda_ce_router_apply(r, settings);
    return PYLLAMA_SO_AR_OK;
}

static int ggml_cuda_ce_comm_report(void * comm_ctx, pyllama_so_allreduce_report * out) {
    const ggml_cuda_ce_router * r = ggml_cuda_comm_ce_router(comm_ctx);
    if (r == nullptr || out == nullptr || out->size != sizeof(pyllama_so_allreduce_report)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    out->settings   = r->settings;
    out->ce_enabled = r->ce_enabled;
    r->counters.read(out->calls, out->bytes, &out->ce_rounds);
    return PYLLAMA_SO_AR_OK;
}

void * ggml_cuda_ce_proc_address(const char * name) {
    if (strcmp(name, PYLLAMA_SO_AR_STATS_NAME) == 0) {
        return (void *) ggml_cuda_ce_stats_get;
    }
    if (strcmp(name, PYLLAMA_SO_AR_STATS_RESET_NAME) == 0) {
        return (void *) ggml_cuda_ce_stats_reset;
    }
    if (strcmp(name, PYLLAMA_SO_AR_COMM_CONFIGURE_NAME) == 0) {
        return (void *) ggml_cuda_ce_comm_configure;
    }
    if (strcmp(name, PYLLAMA_SO_AR_COMM_REPORT_NAME) == 0) {
        return (void *) ggml_cuda_ce_comm_report;
    }
    return nullptr;
}
