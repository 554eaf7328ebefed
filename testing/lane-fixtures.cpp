// Split-overlap race fixtures: see lane-fixtures.h.

#include "lane-fixtures.h"

#include "ggml-backend-impl.h"
#include "llama-ext.h"
#include "llama-hparams.h"
#include "llama-model.h"
#include "ggml-cpp.h"
#include "ggml-cpu-virtual.h"
#include "pyllama-so-split-overlap.h"

#include <algorithm>
#include <utility>

int pyllama_so_testing_delay_lane(struct llama_context * ctx, int32_t lane, int64_t delay_us) {
    ggml_backend_t meta = llama_split_overlap_backend(ctx, lane);
    if (meta == nullptr) {
        return 0;
    }
    int n = 0;
    for (size_t j = 0; j < ggml_backend_meta_n_backends(meta); j++) {
        ggml_backend_t simple = ggml_backend_meta_simple_backend(meta, j);
        if (ggml_backend_is_cpu_virtual(simple)) {
            ggml_backend_cpu_virtual_set_delay_us(simple, delay_us);
            n++;
        }
    }
    return n;
}

size_t pyllama_so_testing_compute_bytes(const struct llama_context * ctx) {
    size_t total = 0;
    for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
        total += data.compute;
    }
    return total;
}

int pyllama_so_testing_context_bytes(const struct llama_context * ctx, const char ** names, size_t * bytes, int n_out) {
    int n = 0;
    for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
        if (data.context == 0) {
            continue;
        }
        if (n < n_out) {
            names[n] = ggml_backend_buft_name(buft);
            bytes[n] = data.context;
        }
        n++;
    }
    return n;
}

int pyllama_so_testing_kv_cell_bytes(const struct llama_context * ctx, enum ggml_type type_k, enum ggml_type type_v,
                                     size_t * out, int n_out) {
    const llama_model * model = llama_get_model(ctx);
    const llama_hparams & hparams = model->hparams;
    const bool split = model->split_mode() == LLAMA_SPLIT_MODE_TENSOR && model->get_split_state_ud.model != nullptr;
    const int n_dev = split ? (int) model->get_split_state_ud.n_devices : 1;
    if (n_dev > n_out) {
        return -1;
    }
    std::fill(out, out + n_dev, 0);

    const ggml_init_params params = { 4*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    for (uint32_t il = 0; il < hparams.n_layer(); il++) {
        if (!hparams.has_kv(il) || hparams.is_recr(il)) {
            continue;
        }
        ggml_context_ptr gctx(ggml_init(params));
        const std::pair<const char *, std::pair<ggml_type, int64_t>> kv[2] = {
            {"cache_k_l%u", {type_k, (int64_t) hparams.n_embd_k_gqa(il)}},
            {"cache_v_l%u", {type_v, (int64_t) hparams.n_embd_v_gqa(il)}},
        };
        for (const auto & [fmt, tn] : kv) {
            ggml_tensor * t = ggml_new_tensor_1d(gctx.get(), tn.first, tn.second);
            ggml_format_name(t, fmt, il);
            if (!split) {
                out[0] += ggml_row_size(tn.first, tn.second);
                continue;
            }
            // where the Meta backend puts this layer's K/V rows: the model's own split function
            llama_meta_device_get_split_state_userdata ud = model->get_split_state_ud;
            const ggml_backend_meta_split_state st = llama_meta_device_get_split_state(t, &ud);
            if (st.axis == GGML_BACKEND_SPLIT_AXIS_MIRRORED) { // a replicated KV head: every device holds it
                for (int j = 0; j < n_dev; j++) {
                    out[j] += ggml_row_size(tn.first, tn.second);
                }
                continue;
            }
            if (st.axis != GGML_BACKEND_SPLIT_AXIS_0 || st.n_segments != 1) {
                return -2;
            }
            for (int j = 0; j < n_dev; j++) {
                out[j] += ggml_row_size(tn.first, st.ne[j]);
            }
        }
    }
    return n_dev;
}

int pyllama_so_testing_weight_split(const struct llama_model * model, const char * name, int64_t * ne, int n_out, int * n_dev_out) {
    if (model->split_mode() != LLAMA_SPLIT_MODE_TENSOR || model->get_split_state_ud.model == nullptr) {
        return -1;
    }
    const ggml_tensor * tensor = model->get_tensor(name);
    const int n_dev = (int) model->get_split_state_ud.n_devices;
    if (tensor == nullptr || n_dev > n_out) {
        return -2;
    }
    *n_dev_out = n_dev;
    llama_meta_device_get_split_state_userdata ud = model->get_split_state_ud;
    const ggml_backend_meta_split_state st = llama_meta_device_get_split_state(tensor, &ud);
    for (int j = 0; j < n_dev; j++) {
        ne[j] = 0;
        if (st.axis >= 0 && st.axis < GGML_MAX_DIMS) {
            for (uint32_t s = 0; s < st.n_segments; s++) {
                ne[j] += st.ne[s*n_dev + j] * st.nr[s];
            }
        }
    }
    return (int) st.axis;
}
