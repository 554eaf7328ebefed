// KV head replication under tensor split: see llama-kv-replica.h.

#include "llama-kv-replica.h"

#include "llama-attn-split.h"
#include "llama-model.h"

#include "ggml.h"

#include <cstdlib>
#include <cstring>
#include <string>

// the layer of "blk.N.<suffix>" or "cache_k_lN"/"cache_v_lN" with its suffix ("attn_k.weight", "cache_k"), or false
static bool llama_kv_replica_parse(const char * name, uint32_t & il, std::string & suffix) {
    if (strncmp(name, "blk.", 4) == 0) {
        char * end = nullptr;
        const unsigned long v = strtoul(name + 4, &end, 10);
        if (end == name + 4 || *end != '.') {
            return false;
        }
        il     = (uint32_t) v;
        suffix = end + 1;
        return true;
    }
    for (const char * prefix : { "cache_k_l", "cache_v_l" }) {
        const size_t n = strlen(prefix);
        if (strncmp(name, prefix, n) == 0) {
            char * end = nullptr;
            const unsigned long v = strtoul(name + n, &end, 10);
            if (end == name + n || *end != '\0') {
                return false;
            }
            il     = (uint32_t) v;
            suffix = std::string(prefix, n - 2);
            return true;
        }
    }
    return false;
}

static const ggml_tensor * llama_kv_replica_layer_tensor(const llama_model & model, uint32_t il, const char * suffix) {
    return model.get_tensor(("blk." + std::to_string(il) + "." + suffix).c_str());
}

bool llama_kv_replica_layer(const llama_model & model, size_t n_devices, uint32_t il) {
    const llama_hparams & hparams = model.hparams;
    if (n_devices < 2 || il >= hparams.n_layer() || hparams.is_recr(il) ||
            hparams.n_head_kv(il) != 1 || hparams.n_head(il) < 2) {
        return false;
    }
    const ggml_tensor * attn_output = llama_kv_replica_layer_tensor(model, il, "attn_output.weight");
    if (attn_output == nullptr || llama_kv_replica_layer_tensor(model, il, "attn_k.weight") == nullptr ||
            llama_kv_replica_layer_tensor(model, il, "attn_v.weight") == nullptr) {
        return false;
    }
    const float * split = llama_attn_split_for(model, attn_output);
    if (split == nullptr) {
        split = model.tensor_split();
    }
    size_t n_sharing = 0;
    bool   all_zero  = true;
    for (size_t j = 0; j < n_devices; j++) {
        const float p = split == nullptr ? 0.0f : split[j];
        n_sharing += p > 0.0f;
        all_zero   = all_zero && p == 0.0f;
    }
    return all_zero || n_sharing >= 2; // all zero: an even split
}

bool llama_kv_replica_mirrored(const llama_model & model, size_t n_devices, const ggml_tensor * tensor) {
    uint32_t    il;
    std::string suffix;
    if (!llama_kv_replica_parse(tensor->name, il, suffix)) {
        return false;
    }
    static const char * const kv_side[] = {
        "attn_k.weight", "attn_v.weight", "attn_k.bias", "attn_v.bias", "attn_k_norm.weight", "cache_k", "cache_v",
    };
    for (const char * s : kv_side) {
        if (suffix == s) {
            return llama_kv_replica_layer(model, n_devices, il);
        }
    }
    return false;
}

uint32_t llama_kv_replica_q_group(const llama_model & model, size_t n_devices, uint32_t il) {
    return llama_kv_replica_layer(model, n_devices, il) ? 1 : model.hparams.n_gqa(il);
}
