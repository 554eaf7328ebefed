#pragma once

// pyllama_so: copy-engine AllReduce for two GPUs without peer access, and the router that the
// CUDA comm context (ggml-cuda.cu) hands every reduction to. See docs/multi-gpu.md.

#include "common.cuh"
#include "allreduce.cuh"
#include "ggml-backend-impl.h"
#include "pyllama-so-allreduce.h"

#include <cstddef>

// The copy-engine path is CUDA only; HIP and MUSA builds get stubs that decline every reduction.
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)
#define GGML_CUDA_CE_SUPPORTED 1
#else
#define GGML_CUDA_CE_SUPPORTED 0
#endif

struct ggml_backend_cuda_comm_context; // ggml-cuda.cu

// One reduction path of the comm context (upstream's NCCL or internal-pipeline function); returns
// false when it does not take the call.
typedef bool (*ggml_cuda_ce_path_fn)(ggml_backend_cuda_comm_context * comm_ctx, struct ggml_tensor ** tensors);

// What the comm context brought up, as its init chain left it.
struct ggml_cuda_ce_paths {
    ggml_backend_cuda_comm_context * comm_ctx    = nullptr;
    ggml_cuda_ce_path_fn             nccl        = nullptr; // set only when NCCL is compiled in and initialised
    ggml_cuda_ce_path_fn             internal    = nullptr; // usable while *ar_pipeline != nullptr
    ggml_cuda_ar_pipeline **         ar_pipeline = nullptr; // the comm context's slot; the router may fill it
    bool                             none        = false;   // GGML_CUDA_ALLREDUCE=none (or unknown): no backend reduction
};

struct ggml_cuda_ce_router;

// With the default settings (pyllama_so_allreduce_resolve: the environment variables, else the built-in values),
// until the comm context is configured (PYLLAMA_SO_AR_COMM_CONFIGURE_NAME); asks the test hook
// PYLLAMA_SO_TEST_HOOK_CUDA_AR_CE_FAIL_ALLOC. Never fails; allocates no transfer buffers (that happens at the
// first large reduction).
ggml_cuda_ce_router * ggml_cuda_ce_router_init(
    ggml_backend_t * backends, const int * dev_ids, size_t n_backends, const ggml_cuda_ce_paths & paths);

void ggml_cuda_ce_router_free(ggml_cuda_ce_router * router);

// Routes one reduction and counts it; false: declined, the meta backend's generic reduction runs.
bool ggml_cuda_ce_router_allreduce(ggml_cuda_ce_router * router, struct ggml_tensor ** tensors);

// Names for the CUDA backend reg's get_proc_address (see pyllama-so-allreduce.h); nullptr if unknown.
void * ggml_cuda_ce_proc_address(const char * name);

// The router of a comm context made by ggml-cuda.cu (nullptr for nullptr), for the per-context entry points.
ggml_cuda_ce_router * ggml_cuda_comm_ce_router(void * comm_ctx);
