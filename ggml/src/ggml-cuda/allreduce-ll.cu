// pyllama_so: low-latency AllReduce for the small reductions of decoding, two GPUs without peer access.
//
// A decode token under tensor split reduces a few KiB twice per layer, and each reduction's latency is on
// the critical path of both GPUs. Upstream's internal pipeline (allreduce.cu) stores the data to pinned
// host memory, fences (a round trip over PCIe), raises a flag, fences again, polls the peer's flag (another
// round trip per poll) and only then reads the peer's data (one more). Here every 8 bytes in host memory
// carry their own flag: a 32-bit data word and the reduction's token, written by one 16-byte store (two
// such halves). The reader polls the data itself until both halves hold the token, so a reduction costs
// one write and the polling reads, with no fence and no separate flag. The same scheme as NCCL's LL
// protocol; it relies on 8-byte stores reaching host memory whole, as that does.
//
// Each GPU writes into its own buffer and reads its peer's. Two slots alternate; a slot is rewritten two
// reductions later, which needs no host wait: a GPU's reduction N+2 starts after its N+1, which has read
// the peer's N+1, which the peer wrote only after its own N, the last reader of the slot, had ended.
// Tokens are the reduction count + 1 (mod 2^32), so a slot's stale lines always hold another token.

#include "allreduce-ll.cuh"

#include "ggml-impl.h"

#include <algorithm>
#include <climits>
#include <cstring>

#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)

#include "allreduce-wire.cuh"

static constexpr int GGML_CUDA_LL_N_SLOTS    = 2;
static constexpr int GGML_CUDA_LL_BLOCK      = 256;
// Few enough blocks that both GPUs' kernels are resident together also on one GPU shown as two devices
// (the blocks spin until the peer's lines arrive); threads loop over the lines beyond that.
static constexpr int GGML_CUDA_LL_MAX_BLOCKS = 32;

struct ggml_cuda_ll_pipeline {
    int      dev_ids[2]  = {-1, -1};
    size_t   max_bytes   = 0;       // F32 bytes per device and reduction
    size_t   slot_bytes  = 0;       // line bytes per slot: 16 per 2 F32 elements (F32 on the wire, the larger)
    char *   host[2]     = {};      // pinned, mapped, portable; [slot] lines written by GPU i, read by its peer
    char *   dev_ptr[2]  = {};      // the same memory as the GPUs address it
    uint64_t n_calls     = 0;
};

static __device__ __forceinline__ void ggml_cuda_ll_store(uint4 * p, const uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

static __device__ __forceinline__ uint4 ggml_cuda_ll_load(const uint4 * p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// Our part of element e as the sum uses it: rounded to the wire type; zeros for an inactive device.
template <bool bf16_wire>
static __device__ __forceinline__ float ggml_cuda_ll_own(const float * data, const bool active, const int e) {
    if (!active) {
        return 0.0f;
    }
    return bf16_wire ? ggml_cuda_ce_bf16_to_f32(ggml_cuda_ce_f32_to_bf16(data[e])) : data[e];
}

// One 32-bit data word: two BF16 values (low half first) or one F32.
template <bool bf16_wire>
static __device__ __forceinline__ uint32_t ggml_cuda_ll_pack(const float * data, const bool active, const int e0, const int ne) {
    if (!active) {
        return 0;
    }
    if (!bf16_wire) {
        return e0 < ne ? __float_as_uint(data[e0]) : 0u;
    }
    const uint32_t lo = e0     < ne ? ggml_cuda_ce_f32_to_bf16(data[e0])     : 0u;
    const uint32_t hi = e0 + 1 < ne ? ggml_cuda_ce_f32_to_bf16(data[e0 + 1]) : 0u;
    return lo | (hi << 16);
}

template <bool bf16_wire>
static __device__ __forceinline__ float ggml_cuda_ll_unpack(const uint32_t w, const int j) {
    return bf16_wire ? ggml_cuda_ce_bf16_to_f32((uint16_t) (j == 0 ? w : w >> 16)) : __uint_as_float(w);
}

// Both GPUs run this at once. A thread writes its lines, then waits for the peer's same lines and sums;
// only that thread touches its elements, so the tensor is read before it is overwritten in place.
template <bool bf16_wire>
static __global__ void ggml_cuda_ll_kernel(float * data, const bool active, const bool own_first,
                                           uint4 * mine, const uint4 * other, const int ne, const uint32_t token) {
    constexpr int per_word = bf16_wire ? 2 : 1;
    constexpr int per_line = 2 * per_word;
    const int n_lines = (ne + per_line - 1) / per_line;
    const int stride  = gridDim.x * blockDim.x;
    const int first   = blockIdx.x * blockDim.x + threadIdx.x;

    for (int l = first; l < n_lines; l += stride) {
        const int e = l * per_line;
        ggml_cuda_ll_store(&mine[l], make_uint4(ggml_cuda_ll_pack<bf16_wire>(data, active, e, ne), token,
                                                ggml_cuda_ll_pack<bf16_wire>(data, active, e + per_word, ne), token));
    }
    for (int l = first; l < n_lines; l += stride) {
        uint4 v;
        do {
            v = ggml_cuda_ll_load(&other[l]);
        } while (v.y != token || v.w != token);
        const uint32_t words[2] = { v.x, v.z };
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int j = 0; j < per_word; ++j) {
                const int e = l * per_line + h * per_word + j;
                if (e < ne) {
                    const float a = ggml_cuda_ll_own<bf16_wire>(data, active, e);
                    const float b = ggml_cuda_ll_unpack<bf16_wire>(words[h], j);
                    data[e] = own_first ? ggml_cuda_ce_add_rn(a, b) : ggml_cuda_ce_add_rn(b, a);
                }
            }
        }
    }
}

void ggml_cuda_ll_free(ggml_cuda_ll_pipeline * ll) {
    if (ll == nullptr) {
        return;
    }
    for (char * h : ll->host) {
        if (h != nullptr) {
            CUDA_CHECK(cudaFreeHost(h));
        }
    }
    delete ll;
}

ggml_cuda_ll_pipeline * ggml_cuda_ll_init(const int dev_ids[2], const size_t max_bytes) {
    auto * ll = new ggml_cuda_ll_pipeline;
    ll->dev_ids[0] = dev_ids[0];
    ll->dev_ids[1] = dev_ids[1];
    ll->max_bytes  = max_bytes;
    ll->slot_bytes = (max_bytes / sizeof(float) + 1) / 2 * sizeof(uint4);
    cudaError_t err = cudaSuccess;
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) {
        ggml_cuda_set_device(dev_ids[i]);
        const size_t bytes = GGML_CUDA_LL_N_SLOTS * ll->slot_bytes;
        // portable and mapped: GPU i writes it, its peer reads it
        err = cudaHostAlloc((void **) &ll->host[i], bytes, cudaHostAllocPortable | cudaHostAllocMapped);
        if (err == cudaSuccess) {
            memset(ll->host[i], 0, bytes); // token 0 is never used: no line looks written before it is
            err = cudaHostGetDevicePointer((void **) &ll->dev_ptr[i], ll->host[i], 0);
        }
    }
    if (err != cudaSuccess) {
        (void) cudaGetLastError();
        GGML_LOG_WARN("%s: low-latency AllReduce disabled for devices %d,%d: %s\n", __func__,
                      dev_ids[0], dev_ids[1], cudaGetErrorString(err));
        ggml_cuda_ll_free(ll);
        return nullptr;
    }
    return ll;
}

bool ggml_cuda_ll_allreduce(ggml_cuda_ll_pipeline * ll, cudaStream_t compute[2], float * data[2],
                            const bool active[2], const int64_t ne, const bool bf16_wire) {
    if (ne <= 0 || (size_t) ne * sizeof(float) > ll->max_bytes || ne > INT_MAX - 4) {
        return false;
    }
    const int      slot    = (int) (ll->n_calls % GGML_CUDA_LL_N_SLOTS);
    const uint32_t token   = (uint32_t) (ll->n_calls + 1);
    const int      n_lines = (int) ((ne + (bf16_wire ? 3 : 1)) / (bf16_wire ? 4 : 2));
    const int      blocks  = std::min(GGML_CUDA_LL_MAX_BLOCKS, (n_lines + GGML_CUDA_LL_BLOCK - 1) / GGML_CUDA_LL_BLOCK);
    ll->n_calls++;
    for (int i = 0; i < 2; ++i) {
        uint4       * mine  = (uint4 *)       (ll->dev_ptr[i]     + (size_t) slot * ll->slot_bytes);
        const uint4 * other = (const uint4 *) (ll->dev_ptr[1 - i] + (size_t) slot * ll->slot_bytes);
        ggml_cuda_set_device(ll->dev_ids[i]);
        if (bf16_wire) {
            ggml_cuda_ll_kernel<true><<<blocks, GGML_CUDA_LL_BLOCK, 0, compute[i]>>>(
                data[i], active[i], i == 0, mine, other, (int) ne, token);
        } else {
            ggml_cuda_ll_kernel<false><<<blocks, GGML_CUDA_LL_BLOCK, 0, compute[i]>>>(
                data[i], active[i], i == 0, mine, other, (int) ne, token);
        }
        CUDA_CHECK(cudaGetLastError());
    }
    return true;
}

#else // HIP, MUSA: not available, the router uses the other paths

ggml_cuda_ll_pipeline * ggml_cuda_ll_init(const int *, size_t) {
    return nullptr;
}

void ggml_cuda_ll_free(ggml_cuda_ll_pipeline *) {
}

bool ggml_cuda_ll_allreduce(ggml_cuda_ll_pipeline *, cudaStream_t *, float **, const bool *, int64_t, bool) {
    return false;
}

#endif // !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)
