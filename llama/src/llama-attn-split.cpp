// Attention split: see llama-attn-split.h.

#include "llama-attn-split.h"

#include "llama-model.h"

#include "ggml.h"

#include <cstring>

const float * llama_attn_split_for(const llama_model & model, const ggml_tensor * tensor_axis_0) {
    const float * attn_split = model.attn_split();
    if (attn_split == nullptr || tensor_axis_0 == nullptr) {
        return nullptr;
    }
    static constexpr char suffix[] = "attn_output.weight";
    const size_t n_name   = strlen(tensor_axis_0->name);
    const size_t n_suffix = sizeof(suffix) - 1;
    if (n_name < n_suffix || strcmp(tensor_axis_0->name + n_name - n_suffix, suffix) != 0) {
        return nullptr;
    }
    // all zero would mean "even" to upstream's split; treat it as unset so that it follows tensor_split
    for (size_t i = 0; i < llama_max_devices(); i++) {
        if (attn_split[i] != 0.0f) {
            return attn_split;
        }
    }
    return nullptr;
}
