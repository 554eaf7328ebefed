// Load-time check of a tensor split: see llama-split-check.h.

#include "llama-split-check.h"

#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

[[noreturn]] static void llama_split_check_fail(const ggml_tensor * tensor, const std::string & reason) {
    throw std::runtime_error(std::string("tensor split cannot lay out ") + tensor->name + ": " + reason);
}

// the layer of "blk.N.<suffix>" when suffix is the tensor's, else -1
static int llama_split_check_layer(const char * name, const char * suffix) {
    if (strncmp(name, "blk.", 4) != 0) {
        return -1;
    }
    char * end = nullptr;
    const long il = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || strcmp(end + 1, suffix) != 0) {
        return -1;
    }
    return (int) il;
}

// upstream cuts a fused QKV of regular attention into Q, K and V rows by the head counts (its own rule for
// the Qwen3-Next family, whose Q part carries a gate, is left to it)
static void llama_split_check_qkv(const llama_model & model, const ggml_tensor * tensor) {
    switch (model.arch) {
        case LLM_ARCH_QWEN3NEXT:
        case LLM_ARCH_QWEN35:
        case LLM_ARCH_QWEN35MOE:
        case LLM_ARCH_QWEN4EXP:
            return;
        default:
            break;
    }
    int il = llama_split_check_layer(tensor->name, "attn_qkv.weight");
    const int axis = il >= 0 ? 1 : 0;
    if (il < 0) {
        il = llama_split_check_layer(tensor->name, "attn_qkv.bias");
    }
    const llama_hparams & hparams = model.hparams;
    if (il < 0 || (uint32_t) il >= hparams.n_layer() || hparams.is_recr(il)) {
        return;
    }
    const int64_t n_q = (int64_t) hparams.n_head(il) * hparams.n_embd_head_k(il);
    const int64_t n_k = hparams.n_embd_k_gqa(il);
    const int64_t n_v = hparams.n_embd_v_gqa(il);
    if (tensor->ne[axis] != n_q + n_k + n_v) {
        llama_split_check_fail(tensor, "its " + std::to_string(tensor->ne[axis]) + " QKV rows are not the " +
            std::to_string(n_q) + " + " + std::to_string(n_k) + " + " + std::to_string(n_v) + " rows of " +
            std::to_string(hparams.n_head(il)) + " query and " + std::to_string(hparams.n_head_kv(il)) +
            " KV heads that the split cuts it into (the architecture does not use the model's KV head count)");
    }
}

// what the Meta backend asserts when it allocates a split tensor
static void llama_split_check_slices(const llama_model & model, const ggml_tensor * tensor) {
    llama_meta_device_get_split_state_userdata ud = model.get_split_state_ud;
    const ggml_backend_meta_split_state st = llama_meta_device_get_split_state(tensor, &ud);
    if (st.axis < 0 || st.axis >= GGML_MAX_DIMS) {
        return;
    }
    const size_t  n_dev = ud.n_devices;
    const int64_t blck  = st.axis == GGML_BACKEND_SPLIT_AXIS_0 ? ggml_blck_size(tensor->type) : 1;
    int64_t sum = 0;
    for (uint32_t s = 0; s < st.n_segments; s++) {
        for (size_t j = 0; j < n_dev; j++) {
            const int64_t ne = st.ne[s*n_dev + j];
            if (ne % blck != 0) {
                llama_split_check_fail(tensor, "device " + std::to_string(j) + " would get " + std::to_string(ne) +
                    " of its " + std::to_string(tensor->ne[0]) + " columns, not a whole number of " + ggml_type_name(tensor->type) +
                    " blocks of " + std::to_string(blck) + " (the split's granularity comes from another tensor's type)");
            }
            sum += ne * st.nr[s];
        }
    }
    if (sum != tensor->ne[st.axis]) {
        llama_split_check_fail(tensor, "its slices on axis " + std::to_string((int) st.axis) + " add up to " +
            std::to_string(sum) + ", not " + std::to_string(tensor->ne[st.axis]));
    }
}

void llama_split_check(const llama_model & model) {
    if (model.split_mode() != LLAMA_SPLIT_MODE_TENSOR || model.get_split_state_ud.model == nullptr) {
        return;
    }
    for (const auto & [name, tensor] : model.tensors_by_name) {
        llama_split_check_qkv(model, tensor);
        llama_split_check_slices(model, tensor);
    }
}
