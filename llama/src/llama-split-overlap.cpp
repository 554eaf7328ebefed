// Split overlap, llama side: see llama-split-overlap.h and llama/include/pyllama-so-split-overlap.h.

#include "llama-split-overlap.h"

#include "llama-batch.h"
#include "llama-impl.h"
#include "llama-model.h"

#include "ggml-backend-meta-lanes.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

static const char * reason_text(int32_t reason) {
    switch (reason) {
        case LLAMA_SPLIT_OVERLAP_ON:               return "on";
        case LLAMA_SPLIT_OVERLAP_NOT_REQUESTED:    return "not requested";
        case LLAMA_SPLIT_OVERLAP_NOT_TENSOR:       return "split_mode is not tensor";
        case LLAMA_SPLIT_OVERLAP_PARTIAL_OFFLOAD:  return "not every layer is on the split devices (n_gpu_layers)";
        case LLAMA_SPLIT_OVERLAP_KV_NOT_OFFLOADED: return "the KV cache is not on the split devices (offload_kqv is off)";
        case LLAMA_SPLIT_OVERLAP_TENSOR_OVERRIDES: return "tensor overrides place weights off the split devices";
        case LLAMA_SPLIT_OVERLAP_CONTEXT_TYPE:     return "not a default context (e.g. a draft context)";
        case LLAMA_SPLIT_OVERLAP_NO_ALLOC:         return "a dry run without allocations";
        case LLAMA_SPLIT_OVERLAP_NO_EVENTS:        return "a device has no events";
        case LLAMA_SPLIT_OVERLAP_TRAINING:         return "the context is used for training";
    }
    return "unknown reason";
}

void llama_split_overlap::init(llama_context & ctx, const llama_context_params & params) {
    if (!params.split_overlap) {
        return;
    }
    auto so = std::make_unique<llama_split_overlap>();
    const llama_model & model = ctx.model;

    int n_meta = 0;
    for (size_t i = 0; i < ctx.backends.size(); i++) {
        if (ggml_backend_dev_type(ggml_backend_get_device(ctx.backends[i].get())) == GGML_BACKEND_DEVICE_TYPE_META) {
            so->i_meta = i;
            n_meta++;
        }
    }

    if (model.split_mode() != LLAMA_SPLIT_MODE_TENSOR || n_meta != 1) {
        so->reason = LLAMA_SPLIT_OVERLAP_NOT_TENSOR;
    } else if (model.n_gpu_layers() <= model.hparams.n_layer_all) {
        so->reason = LLAMA_SPLIT_OVERLAP_PARTIAL_OFFLOAD;
    } else if (!ctx.cparams.offload_kqv) {
        so->reason = LLAMA_SPLIT_OVERLAP_KV_NOT_OFFLOADED;
    } else if (model.has_tensor_overrides()) {
        so->reason = LLAMA_SPLIT_OVERLAP_TENSOR_OVERRIDES;
    } else if (ctx.cparams.ctx_type != LLAMA_CONTEXT_TYPE_DEFAULT) {
        so->reason = LLAMA_SPLIT_OVERLAP_CONTEXT_TYPE;
    } else if (model.hparams.no_alloc) {
        so->reason = LLAMA_SPLIT_OVERLAP_NO_ALLOC;
    } else {
        // a second Meta backend on the same Meta device: its own simple backends, streams and comm context
        ggml_backend_t lane0 = ctx.backends[so->i_meta].get();
        ggml_backend_t lane1 = ggml_backend_dev_init(ggml_backend_get_device(lane0), nullptr);
        if (lane1 != nullptr && ggml_backend_meta_share_lanes(lane0, lane1)) {
            so->stash.meta.reset(lane1);
            so->metas[0] = lane0;
            so->metas[1] = lane1;
            so->enabled  = true;
            so->reason   = LLAMA_SPLIT_OVERLAP_ON;
        } else {
            if (lane1 != nullptr) {
                ggml_backend_free(lane1);
            }
            so->reason = LLAMA_SPLIT_OVERLAP_NO_EVENTS;
        }
    }

    const char * equal = getenv("LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES"); // 0: llama.cpp's cut, to compare
    so->equal_ubatches = equal == nullptr || strcmp(equal, "0") != 0;

    if (so->enabled) {
        LLAMA_LOG_INFO("%s: split overlap: consecutive ubatches alternate between two lanes\n", __func__);
    } else {
        LLAMA_LOG_WARN("%s: split overlap stays off: %s\n", __func__, reason_text(so->reason));
    }
    ctx.split_overlap = std::move(so);
}

void llama_split_overlap::activate(llama_context & ctx, int lane) {
    if (!enabled) {
        return;
    }
    // the lane's thread may still be issuing its previous graph, which lives in the lane's graph result
    ggml_backend_meta_lanes_flush(metas[lane]);
    if (lane == active) {
        return;
    }
    std::swap(ctx.sched,              stash.sched);
    std::swap(ctx.backends[i_meta],   stash.meta);
    std::swap(ctx.gf_res_prev,        stash.gf_res_prev);
    std::swap(ctx.gf_res_prev_active, stash.gf_res_prev_active);
    ctx.backend_ptrs[i_meta] = ctx.backends[i_meta].get();
    active = lane;
}

uint32_t llama_split_overlap::ubatch_size(const llama_context & ctx, const llama_batch & batch) const {
    const uint32_t n_ubatch = ctx.cparams.n_ubatch;
    const uint32_t n_tokens = batch.n_tokens;
    if (!enabled || !equal_ubatches || !ctx.sampling.samplers.empty() || n_tokens <= n_ubatch) {
        return n_ubatch;
    }
    // several sequences are cut by sequence sets (split_equal), where a smaller size can add ubatches
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (batch.n_seq_id[i] != 1 || batch.seq_id[i][0] != batch.seq_id[0][0]) {
            return n_ubatch;
        }
    }
    // llama.cpp's cut gives the lanes unequal work and a short last ubatch: 2048 tokens at -ub 640 are 640, 640,
    // 640 and 128 (1280 and 768 tokens a lane), at -ub 768 768, 768 and 512; four of 512 give each lane the same
    uint32_t n_split = (n_tokens + n_ubatch - 1) / n_ubatch;
    n_split += n_split % 2;
    const uint32_t size = GGML_PAD((n_tokens + n_split - 1) / n_split, LLAMA_SPLIT_OVERLAP_UBATCH_ALIGN);
    return std::min(size, n_ubatch);
}

void llama_split_overlap::select(llama_context & ctx, const llama_ubatch & ubatch, bool first) {
    if (!enabled) {
        return;
    }
    const bool large = ubatch.n_tokens >= LLAMA_SPLIT_OVERLAP_MIN_TOKENS;
    int lane = 0;
    // backend samplers keep per-sequence state outside the Meta buffers: stay on one lane with them
    if (ctx.sampling.samplers.empty()) {
        if (first) {
            // a large first ubatch continues the alternation of the calls before (a prompt fed in pieces of
            // one ubatch); a small one (decoding) starts on lane 0, where decoding keeps its reusable graph
            lane       = large ? next : 0;
            call_large = false;
        } else {
            // the scheduler synchronizes a lane's Meta backend (it has no events) before it copies a ubatch's
            // inputs, so a ubatch waits on the host for the previous one of its lane: the ubatches of one call
            // alternate whatever their sizes, and a server's step (a token of each generating sequence and a
            // prompt piece, which llama.cpp cuts into several ubatches) runs on both lanes
            lane = prev ^ 1;
        }
        call_large = call_large || large;
        if (call_large) {
            next = lane ^ 1; // the next call's large first ubatch goes on from this call's last ubatch
        }
        prev = lane;
    }
    activate(ctx, lane);
    // a small ubatch (decoding) gains nothing from the lane's issue thread and would pay the hand-over
    ggml_backend_meta_lanes_issue_inline(metas[lane], !large);
    ubatches[lane]++;
}

void llama_split_overlap::after_reserve(llama_context & ctx) {
    if (!enabled || reserving) {
        return;
    }
    if (ctx.cparams.training) {
        disable(ctx, LLAMA_SPLIT_OVERLAP_TRAINING);
        return;
    }
    // each lane reserves the compute buffers of a full ubatch
    struct guard {
        bool & flag;
        ~guard() { flag = false; }
    } g { reserving };
    reserving = true;
    const int lane = active;
    activate(ctx, lane ^ 1);
    ctx.sched_need_reserve = true;
    ctx.sched_reserve();
    activate(ctx, lane);
}

void llama_split_overlap::wait_issued() const {
    for (ggml_backend_t meta : metas) {
        ggml_backend_meta_lanes_flush(meta); // a no-op for a lane not made
    }
}

void llama_split_overlap::synchronize() {
    if (enabled && stash.sched) {
        ggml_backend_sched_synchronize(stash.sched.get());
    }
}

void llama_split_overlap::reset_graphs() {
    for (auto & res : stash.gf_res_prev) {
        if (res) {
            res->reset();
        }
    }
    stash.gf_res_prev_active = nullptr;
}

void llama_split_overlap::add_compute_buffers(const llama_context & ctx, llama_memory_breakdown & out) const {
    if (!enabled || !stash.sched) {
        return;
    }
    for (size_t i = 0; i < ctx.backend_ptrs.size(); i++) {
        ggml_backend_t backend = i == i_meta ? stash.meta.get() : ctx.backend_ptrs[i];
        ggml_backend_buffer_type_t buft = ggml_backend_sched_get_buffer_type(stash.sched.get(), backend);
        out[buft].compute += ggml_backend_sched_get_buffer_size(stash.sched.get(), backend);
    }
}

void llama_split_overlap::disable(llama_context & ctx, int32_t why) {
    activate(ctx, 0);
    ctx.synchronize();
    stash   = lane{};
    enabled = false;
    reason  = why;
    metas[1] = nullptr;
    LLAMA_LOG_WARN("%s: split overlap turned off: %s\n", __func__, reason_text(why));
}

bool llama_split_overlap::get_stats(const llama_context & ctx, llama_split_overlap_stats * stats) {
    if (stats == nullptr || stats->size != sizeof(llama_split_overlap_stats)) {
        return false;
    }
    *stats = {};
    stats->size   = sizeof(llama_split_overlap_stats);
    stats->reason = LLAMA_SPLIT_OVERLAP_NOT_REQUESTED;
    const llama_split_overlap * so = ctx.split_overlap.get();
    if (so == nullptr) {
        return true;
    }
    stats->enabled   = so->enabled;
    stats->reason    = so->reason;
    stats->next_lane = so->next;
    for (int l = 0; l < 2; l++) {
        stats->ubatches[l] = so->ubatches[l];
        ggml_backend_meta_lanes_stats ls = {};
        ls.size = sizeof(ls);
        if (so->metas[l] != nullptr && ggml_backend_meta_lanes_get_stats(so->metas[l], &ls)) {
            stats->graph_builds[l] = ls.rebuilds;
            stats->waits[l]        = ls.waits;
            stats->records[l]      = ls.records;
        }
    }
    return true;
}

ggml_backend_t llama_split_overlap::backend(const llama_context & ctx, int32_t lane) {
    const llama_split_overlap * so = ctx.split_overlap.get();
    if (so == nullptr || !so->enabled || lane < 0 || lane > 1) {
        return nullptr;
    }
    return so->metas[lane];
}

bool llama_split_overlap_get_stats(const llama_context * ctx, llama_split_overlap_stats * stats) {
    return ctx != nullptr && llama_split_overlap::get_stats(*ctx, stats);
}

const char * llama_split_overlap_reason_str(int32_t reason) {
    return reason_text(reason);
}

ggml_backend_t llama_split_overlap_backend(const llama_context * ctx, int32_t lane) {
    return ctx != nullptr ? llama_split_overlap::backend(*ctx, lane) : nullptr;
}
