#pragma once

// Split overlap (llama_context_params.split_overlap): under LLAMA_SPLIT_MODE_TENSOR, consecutive ubatches
// alternate between two lanes, each with its own scheduler and Meta backend (streams, AllReduce context,
// compute buffers), sharing the weights and the KV / recurrent state. One lane's AllReduces then run while
// the other lane computes; the ordering between the lanes follows the state tensors
// (ggml-backend-meta-lanes.h), so the output is bitwise that of one lane.
// The ubatches of one llama_decode call alternate whatever their sizes (a server's step of generated
// tokens and a prompt piece runs on both lanes). A call's first ubatch runs on lane 0 when it has fewer than
// LLAMA_SPLIT_OVERLAP_MIN_TOKENS tokens (decoding), else on next_lane, which carries the alternation over
// from the calls before. Encoding, and every ubatch with backend samplers, run on lane 0.
// A llama_decode call of one sequence with more than n_ubatch tokens is cut into an even number of equal
// ubatches (at most n_ubatch, a multiple of LLAMA_SPLIT_OVERLAP_UBATCH_ALIGN but for the last), so that
// both lanes get the same work: the output is then bitwise that of no lanes at that ubatch size.
// LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES=0 in the environment keeps llama.cpp's cut (n_ubatch, then the rest).

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLAMA_SPLIT_OVERLAP_MIN_TOKENS   64
#define LLAMA_SPLIT_OVERLAP_UBATCH_ALIGN 32

// why the lanes are off
enum llama_split_overlap_reason {
    LLAMA_SPLIT_OVERLAP_ON = 0,
    LLAMA_SPLIT_OVERLAP_NOT_REQUESTED,   // split_overlap is false
    LLAMA_SPLIT_OVERLAP_NOT_TENSOR,      // split_mode is not LLAMA_SPLIT_MODE_TENSOR
    LLAMA_SPLIT_OVERLAP_PARTIAL_OFFLOAD, // not every layer is on the split devices
    LLAMA_SPLIT_OVERLAP_KV_NOT_OFFLOADED,// offload_kqv is false: the KV cache is not on the split devices
    LLAMA_SPLIT_OVERLAP_TENSOR_OVERRIDES,// tensor overrides (e.g. experts) place weights elsewhere
    LLAMA_SPLIT_OVERLAP_CONTEXT_TYPE,    // not a default context (e.g. an MTP draft context)
    LLAMA_SPLIT_OVERLAP_NO_ALLOC,        // a dry run without allocations
    LLAMA_SPLIT_OVERLAP_NO_EVENTS,       // a device has no events (or the lanes could not be linked)
    LLAMA_SPLIT_OVERLAP_TRAINING,        // the context was set up for training
};

struct llama_split_overlap_stats {
    size_t   size;            // set to sizeof(struct llama_split_overlap_stats) by the caller
    int32_t  enabled;         // 1 when the two lanes exist
    int32_t  reason;          // enum llama_split_overlap_reason
    int32_t  next_lane;       // the lane of a llama_decode call's first ubatch of >= LLAMA_SPLIT_OVERLAP_MIN_TOKENS tokens
    uint64_t ubatches[2];     // ubatches run on each lane
    uint64_t graph_builds[2]; // graphs each lane's Meta backend (re)built (a reused graph is not rebuilt)
    uint64_t waits[2];        // event waits each lane issued on the other lane (all devices)
    uint64_t records[2];      // events each lane recorded after a subgraph with state (all devices)
};

// false if size is wrong
LLAMA_API bool llama_split_overlap_get_stats(const struct llama_context * ctx, struct llama_split_overlap_stats * stats);

LLAMA_API const char * llama_split_overlap_reason_str(int32_t reason);

// the Meta backend of a lane (0 or 1), NULL when that lane does not exist; for diagnostics and tests
LLAMA_API ggml_backend_t llama_split_overlap_backend(const struct llama_context * ctx, int32_t lane);

#ifdef __cplusplus
}
#endif
