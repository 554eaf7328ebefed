#pragma once

// The AllReduce settings of one llama_context under LLAMA_SPLIT_MODE_TENSOR, and what its reductions took. A
// context's Meta backend (one per split-overlap lane) has a comm context, made by its devices' backend when the
// context is created (ggml-backend-meta-comm.h); llama_allreduce_configure gives every one of them the same
// settings, so that two contexts of one process can differ, and the report reads them back with their counters.
// The environment variables (GGML_CUDA_AR_*) stay the defaults of every setting left unset.

#include "llama.h"
#include "pyllama-so-allreduce.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Settings for every comm context of ctx, before its first decode. PYLLAMA_SO_AR_OK also when ctx has no comm
// context that takes settings (then the report counts none); PYLLAMA_SO_AR_EINVAL for params out of range;
// PYLLAMA_SO_AR_EBUSY once a comm context of ctx has reduced (its settings stay).
LLAMA_API int32_t llama_allreduce_configure(struct llama_context * ctx, const struct pyllama_so_allreduce_params * params);

// The settings of ctx's first comm context and the counters of all of them summed, into *out (out->size set by the
// caller). Returns the number of comm contexts that reported (0: none, *out zeroed; 2 with split-overlap lanes), or
// PYLLAMA_SO_AR_EINVAL.
LLAMA_API int32_t llama_allreduce_get_report(const struct llama_context * ctx, struct pyllama_so_allreduce_report * out);

#ifdef __cplusplus
}
#endif
