// Split states the Meta backend infers too coarsely: see ggml-backend-meta-rows.h.

#include "ggml-backend-meta-rows.h"

#include "ggml.h"

bool ggml_backend_meta_reshape_splits_whole_rows(
        const ggml_tensor * tensor, const ggml_backend_meta_split_state & src_ss, size_t n_bufs) {
    const ggml_tensor * src = tensor->src[0];
    if (src == nullptr || src_ss.n_segments != 1 || src_ss.nr[0] != 1 ||
            (src_ss.axis != GGML_BACKEND_SPLIT_AXIS_0 && src_ss.axis != GGML_BACKEND_SPLIT_AXIS_1)) {
        return false;
    }
    if (tensor->ne[1] != 1 || tensor->ne[0] > src->ne[0]) {
        return false;
    }
    if (src_ss.axis == GGML_BACKEND_SPLIT_AXIS_1 && src->ne[1] == 1) {
        return false; // [ne0, 1, 1] -> [ne0, 1] merges the head axis into the rows: upstream answers axis 0, as for n > 1
    }
    const int64_t ne_axis = src->ne[src_ss.axis];
    for (size_t j = 0; j < n_bufs; j++) {
        if (src_ss.ne[j] != 0 && src_ss.ne[j] != ne_axis) {
            return false; // a device holds part of the source: upstream's rules apply
        }
    }
    return true;
}
