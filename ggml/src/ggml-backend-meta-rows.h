#pragma once

// Split states of the Meta backend that upstream's rules (ggml-backend-meta.cpp) infer too coarsely,
// hooked in by patches/0009-*.

#include "ggml-backend.h"

#include <cstddef>

struct ggml_tensor;

// A reshape or contiguous view of a source that every device holds all of or none of (one KV head that lives
// on some devices only, MQA) whose result is one head: [ne0' <= ne0, 1, n], taken from rows split on axis 0
// ([ne0, n]: a separate K, or a fused QKV) or from several heads split on axis 1 ([ne0, n_head > 1, n]).
// Its split belongs on axis 1, the head axis, as upstream finds for n > 1 (where such a view is not
// contiguous and keeps the source's split or moves it to the head axis). With one token (a decode step) the
// result is contiguous and upstream's rule that a split of the source's last dimension goes to the result's
// last dimension answers axis 0 for [head_dim, 1, 1], which aborts in per-row ops such as the K norm. Merging
// the head axis back into the rows ([ne0, 1, n] -> [ne0, n], the KV cache store) stays upstream's: axis 0.
bool ggml_backend_meta_reshape_splits_whole_rows(
        const ggml_tensor * tensor, const ggml_backend_meta_split_state & src_ss, size_t n_bufs);
