// Per-architecture test fixtures for the pytest equivalent of upstream's tests/test-llama-archs.cpp:
// the list of architectures, which of them are tested how (the same skips as upstream), GGUF
// metadata of a tiny model for each. The random weights come from the test harness's bindings
// (_fill_random in python/pyllama_so/testing/_fixtures.pyx), as for every random-weight model.

#include "arch-fixtures.h"

#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include "llama-arch.h"
#include "llama-model-saver.h"

#include <cinttypes>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

static bool arch_in(llm_arch arch, std::initializer_list<llm_arch> set) {
    for (llm_arch a : set) {
        if (a == arch) {
            return true;
        }
    }
    return false;
}

// architectures without a dense variant
static bool arch_moe_mandatory(llm_arch arch) {
    return arch_in(arch, {
        LLM_ARCH_LLAMA4, LLM_ARCH_COHERE2MOE, LLM_ARCH_GROK, LLM_ARCH_QWEN2MOE, LLM_ARCH_QWEN3MOE,
        LLM_ARCH_QWEN3NEXT, LLM_ARCH_QWEN3VLMOE, LLM_ARCH_QWEN35MOE, LLM_ARCH_QWEN4EXP, LLM_ARCH_PHIMOE,
        LLM_ARCH_DBRX, LLM_ARCH_OLMOE, LLM_ARCH_ARCTIC, LLM_ARCH_DEEPSEEK, LLM_ARCH_DEEPSEEK2,
        LLM_ARCH_DEEPSEEK32, LLM_ARCH_DOTS3NOTE, LLM_ARCH_DEEPSEEK4, LLM_ARCH_GLM4_MOE, LLM_ARCH_GLM_DSA,
        LLM_ARCH_EXAONE_MOE, LLM_ARCH_BAILINGMOE, LLM_ARCH_BAILINGMOE2, LLM_ARCH_BAILINGMOE3, LLM_ARCH_DOTS1,
        LLM_ARCH_AFMOE, LLM_ARCH_ERNIE4_5, LLM_ARCH_ERNIE4_5_MOE, LLM_ARCH_HUNYUAN_MOE, LLM_ARCH_HY_V3,
        LLM_ARCH_HY_V4, LLM_ARCH_OPENAI_MOE, LLM_ARCH_LFM2MOE, LLM_ARCH_SMALLTHINKER, LLM_ARCH_LLADA_MOE,
        LLM_ARCH_GROVEMOE, LLM_ARCH_MINIMAX_01, LLM_ARCH_MINIMAX_M2, LLM_ARCH_MINIMAX_M3, LLM_ARCH_RND1,
        LLM_ARCH_PADDLEOCR, LLM_ARCH_MIMO2, LLM_ARCH_KIMI_LINEAR, LLM_ARCH_KIMI_K3, LLM_ARCH_GLM5_NEXT,
        LLM_ARCH_STEP35, LLM_ARCH_MISTRAL4, LLM_ARCH_MELLUM, LLM_ARCH_LAGUNA, LLM_ARCH_MAPLE,
    });
}

static bool arch_moe_implemented(llm_arch arch) {
    return arch_moe_mandatory(arch) || arch_in(arch, {
        LLM_ARCH_LLAMA, LLM_ARCH_REFACT, LLM_ARCH_MINICPM, LLM_ARCH_GRANITE, LLM_ARCH_GRANITE_MOE,
        LLM_ARCH_MISTRAL3, LLM_ARCH_LLAMA_EMBED,
    });
}

// architectures whose rows upstream reports as SKIP (each with upstream's reason)
static bool arch_supported(llm_arch arch) {
#ifdef GGML_USE_WEBGPU
    // FIXME upstream: scheduler / view-backed output issues with WebGPU
    if (arch_in(arch, { LLM_ARCH_DEEPSEEK32, LLM_ARCH_GLM_DSA, LLM_ARCH_DOTS3NOTE, LLM_ARCH_QWEN4EXP, LLM_ARCH_HY_V4 })) {
        return false;
    }
#endif // GGML_USE_WEBGPU
#ifdef GGML_USE_HIP
    if (arch == LLM_ARCH_JAMBA) {
        return false; // FIXME upstream: wrong output on HIP (RDNA3.5), SSM kernels
    }
#endif // GGML_USE_HIP
    return !arch_in(arch, {
        LLM_ARCH_CLIP, LLM_ARCH_GPTJ, LLM_ARCH_UNKNOWN,                     // no usable implementation
        LLM_ARCH_CHAMELEON,                                                 // half-implemented
        LLM_ARCH_WAVTOKENIZER_DEC,                                          // FIXME CUDA backend crashes
        LLM_ARCH_GEMMA4, LLM_ARCH_GEMMA4_ASSISTANT,                         // FIXME
        LLM_ARCH_GRANITE_SWITCH,                                            // FIXME adapter fixture
        LLM_ARCH_LLAMA_EMBED, LLM_ARCH_GEMMA_EMBEDDING, LLM_ARCH_T5ENCODER, // FIXME inconsistent results
        LLM_ARCH_RWKV6, LLM_ARCH_RWKV6QWEN2, LLM_ARCH_RWKV7, LLM_ARCH_ARWKV7, // FIXME hang
        LLM_ARCH_BERT, LLM_ARCH_MODERN_BERT, LLM_ARCH_NOMIC_BERT, LLM_ARCH_NOMIC_BERT_MOE,
        LLM_ARCH_NEO_BERT, LLM_ARCH_JINA_BERT_V2, LLM_ARCH_JINA_BERT_V3, LLM_ARCH_EUROBERT, // TODO vocab
        LLM_ARCH_PLM,                                                       // TODO tensor shapes
        LLM_ARCH_DEEPSEEK2OCR,
    });
}

// architectures that upstream leaves out of the table altogether
static bool arch_excluded(llm_arch arch) {
    return arch_in(arch, { LLM_ARCH_UNKNOWN, LLM_ARCH_GEMMA4, LLM_ARCH_GEMMA4_ASSISTANT, LLM_ARCH_EAGLE3, LLM_ARCH_DFLASH });
}

static bool arch_encode(llm_arch arch) {
    return arch_in(arch, { LLM_ARCH_T5, LLM_ARCH_DREAM, LLM_ARCH_LLADA, LLM_ARCH_LLADA_MOE, LLM_ARCH_RND1 });
}

static std::vector<llm_arch> & arch_list() {
    static std::vector<llm_arch> archs = [] {
        std::vector<llm_arch> out;
        for (llm_arch arch : llm_arch_all()) {
            if (!arch_excluded(arch)) {
                out.push_back(arch);
            }
        }
        return out;
    }();
    return archs;
}

size_t pyllama_so_arch_count(void) {
    return arch_list().size();
}

const char * pyllama_so_arch_name(size_t i) {
    return i < arch_list().size() ? llm_arch_name(arch_list()[i]) : nullptr;
}

static bool arch_mqa(llm_arch arch); // below the fixture dimensions it reads

uint32_t pyllama_so_arch_flags(const char * name) {
    const llm_arch arch = llm_arch_from_string(name);
    if (arch == LLM_ARCH_UNKNOWN) {
        return 0;
    }
    uint32_t flags = PYLLAMA_SO_ARCH_KNOWN;
    flags |= arch_supported(arch)                  ? PYLLAMA_SO_ARCH_SUPPORTED      : 0;
    flags |= arch_moe_implemented(arch)            ? PYLLAMA_SO_ARCH_MOE            : 0;
    flags |= arch_moe_mandatory(arch)              ? PYLLAMA_SO_ARCH_MOE_MANDATORY  : 0;
    flags |= arch_encode(arch)                     ? PYLLAMA_SO_ARCH_ENCODE         : 0;
    flags |= llm_arch_supports_sm_tensor(arch)     ? PYLLAMA_SO_ARCH_SM_TENSOR      : 0;
    flags |= llama_model_saver_supports_arch(arch) ? PYLLAMA_SO_ARCH_SAVER          : 0;
    flags |= arch_mqa(arch)                        ? PYLLAMA_SO_ARCH_MQA            : 0;
    return flags;
}

// Fixture dimensions: small everywhere, with the per-architecture minimums the graphs need.
struct arch_dims {
    uint32_t n_ctx     = 256;
    uint32_t n_vocab   = 128;
    uint32_t n_embd    = 256;
    uint32_t n_head    = 2;
    uint32_t n_head_kv = 0; // 0: as many as n_head
    uint32_t n_ff      = 384;
    uint32_t n_layer   = 2;
};

static bool arch_is_mla(llm_arch arch) {
    return arch_in(arch, {
        LLM_ARCH_DEEPSEEK2, LLM_ARCH_DEEPSEEK32, LLM_ARCH_GLM_DSA, LLM_ARCH_DOTS3NOTE, LLM_ARCH_KIMI_LINEAR,
        LLM_ARCH_BAILINGMOE3, LLM_ARCH_KIMI_K3, LLM_ARCH_GLM5_NEXT, LLM_ARCH_MISTRAL4, LLM_ARCH_HY_V4,
    });
}

static arch_dims arch_get_dims(llm_arch arch, bool mqa = false) {
    arch_dims d;
    switch (arch) {
        case LLM_ARCH_LLAMA4:       d.n_layer = 4; break; // n_no_rope_layer_step is 4
        case LLM_ARCH_GEMMA4:       d.n_embd = 128; d.n_ff = 192; d.n_layer = 5; break; // swa pattern of 5
        case LLM_ARCH_GEMMA3N:      d.n_embd = 64; d.n_head = 1; d.n_ff = 96; d.n_layer = 22; break; // kv from layer 20
        case LLM_ARCH_DEEPSEEK4:    d.n_embd = 512; d.n_head = 8; d.n_ff = 1024; d.n_layer = 4; break;
        case LLM_ARCH_STEP35:
        case LLM_ARCH_LAGUNA:       d.n_embd = 160; break; // head size 80
        case LLM_ARCH_QWEN3:        d.n_head = 4; d.n_head_kv = 1; break; // MQA
        case LLM_ARCH_MUSE_GLIMMER:
        case LLM_ARCH_AFMOE:        d.n_head = 4; d.n_head_kv = 2; break; // GQA
        case LLM_ARCH_NEMOTRON_H:
        case LLM_ARCH_NEMOTRON_H_MOE: d.n_layer = 3; break;
        case LLM_ARCH_CHAMELEON:    d.n_vocab = 10240; break;
        case LLM_ARCH_QWEN3TTS:     d.n_vocab = 3072; break; // the codec head size
        case LLM_ARCH_HRM_TEXT:     d.n_layer = 6; break;   // 2 h-cycles x (2 l-cycles + 1)
        default: break;
    }
    if (arch_is_mla(arch)) {
        d.n_embd = 128; d.n_head = 1; d.n_ff = 192;
    }
    if (d.n_head_kv == 0) {
        d.n_head_kv = d.n_head;
    }
    if (mqa) {
        // one KV head for four query heads (Gemma 3 270M's ratio): more query heads than KV heads on every
        // split, so tensor split has to replicate the KV head
        d.n_head    = 4;
        d.n_head_kv = 1;
    }
    return d;
}

// architectures with an MQA variant: tensor split implemented, regular attention whose KV head count the
// fixture sets (not MLA, not attention-free), and not MQA already
static bool arch_mqa(llm_arch arch) {
    if (!arch_supported(arch) || !llm_arch_supports_sm_tensor(arch) || arch_is_mla(arch) || arch_moe_mandatory(arch)) {
        return false;
    }
    if (arch_in(arch, {
            LLM_ARCH_QWEN, LLM_ARCH_COGVLM, // a fused QKV of 3 x n_embd whatever the KV head count
            LLM_ARCH_QWEN35,                // its linear-attention layers derive their heads from n_head: no graph on the CPU
        })) {
        return false;
    }
    return arch_get_dims(arch).n_head_kv != 1;
}

static std::vector<uint32_t> per_layer(uint32_t n_layer, const std::function<uint32_t(uint32_t)> & f) {
    std::vector<uint32_t> v(n_layer);
    for (uint32_t il = 0; il < n_layer; il++) {
        v[il] = f(il);
    }
    return v;
}

static void add_attention_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    const bool per_layer_heads = arch_in(arch, {
        LLM_ARCH_PLAMO2, LLM_ARCH_JAMBA, LLM_ARCH_NEMOTRON_H, LLM_ARCH_NEMOTRON_H_MOE, LLM_ARCH_GRANITE_HYBRID,
        LLM_ARCH_LFM2, LLM_ARCH_LFM2MOE, LLM_ARCH_KIMI_LINEAR, LLM_ARCH_BAILINGMOE3, LLM_ARCH_KIMI_K3, LLM_ARCH_GLM5_NEXT,
    });
    if (per_layer_heads) {
        // hybrids: layer 1 has no attention
        const std::vector<uint32_t> heads = per_layer(d.n_layer, [&](uint32_t il) { return il == 1 ? 0u : d.n_head; });
        if (arch == LLM_ARCH_GLM5_NEXT) {
            ms.add_kv(LLM_KV_ATTENTION_HEAD_COUNT, d.n_head); // its KDA heads use the uniform count
        } else {
            ms.add_kv(LLM_KV_ATTENTION_HEAD_COUNT, heads);
        }
        ms.add_kv(LLM_KV_ATTENTION_HEAD_COUNT_KV, per_layer(d.n_layer, [&](uint32_t il) { return il == 1 ? 0u : d.n_head_kv; }));
    } else {
        ms.add_kv(LLM_KV_ATTENTION_HEAD_COUNT, d.n_head);
        ms.add_kv(LLM_KV_ATTENTION_HEAD_COUNT_KV, arch == LLM_ARCH_DEEPSEEK4 ? 1u : d.n_head_kv);
    }
    ms.add_kv(LLM_KV_ATTENTION_MAX_ALIBI_BIAS, 8.0f);

    const uint32_t n_embd_head = d.n_embd / d.n_head;
    if (arch == LLM_ARCH_DEEPSEEK4) {
        ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH,   n_embd_head);
        ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH, n_embd_head);
        ms.add_kv(LLM_KV_ROPE_DIMENSION_COUNT,   n_embd_head/2);
    } else if (arch_is_mla(arch)) {
        const bool nope_only = arch == LLM_ARCH_GLM5_NEXT; // its cache row is the latent alone
        ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH,       nope_only ? 512u : 576u);
        ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH,     512u);
        ms.add_kv(LLM_KV_ROPE_DIMENSION_COUNT,       nope_only ? 0u : 64u);
        ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH_MLA,   192u);
        ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH_MLA, 128u);
        if (arch == LLM_ARCH_DOTS3NOTE) {
            // SWA layers with the full layers' MLA geometry, indexers on the full layers
            ms.add_kv(LLM_KV_ATTENTION_KV_LORA_RANK_SWA,     512u);
            ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH_SWA,       576u);
            ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH_SWA,     512u);
            ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH_MLA_SWA,   192u);
            ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH_MLA_SWA, 128u);
            ms.add_kv(LLM_KV_ROPE_FREQ_BASE_SWA,             10000.0f);
            ms.add_kv(LLM_KV_ATTENTION_INDEXER_TYPES, per_layer(d.n_layer, [](uint32_t il) { return il % 2 ? 0u : 1u; }));
        }
    } else if (arch == LLM_ARCH_MINIMAX_M3) {
        ms.add_kv(LLM_KV_ROPE_DIMENSION_COUNT, 64u); // within the indexer key length
    }
    ms.add_kv(LLM_KV_ATTENTION_CLAMP_KQV,              1.0f);
    ms.add_kv(LLM_KV_ATTENTION_LAYERNORM_EPS,          1e-5f);
    ms.add_kv(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS,      1e-5f);
    ms.add_kv(LLM_KV_ATTENTION_GROUPNORM_EPS,          1e-5f);
    ms.add_kv(LLM_KV_ATTENTION_GROUPNORM_GROUPS,       8u);
    ms.add_kv(LLM_KV_ATTENTION_Q_LORA_RANK,            arch == LLM_ARCH_DEEPSEEK4 ? 64u : 512u);
    ms.add_kv(LLM_KV_ATTENTION_KV_LORA_RANK,           512u);
    ms.add_kv(LLM_KV_ATTENTION_RELATIVE_BUCKETS_COUNT, 8u);
    ms.add_kv(LLM_KV_ATTENTION_SLIDING_WINDOW,         d.n_ctx/8);

    if (arch == LLM_ARCH_GEMMA4) {
        ms.add_kv(LLM_KV_EMBEDDING_LENGTH_PER_LAYER,       d.n_embd/2);
        ms.add_kv(LLM_KV_ATTENTION_SHARED_KV_LAYERS,       0u);
        ms.add_kv(LLM_KV_ATTENTION_KEY_LENGTH_SWA,         n_embd_head);
        ms.add_kv(LLM_KV_ATTENTION_VALUE_LENGTH_SWA,       n_embd_head);
        ms.add_kv(LLM_KV_ROPE_FREQ_BASE_SWA,               10000.0f);
        ms.add_kv(LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN, 5u);
    } else if (arch_in(arch, { LLM_ARCH_COHERE2MOE, LLM_ARCH_MIMO2, LLM_ARCH_STEP35, LLM_ARCH_SPARK2_5, LLM_ARCH_MUSE_GLIMMER,
                               LLM_ARCH_GRANITE_SWA, LLM_ARCH_DOTS3NOTE, LLM_ARCH_MAPLE })) {
        ms.add_kv(LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN, per_layer(d.n_layer, [](uint32_t il) { return il % 2; }));
    } else {
        ms.add_kv(LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN, 2u);
    }
}

static void add_hyper_connection_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    if (arch == LLM_ARCH_QWEN4EXP || arch == LLM_ARCH_GLM5_NEXT) {
        ms.add_kv(LLM_KV_HYPER_CONNECTION_COUNT,               4u);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_SINKHORN_ITERATIONS, 2u);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_EPSILON,             1.0e-6f);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_LOW_RANK,            8u);
        ms.add_kv(LLM_KV_ATTENTION_COMPRESS_RATIOS, std::vector<uint32_t>(d.n_layer, 4)); // else QSA layers go dense

        // per-layer embeddings: the indexer cache needs their head count
        const uint32_t ngram_size      = 3;
        const uint32_t heads_per_ngram = 2;
        const uint32_t n_heads         = (ngram_size - 1)*heads_per_ngram;
        GGML_ASSERT(d.n_embd % n_heads == 0);
        std::vector<uint64_t> offsets(n_heads);
        for (uint32_t h = 0; h < n_heads; h++) {
            offsets[h] = uint64_t(h)*d.n_vocab;
        }
        ms.add_kv(LLM_KV_PLE_LAYERS,                 std::vector<uint32_t>({ 0 })); // a linear attention layer
        ms.add_kv(LLM_KV_PLE_NGRAM_SIZE,             ngram_size);
        ms.add_kv(LLM_KV_PLE_HEADS_PER_NGRAM,        heads_per_ngram);
        ms.add_kv(LLM_KV_PLE_CONV_KERNEL,            4u);
        ms.add_kv(LLM_KV_PLE_EOS_TOKEN_ID,           0u);
        ms.add_kv(LLM_KV_EMBEDDING_LENGTH_PER_LAYER, d.n_embd/n_heads);
        ms.add_kv(LLM_KV_PLE_LAYER_MULTIPLIERS,      std::vector<uint64_t>({ 1, 3, 5 }));
        ms.add_kv(LLM_KV_PLE_HEAD_OFFSETS,           offsets);
        ms.add_kv(LLM_KV_PLE_HEAD_VOCAB_SIZES,       std::vector<uint64_t>(n_heads, d.n_vocab));
    }
}

static void add_indexer_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    const uint32_t n_embd_head = d.n_embd / d.n_head;
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_HEAD_COUNT, arch == LLM_ARCH_MINIMAX_M3 ? d.n_head : 64u);
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_KEY_LENGTH, arch == LLM_ARCH_QWEN4EXP ? n_embd_head : 128u);
    // a top-k that selects everything keeps the results deterministic across backends
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_TOP_K,              131072u);
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_BLOCK_SIZE,         4u);
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_KPOOL,              4u);
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_KPOOL_SELECT_TAIL,  true);
    ms.add_kv(LLM_KV_ATTENTION_INDEXER_LOCAL_BLOCKS,       1u);
    if (arch == LLM_ARCH_BAILINGMOE3) {
        ms.add_kv(LLM_KV_ROPE_DIMENSION_SECTIONS, std::vector<uint32_t>({ 8, 12, 12, 0 })); // sums to n_rot/2
    } else {
        const uint32_t q = n_embd_head/4;
        ms.add_kv(LLM_KV_ROPE_DIMENSION_SECTIONS, std::vector<uint32_t>({ q, q, q, q }));
    }
}

static void add_arch_specific_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    if (arch == LLM_ARCH_HY_V4) {
        ms.add_kv(LLM_KV_HYPER_CONNECTION_COUNT,     4u);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_EPSILON,   1.0e-6f);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_MAGNITUDE, 2.0f);
        ms.add_kv(LLM_KV_SWIGLU_CLAMP_EXP,           10.0f);
        ms.add_kv(LLM_KV_EXPERT_WEIGHTS_SCALE,       1.0f);
        ms.add_kv(LLM_KV_EXPERT_WEIGHTS_NORM,        true);
        ms.add_kv(LLM_KV_ATTENTION_INDEXER_TYPES, per_layer(d.n_layer, [](uint32_t il) { return il % 2 ? 0u : 1u; }));
    } else if (arch == LLM_ARCH_DEEPSEEK4) {
        ms.add_kv(LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT,         8u);
        ms.add_kv(LLM_KV_ATTENTION_OUTPUT_LORA_RANK,           32u);
        ms.add_kv(LLM_KV_ATTENTION_COMPRESS_RATIOS,            std::vector<uint32_t>({ 0, 0, 4, 128 }));
        ms.add_kv(LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE,    160000.0f);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_COUNT,               4u);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_SINKHORN_ITERATIONS, 2u);
        ms.add_kv(LLM_KV_HYPER_CONNECTION_EPSILON,             1.0e-6f);
        ms.add_kv(LLM_KV_HASH_LAYER_COUNT,                     0u);
        ms.add_kv(LLM_KV_SWIGLU_CLAMP_EXP,                     10.0f);
        ms.add_kv(LLM_KV_EXPERT_WEIGHTS_SCALE,                 1.0f);
        ms.add_kv(LLM_KV_EXPERT_WEIGHTS_NORM,                  true);
    } else if (arch == LLM_ARCH_HRM_TEXT) {
        ms.add_kv(LLM_KV_HRM_LAYERS_PER_STACK, 1u);
        ms.add_kv(LLM_KV_HRM_H_CYCLES,         2u);
        ms.add_kv(LLM_KV_HRM_L_CYCLES,         2u);
    } else if (arch == LLM_ARCH_MAPLE) {
        ms.add_kv(LLM_KV_SWIGLU_CLAMP_EXP, 7.0f);
    }
}

static void add_tokenizer_kv(llama_model_saver & ms, const arch_dims & d) {
    std::vector<std::string> tokens(d.n_vocab);
    for (uint32_t i = 0; i < d.n_vocab; i++) {
        tokens[i] = "tok_" + std::to_string(i);
    }
    ms.add_kv(LLM_KV_TOKENIZER_MODEL,  "test");
    ms.add_kv(LLM_KV_TOKENIZER_LIST,   tokens);
    ms.add_kv(LLM_KV_TOKENIZER_SCORES, std::vector<float>(d.n_vocab, 0.0f));
}

static void add_moe_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    ms.add_kv(LLM_KV_EXPERT_FEED_FORWARD_LENGTH,        d.n_ff);
    ms.add_kv(LLM_KV_EXPERT_SHARED_FEED_FORWARD_LENGTH, d.n_ff/2); // differs from n_ff: a clobbered key shows on reload
    ms.add_kv(LLM_KV_EXPERT_LATENT_LENGTH,              d.n_ff);
    ms.add_kv(LLM_KV_INTERLEAVE_MOE_LAYER_STEP,         2u);
    ms.add_kv(LLM_KV_EXPERT_COUNT,                      2u);
    ms.add_kv(LLM_KV_EXPERT_USED_COUNT,                 2u);
    ms.add_kv(LLM_KV_EXPERT_SHARED_COUNT,               1u);
    ms.add_kv(LLM_KV_EXPERT_GATING_FUNC,                arch == LLM_ARCH_DEEPSEEK4 ? 4u : 2u); // sqrtsoftplus : sigmoid
    ms.add_kv(LLM_KV_EXPERT_GROUP_SCALE,                1.0f);
    ms.add_kv(LLM_KV_EXPERTS_PER_GROUP,                 1u);
}

static void add_misc_kv(llama_model_saver & ms, llm_arch arch, const arch_dims & d) {
    ms.add_kv(LLM_KV_POSNET_EMBEDDING_LENGTH,   d.n_embd);
    ms.add_kv(LLM_KV_POSNET_BLOCK_COUNT,        d.n_layer);
    ms.add_kv(LLM_KV_CONVNEXT_EMBEDDING_LENGTH, d.n_embd);
    ms.add_kv(LLM_KV_CONVNEXT_BLOCK_COUNT,      d.n_layer);
    ms.add_kv(LLM_KV_XIELU_ALPHA_N,             1.0f);
    ms.add_kv(LLM_KV_XIELU_ALPHA_P,             1.0f);
    ms.add_kv(LLM_KV_XIELU_BETA,                1.0f);
    ms.add_kv(LLM_KV_XIELU_EPS,                 1.0e-7f);
    const bool small_ssm = arch_in(arch, { LLM_ARCH_QWEN3NEXT, LLM_ARCH_QWEN35, LLM_ARCH_QWEN35MOE, LLM_ARCH_QWEN4EXP });
    ms.add_kv(LLM_KV_SSM_INNER_SIZE,            small_ssm ? 256u : 2*d.n_embd);
    ms.add_kv(LLM_KV_SSM_CONV_KERNEL,           4u);
    ms.add_kv(LLM_KV_SSM_STATE_SIZE,            128u);
    ms.add_kv(LLM_KV_SSM_TIME_STEP_RANK,        d.n_head);
    ms.add_kv(LLM_KV_SSM_GROUP_COUNT,           arch == LLM_ARCH_PLAMO2 ? 0u : 2u);
    ms.add_kv(LLM_KV_KDA_HEAD_DIM,              128u);
    ms.add_kv(LLM_KV_KDA_SAFE_GATE,             true);
    ms.add_kv(LLM_KV_KDA_GATE_LOWER_BOUND,      -5.0f);
    if (arch == LLM_ARCH_BAILINGMOE3) {
        ms.add_kv(LLM_KV_SWIGLU_CLAMP_EXP,   std::vector<float>({ 0.0f, 4.0f }));
        ms.add_kv(LLM_KV_SWIGLU_CLAMP_SHEXP, std::vector<float>({ 0.0f, 5.0f }));
    }
    ms.add_kv(LLM_KV_WKV_HEAD_SIZE,               d.n_embd/d.n_head);
    ms.add_kv(LLM_KV_SHORTCONV_L_CACHE,           3u);
    ms.add_kv(LLM_KV_RESIDUAL_SCALE,              3.5565588200778455f);
    ms.add_kv(LLM_KV_ATTN_RES_BLOCK_SIZE,         12u);
    ms.add_kv(LLM_KV_ACTIVATION_SITU_BETA,        4.0f);
    ms.add_kv(LLM_KV_ACTIVATION_SITU_LINEAR_BETA, 25.0f);
}

gguf_context * pyllama_so_arch_metadata(const char * name, bool moe, bool mqa) {
    const llm_arch arch = llm_arch_from_string(name);
    if (arch == LLM_ARCH_UNKNOWN) {
        return nullptr;
    }
    const arch_dims d = arch_get_dims(arch, mqa);
    gguf_context * ctx = gguf_init_empty();
    llama_model_saver ms(arch, ctx);

    ms.add_kv(LLM_KV_GENERAL_ARCHITECTURE,      llm_arch_name(arch));
    ms.add_kv(LLM_KV_VOCAB_SIZE,                d.n_vocab);
    ms.add_kv(LLM_KV_CONTEXT_LENGTH,            d.n_ctx);
    ms.add_kv(LLM_KV_EMBEDDING_LENGTH,          d.n_embd);
    ms.add_kv(LLM_KV_FEATURES_LENGTH,           d.n_embd);
    ms.add_kv(LLM_KV_BLOCK_COUNT,               d.n_layer);
    ms.add_kv(LLM_KV_LEADING_DENSE_BLOCK_COUNT, 1u);
    if (arch == LLM_ARCH_NEMOTRON_H || arch == LLM_ARCH_NEMOTRON_H_MOE) {
        ms.add_kv(LLM_KV_FEED_FORWARD_LENGTH, per_layer(d.n_layer, [&](uint32_t il) { return il <= 1 ? 0u : d.n_ff; }));
    } else {
        ms.add_kv(LLM_KV_FEED_FORWARD_LENGTH, d.n_ff);
    }
    ms.add_kv(LLM_KV_USE_PARALLEL_RESIDUAL,   false);
    ms.add_kv(LLM_KV_LOGIT_SCALE,             1.0f);
    ms.add_kv(LLM_KV_TIME_MIX_EXTRA_DIM,      64u);
    ms.add_kv(LLM_KV_TIME_DECAY_EXTRA_DIM,    128u);
    ms.add_kv(LLM_KV_FULL_ATTENTION_INTERVAL, 2u);

    add_attention_kv(ms, arch, d);
    add_hyper_connection_kv(ms, arch, d);
    add_indexer_kv(ms, arch, d);
    add_arch_specific_kv(ms, arch, d);
    add_tokenizer_kv(ms, d);
    if (moe) {
        add_moe_kv(ms, arch, d);
    }
    add_misc_kv(ms, arch, d);

    // F16 tensors of the audio/vision towers (posnet, convnext) that some graphs expect
    for (uint32_t il = 0; il < d.n_layer; il++) {
        ggml_tensor t;
        memset(&t, 0, sizeof(t));
        t.type = GGML_TYPE_F16;
        for (const char * fmt : { "conv%" PRIu32 "d.weight", "posnet.%" PRIu32 ".conv1.weight",
                                  "posnet.%" PRIu32 ".conv2.weight", "convnext.%" PRIu32 ".dw.weight" }) {
            ggml_format_name(&t, fmt, il);
            gguf_add_tensor(ctx, &t);
        }
    }
    return ctx;
}
