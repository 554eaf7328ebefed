#pragma once

// Split states of the Meta backend that upstream's rules (ggml-backend-meta.cpp) infer too coarsely,
// hooked in by patches/0009-*.

#include "ggml-backend.h"

#include <cstddef>

struct ggml_tensor;

// A reshape or contiguous view of a source that every device holds all of or none of (split on axis 0 or 1:
// one KV head that lives on some devices only, MQA) whose result is one row, or part of one, per singleton
// dimension 1: [ne0' <= ne0, 1, n]. Its split belongs on axis 1, the head axis, as upstream finds for n > 1:
// a separate K [head_dim, n_tokens] -> [head_dim, 1, n_tokens], or the K view of a fused QKV (a non-contiguous
// view then, which keeps the source's split or moves it to the head axis). With one token (a decode step) the
// result is contiguous and upstream's rule that a split of the source's last dimension goes to the result's
// last dimension answers axis 0 for [head_dim, 1, 1], which aborts in per-row ops such as the K norm.
bool ggml_backend_meta_reshape_splits_whole_rows(
        const ggml_tensor * tensor, const ggml_backend_meta_split_state & src_ss, size_t n_bufs);
