# cython: language_level=3
# llama.h, the context: its parameters, memory (KV cache), batches and llama_decode, outputs (logits,
# embeddings), state, LoRA scales and counters; and split overlap's statistics (pyllama-so-split-overlap.h).

from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t, uint64_t

from pyllama_so._native.ggml cimport ggml_type
from pyllama_so._native.llama cimport *
from pyllama_so._native.llama_model cimport llama_adapter_lora


cdef extern from "llama.h" nogil:
    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    # the model's default pooling, or the one a context asks for (embeddings)
    enum llama_pooling_type_e "llama_pooling_type":  # the C name is also the getter's
        LLAMA_POOLING_TYPE_UNSPECIFIED
        LLAMA_POOLING_TYPE_NONE
        LLAMA_POOLING_TYPE_MEAN
        LLAMA_POOLING_TYPE_CLS
        LLAMA_POOLING_TYPE_LAST
        LLAMA_POOLING_TYPE_RANK

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        int32_t n_threads
        int32_t n_threads_batch
        llama_pooling_type_e pooling_type
        llama_flash_attn_type flash_attn_type
        ggml_type type_k
        ggml_type type_v
        bint embeddings
        bint offload_kqv
        bint no_perf
        bint op_offload
        bint kv_unified
        bint split_overlap

    llama_context_params llama_context_default_params()
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)

    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    uint32_t llama_n_ubatch(const llama_context * ctx)
    uint32_t llama_n_seq_max(const llama_context * ctx)
    uint32_t llama_n_ctx_seq(const llama_context * ctx)
    llama_memory_t llama_get_memory(const llama_context * ctx)
    void llama_memory_clear(llama_memory_t mem, bint data)
    bint llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)

    llama_batch llama_batch_get_one(llama_token * tokens, int32_t n_tokens)
    llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max)
    void llama_batch_free(llama_batch batch)
    int32_t llama_decode(llama_context * ctx, llama_batch batch)
    int32_t llama_encode(llama_context * ctx, llama_batch batch)
    void llama_set_causal_attn(llama_context * ctx, bint causal_attn)
    void llama_set_n_threads(llama_context * ctx, int32_t n_threads, int32_t n_threads_batch)
    void llama_synchronize(llama_context * ctx)
    float * llama_get_logits_ith(llama_context * ctx, int32_t i)
    llama_pooling_type_e llama_get_pooling_type "llama_pooling_type"(const llama_context * ctx)
    void llama_set_embeddings(llama_context * ctx, bint embeddings)
    float * llama_get_embeddings_ith(llama_context * ctx, int32_t i)
    float * llama_get_embeddings_seq(llama_context * ctx, llama_seq_id seq_id)

    size_t llama_state_get_size(llama_context * ctx)
    size_t llama_state_get_data(llama_context * ctx, uint8_t * dst, size_t size)
    size_t llama_state_set_data(llama_context * ctx, const uint8_t * src, size_t size)

    int32_t llama_set_adapters_lora(llama_context * ctx, llama_adapter_lora ** adapters, size_t n_adapters,
                                    float * scales)

    struct llama_perf_context_data:
        int32_t n_reused
    llama_perf_context_data llama_perf_context(const llama_context * ctx)


cdef extern from "pyllama-so-split-overlap.h" nogil:
    enum:
        LLAMA_SPLIT_OVERLAP_MIN_TOKENS
    struct llama_split_overlap_stats:
        size_t size
        int32_t enabled
        int32_t reason
        int32_t next_lane
        uint64_t ubatches[2]
        uint64_t graph_builds[2]
        uint64_t waits[2]
        uint64_t records[2]
    bint llama_split_overlap_get_stats(const llama_context * ctx, llama_split_overlap_stats * stats)
    const char * llama_split_overlap_reason_str(int32_t reason)
