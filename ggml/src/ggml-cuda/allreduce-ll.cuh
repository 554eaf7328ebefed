#pragma once

// pyllama_so: low-latency AllReduce for the small reductions of decoding, two GPUs without peer access.
// The router (allreduce-ce.cu) hands it F32 reductions up to GGML_CUDA_AR_LL_MAX_BYTES. See docs/multi-gpu.md.

#include "common.cuh"

#include <cstddef>
#include <cstdint>

struct ggml_cuda_ll_pipeline;

// Pinned host buffers for reductions of up to max_bytes of F32 on devices dev_ids[0..1]; nullptr when an
// allocation fails (the caller then uses another path). No CUDA error is left behind.
ggml_cuda_ll_pipeline * ggml_cuda_ll_init(const int dev_ids[2], size_t max_bytes);

void ggml_cuda_ll_free(ggml_cuda_ll_pipeline * ll);

// In-place sum of data[0] (device dev_ids[0]) and data[1] (device dev_ids[1]), ne F32 elements each, one
// kernel per device on its compute stream; active[i] == false: device i contributes zeros. With bf16_wire
// each part is rounded to BF16 before the sum, as on the other paths. The result is bit-identical on both
// devices. Returns false (nothing issued) when ne is out of range.
bool ggml_cuda_ll_allreduce(ggml_cuda_ll_pipeline * ll, cudaStream_t compute[2], float * data[2],
                            const bool active[2], int64_t ne, bool bf16_wire);
