#pragma once

// pyllama_so: the arithmetic both of our AllReduce paths (allreduce-ce.cu, allreduce-ll.cu) share, so that
// they give the same bits: each part rounded F32 -> BF16 (nearest even), summed in F32 as part0 + part1.

#include <cstdint>

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
