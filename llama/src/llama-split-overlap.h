#pragma once

// Split overlap on the llama side: the second lane of a llama_context and the hooks that
// patches/0005-* adds to upstream's llama-context.cpp. Public API: llama/include/pyllama-so-split-overlap.h.
//
// Each lane issues its graphs on its own thread (ggml-backend-meta-lanes.h): activate() waits for that
// thread before the lane's graph result is touched again, and decode() waits for both before it returns.
//
// The active lane lives in llama_context's own members (sched, the Meta entry of backends and
// backend_ptrs, gf_res_prev, gf_res_prev_active); the inactive one is kept here and swapped in when the
// active lane changes, so that every upstream code path runs unchanged on the active lane.

#include "pyllama-so-split-overlap.h"

#include "llama-context.h"
#include "llama-graph.h"

#include "ggml-cpp.h"

#include <array>
#include <cstdint>

struct llama_ubatch;

struct llama_split_overlap {
    struct lane {
        ggml_backend_ptr                    meta;  // declared before sched: freed after it
        ggml_backend_sched_ptr              sched;
        std::array<llm_graph_result_ptr, 2> gf_res_prev;
        llm_graph_result *                  gf_res_prev_active = nullptr;
    };

    bool    enabled   = false;
    int32_t reason    = LLAMA_SPLIT_OVERLAP_NOT_REQUESTED;
    int     active    = 0;     // the lane in llama_context's members
    int     next      = 0;     // the lane of a large ubatch that starts a llama_decode call
    int     prev      = 0;     // the lane of the previous ubatch of the current llama_decode call
    bool    call_large = false; // the current llama_decode call has had a large ubatch
    size_t  i_meta    = 0;     // index of the Meta backend in backends / backend_ptrs
    bool    reserving = false; // inside after_reserve
    bool    equal_ubatches = true; // ubatch_size() evens out a call's ubatches (LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES)
    lane    stash;             // the inactive lane
    ggml_backend_t metas[2] = { nullptr, nullptr };
    uint64_t ubatches[2] = { 0, 0 };

    // constructor hook: creates ctx.split_overlap when params.split_overlap is set (lanes on or off)
    static void init(llama_context & ctx, const llama_context_params & params);

    void activate(llama_context & ctx, int lane);                     // make `lane` the active one
    // the ubatch size of a llama_decode call: n_ubatch, or for a batch of one sequence that takes several
    // ubatches, an even number of equal ones (at most n_ubatch), so that both lanes get the same work
    uint32_t ubatch_size(const llama_context & ctx, const llama_batch & batch) const;
    // pick the lane of a decode ubatch; first: the first ubatch of its llama_decode call
    void select(llama_context & ctx, const llama_ubatch & ubatch, bool first);
    void after_reserve(llama_context & ctx);                          // reserve the inactive lane too
    void wait_issued() const;                                         // both lanes' threads have issued all
    void synchronize();                                               // the inactive lane's scheduler
    void reset_graphs();                                              // no reuse of the inactive lane's graphs
    void add_compute_buffers(const llama_context & ctx, llama_memory_breakdown & out) const; // the inactive lane's
    void disable(llama_context & ctx, int32_t why);                   // back to one lane

    static bool           get_stats(const llama_context & ctx, llama_split_overlap_stats * stats);
    static ggml_backend_t backend  (const llama_context & ctx, int32_t lane);
};
