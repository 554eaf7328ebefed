# cython: language_level=3
# Declarations of the parts of llama.h (and the ggml/gguf headers it includes) that the bindings use,
# and of the bindings' own classes, so that the test harness's module (testing/_fixtures.pyx) can
# cimport them. A signature that drifts upstream fails the Cython/C++ compile, not an import at run time.

from libcpp cimport bool as cbool
from libcpp.string cimport string
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "ggml.h" nogil:
    enum ggml_type:
        GGML_TYPE_F32
        GGML_TYPE_F16
        GGML_TYPE_Q4_0
        GGML_TYPE_Q4_1
        GGML_TYPE_Q5_0
        GGML_TYPE_Q5_1
        GGML_TYPE_Q8_0
        GGML_TYPE_BF16
        GGML_TYPE_COUNT

    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT

    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data) noexcept nogil

    ctypedef uint16_t ggml_fp16_t
    ctypedef struct ggml_bf16_t:
        uint16_t bits

    struct ggml_tensor:
        ggml_type type
        int64_t ne[4]
        char name[64]

    int64_t ggml_nelements(const ggml_tensor * tensor)
    size_t ggml_nbytes(const ggml_tensor * tensor)
    const char * ggml_type_name(ggml_type type)
    void ggml_fp32_to_fp16_row(const float * x, ggml_fp16_t * y, int64_t n)
    void ggml_fp32_to_bf16_row(const float * x, ggml_bf16_t * y, int64_t n)



cdef extern from "ggml-backend.h" nogil:
    ctypedef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_reg * ggml_backend_reg_t

    enum ggml_backend_dev_type_e "ggml_backend_dev_type":
        GGML_BACKEND_DEVICE_TYPE_CPU
        GGML_BACKEND_DEVICE_TYPE_GPU
        GGML_BACKEND_DEVICE_TYPE_IGPU
        GGML_BACKEND_DEVICE_TYPE_ACCEL
        GGML_BACKEND_DEVICE_TYPE_META

    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_dev_type_e ggml_backend_dev_type(ggml_backend_dev_t device)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    size_t ggml_backend_reg_count()
    ggml_backend_reg_t ggml_backend_reg_get(size_t index)
    const char * ggml_backend_reg_name(ggml_backend_reg_t reg)
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_reg_t ggml_backend_reg_by_name(const char * name)
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)
    void ggml_backend_tensor_set(ggml_tensor * tensor, const void * data, size_t offset, size_t size)


cdef extern from "gguf.h" nogil:
    struct gguf_context:
        pass
    enum gguf_type:
        GGUF_TYPE_UINT32
        GGUF_TYPE_INT32
        GGUF_TYPE_FLOAT32

    gguf_context * gguf_init_empty()
    void gguf_free(gguf_context * ctx)
    void gguf_set_val_u32(gguf_context * ctx, const char * key, uint32_t val)
    void gguf_set_val_i32(gguf_context * ctx, const char * key, int32_t val)
    void gguf_set_val_f32(gguf_context * ctx, const char * key, float val)
    void gguf_set_val_bool(gguf_context * ctx, const char * key, bint val)
    void gguf_set_val_str(gguf_context * ctx, const char * key, const char * val)
    void gguf_set_arr_data(gguf_context * ctx, const char * key, gguf_type type, const void * data, size_t n)
    void gguf_set_arr_str(gguf_context * ctx, const char * key, const char ** data, size_t n)
    void gguf_add_tensor(gguf_context * ctx, const ggml_tensor * tensor)
    int64_t gguf_remove_key(gguf_context * ctx, const char * key)


cdef extern from "llama.h" nogil:
    struct llama_vocab:
        pass
    struct llama_model:
        pass
    struct llama_context:
        pass
    struct llama_memory_i:
        pass
    ctypedef llama_memory_i * llama_memory_t

    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id

    enum llama_split_mode:
        LLAMA_SPLIT_MODE_NONE
        LLAMA_SPLIT_MODE_LAYER
        LLAMA_SPLIT_MODE_ROW
        LLAMA_SPLIT_MODE_TENSOR

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    enum llama_load_mode:
        LLAMA_LOAD_MODE_AUTO
        LLAMA_LOAD_MODE_NONE
        LLAMA_LOAD_MODE_MMAP

    # the file types quantize_model offers (llama_model_quantize's targets)
    enum llama_ftype:
        LLAMA_FTYPE_ALL_F32
        LLAMA_FTYPE_MOSTLY_F16
        LLAMA_FTYPE_MOSTLY_BF16
        LLAMA_FTYPE_MOSTLY_Q8_0
        LLAMA_FTYPE_MOSTLY_Q4_0
        LLAMA_FTYPE_MOSTLY_Q4_1
        LLAMA_FTYPE_MOSTLY_Q5_0
        LLAMA_FTYPE_MOSTLY_Q5_1
        LLAMA_FTYPE_MOSTLY_Q2_K
        LLAMA_FTYPE_MOSTLY_Q3_K_S
        LLAMA_FTYPE_MOSTLY_Q3_K_M
        LLAMA_FTYPE_MOSTLY_Q3_K_L
        LLAMA_FTYPE_MOSTLY_Q4_K_S
        LLAMA_FTYPE_MOSTLY_Q4_K_M
        LLAMA_FTYPE_MOSTLY_Q5_K_S
        LLAMA_FTYPE_MOSTLY_Q5_K_M
        LLAMA_FTYPE_MOSTLY_Q6_K
        LLAMA_FTYPE_MOSTLY_IQ4_NL
        LLAMA_FTYPE_MOSTLY_IQ4_XS

    # the model's default pooling, or the one a context asks for (embeddings)
    enum llama_pooling_type_e "llama_pooling_type":  # the C name is also the getter's
        LLAMA_POOLING_TYPE_UNSPECIFIED
        LLAMA_POOLING_TYPE_NONE
        LLAMA_POOLING_TYPE_MEAN
        LLAMA_POOLING_TYPE_CLS
        LLAMA_POOLING_TYPE_LAST
        LLAMA_POOLING_TYPE_RANK

    enum llama_model_kv_override_type:
        LLAMA_KV_OVERRIDE_TYPE_INT
        LLAMA_KV_OVERRIDE_TYPE_FLOAT
        LLAMA_KV_OVERRIDE_TYPE_BOOL
        LLAMA_KV_OVERRIDE_TYPE_STR

    # the value fields are an anonymous union in llama.h
    struct llama_model_kv_override:
        llama_model_kv_override_type tag
        char key[128]
        int64_t val_i64
        double val_f64
        cbool val_bool
        char val_str[128]

    struct llama_adapter_lora:
        pass

    ctypedef cbool (*llama_progress_callback)(float progress, void * user_data) noexcept nogil
    ctypedef void (*llama_model_set_tensor_data_t)(ggml_tensor * tensor, void * userdata) noexcept nogil

    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    struct llama_model_params:
        ggml_backend_dev_t * devices
        int32_t n_gpu_layers
        llama_split_mode split_mode
        llama_load_mode load_mode
        int32_t main_gpu
        const float * tensor_split
        const float * attn_split  # pyllama_so (patches/0006-*)
        llama_progress_callback progress_callback
        void * progress_callback_user_data
        const llama_model_kv_override * kv_overrides
        bint vocab_only
        bint check_tensors

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

    ctypedef struct llama_model_quantize_params:
        int32_t nthread
        llama_ftype ftype
        ggml_type output_tensor_type
        ggml_type token_embedding_type
        bint allow_requantize

    const char * llama_version()
    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()
    size_t llama_max_devices()
    size_t llama_max_parallel_sequences()
    bint llama_supports_gpu_offload()

    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_save_to_file(const llama_model * model, const char * path_model)
    llama_model * llama_model_init_from_user(gguf_context * metadata, llama_model_set_tensor_data_t set_tensor_data,
                                             void * set_tensor_data_ud, llama_model_params params)
    void llama_model_free(llama_model * model)
    llama_model_quantize_params llama_model_quantize_default_params()
    uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
                                  const llama_model_quantize_params * params)
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)

    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    int32_t llama_model_n_embd_out(const llama_model * model)
    uint32_t llama_model_n_cls_out(const llama_model * model)
    bint llama_model_has_encoder(const llama_model * model)
    bint llama_model_has_decoder(const llama_model * model)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf, size_t buf_size)
    int32_t llama_model_meta_count(const llama_model * model)
    int32_t llama_model_meta_key_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)
    int32_t llama_model_meta_val_str_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)
    const char * llama_model_chat_template(const llama_model * model, const char * name)
    int32_t llama_chat_apply_template(const char * tmpl, const llama_chat_message * chat, size_t n_msg, cbool add_ass,
                                      char * buf, int32_t length)
    int32_t llama_chat_builtin_templates(const char ** output, size_t len)

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

    llama_adapter_lora * llama_adapter_lora_init(llama_model * model, const char * path_lora)
    void llama_adapter_lora_free(llama_adapter_lora * adapter)
    int32_t llama_adapter_meta_val_str(const llama_adapter_lora * adapter, const char * key, char * buf,
                                       size_t buf_size)
    int32_t llama_set_adapters_lora(llama_context * ctx, llama_adapter_lora ** adapters, size_t n_adapters,
                                    float * scales)

    struct llama_perf_context_data:
        int32_t n_reused
    llama_perf_context_data llama_perf_context(const llama_context * ctx)

    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_nl(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pre(const llama_vocab * vocab)
    llama_token llama_vocab_fim_suf(const llama_vocab * vocab)
    llama_token llama_vocab_fim_mid(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pad(const llama_vocab * vocab)
    llama_token llama_vocab_fim_rep(const llama_vocab * vocab)
    llama_token llama_vocab_fim_sep(const llama_vocab * vocab)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    int32_t llama_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, llama_token * tokens,
                           int32_t n_tokens_max, bint add_special, bint parse_special)
    int32_t llama_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf, int32_t length,
                                 int32_t lstrip, bint special)
    int32_t llama_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens, char * text,
                             int32_t text_len_max, bint remove_special, bint unparse_special)


# llama.cpp's samplers (_sampler.pxi): the sampler chain, its members and grammar
cdef extern from "llama.h" nogil:
    enum:
        LLAMA_DEFAULT_SEED
        LLAMA_TOKEN_NULL

    ctypedef struct llama_token_data:
        llama_token id
        float logit
        float p

    ctypedef struct llama_token_data_array:
        llama_token_data * data
        size_t size
        int64_t selected
        bint sorted

    ctypedef struct llama_logit_bias:
        llama_token token
        float bias

    ctypedef struct llama_sampler_chain_params:
        bint no_perf

    struct llama_sampler:
        pass

    llama_sampler_chain_params llama_sampler_chain_default_params()
    llama_sampler * llama_sampler_chain_init(llama_sampler_chain_params params)
    void llama_sampler_chain_add(llama_sampler * chain, llama_sampler * smpl)
    int32_t llama_sampler_chain_n(const llama_sampler * chain)
    llama_sampler * llama_sampler_chain_get(llama_sampler * chain, int32_t i)
    const char * llama_sampler_name(const llama_sampler * smpl)
    void llama_sampler_accept(llama_sampler * smpl, llama_token token)
    # the same, where a grammar may reject the token (llama-grammar throws)
    void llama_sampler_accept_checked "llama_sampler_accept"(llama_sampler * smpl, llama_token token) except +
    void llama_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p)
    void llama_sampler_reset(llama_sampler * smpl)
    void llama_sampler_free(llama_sampler * smpl)
    llama_token llama_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx)
    bint llama_set_sampler(llama_context * ctx, llama_seq_id seq_id, llama_sampler * smpl)
    llama_token llama_get_sampled_token_ith(llama_context * ctx, int32_t i)

    llama_sampler * llama_sampler_init_greedy()
    llama_sampler * llama_sampler_init_dist(uint32_t seed)
    llama_sampler * llama_sampler_init_top_k(int32_t k)
    llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_typical(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_temp(float t)
    llama_sampler * llama_sampler_init_temp_ext(float t, float delta, float exponent)
    llama_sampler * llama_sampler_init_xtc(float p, float t, size_t min_keep, uint32_t seed)
    llama_sampler * llama_sampler_init_top_n_sigma(float n)
    llama_sampler * llama_sampler_init_mirostat(int32_t n_vocab, uint32_t seed, float tau, float eta, int32_t m)
    llama_sampler * llama_sampler_init_mirostat_v2(uint32_t seed, float tau, float eta)
    llama_sampler * llama_sampler_init_grammar(const llama_vocab * vocab, const char * grammar_str,
                                               const char * grammar_root)
    llama_sampler * llama_sampler_init_grammar_lazy_patterns(const llama_vocab * vocab, const char * grammar_str,
                                                             const char * grammar_root, const char ** trigger_patterns,
                                                             size_t num_trigger_patterns,
                                                             const llama_token * trigger_tokens,
                                                             size_t num_trigger_tokens)
    llama_sampler * llama_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n, float penalty_repeat,
                                                 float penalty_freq, float penalty_present)
    llama_sampler * llama_sampler_init_dry(const llama_vocab * vocab, float dry_multiplier, float dry_base,
                                           int32_t dry_allowed_length, int32_t dry_penalty_last_n,
                                           const char ** seq_breakers, size_t num_breakers)
    llama_sampler * llama_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias,
                                                  const llama_logit_bias * logit_bias)


cdef extern from "ggml-cpu-virtual.h" nogil:
    size_t ggml_backend_cpu_virtual_init(size_t n)


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


cdef extern from "pyllama-so-json-schema.h" nogil:
    cbool pyllama_so_json_schema_to_grammar(const string & schema_json, string & out) noexcept


cdef extern from "pyllama-so-chat-tools.h" nogil:
    cbool pyllama_so_chat_tools_apply(const llama_model * model, const string & template_src,
                                      const string & request_json, string & out) noexcept
    cbool pyllama_so_chat_tools_parse(const string & parser_json, const string & text, cbool is_partial,
                                      string & out) noexcept


# ---------------------------------------------------------------------------------------------
# the bindings' classes and error helpers (defined in _llama.pyx)

cdef str _take_last_error()
cdef _check_decode(int rc, str what, str call=*)
cdef _null_check(const void * ptr, exc_type, str what)


cdef extern from "row-pool.h":
    # the worker threads of a Context that sample a step's output rows
    ctypedef struct _RowPool "pyllama_so_row_pool":
        pass
    _RowPool * _row_pool_new "pyllama_so_row_pool_new"() nogil
    void _row_pool_free "pyllama_so_row_pool_free"(_RowPool * pool) nogil


cdef class Model:
    cdef llama_model * ptr
    cdef const llama_vocab * vocab
    cdef int live_contexts
    cdef readonly object path
    cdef readonly tuple rpc_servers  # the RPC servers whose devices it uses ("host:port")
    cdef readonly bint vocab_only     # loaded without weights: tokenizer only
    cdef readonly dict kv_overrides   # the metadata overrides it was loaded with (key -> value)

    @staticmethod
    cdef llama_model_params _params(int n_gpu_layers, object split_mode, int main_gpu, float * split_buf,
                                    object tensor_split, bint use_mmap, float * attn_buf=*,
                                    object attn_split=*, object n_devices=*) except *
    @staticmethod
    cdef Model _load(path, llama_model_params p)
    @staticmethod
    cdef Model _adopt(llama_model * ptr, path)
    cdef void _check_open(self) except *
    cdef int32_t[::1] _tokens(self, tokens)


cdef class Context:
    cdef llama_context * ptr
    cdef readonly Model model
    cdef llama_batch batch
    cdef int32_t batch_cap
    cdef int32_t n_last_outputs
    cdef uint64_t rng
    cdef dict backend_samplers  # seq_id -> Sampler attached with set_backend_sampler (kept alive here)
    cdef public int sampling_threads  # threads that sample a step's output rows (decode_batch_sample)
    cdef _RowPool * row_pool  # those threads but the caller's, started when first needed
    cdef readonly bint embeddings  # decodes output embeddings (set_embeddings)
    cdef object begun  # the step decode_batch_sample_begin left running, until decode_batch_sample_end

    cdef void _fill_batch(self, const int32_t[::1] toks, int32_t start, int32_t n, llama_pos pos0,
                          int32_t seq_id, bint all_logits, int32_t last)
    cdef void _release(self) noexcept
    cdef void _check_open(self) except *
    cdef llama_token _rand_token(self, int32_t n_vocab) noexcept nogil
    cdef int _decode_one(self, llama_token token, llama_pos pos, llama_seq_id seq_id) noexcept nogil
    cdef _sample_outputs(self, const int32_t[::1] rows, int32_t start, int32_t n, list samplers, list tops,
                         list out, int32_t n_vocab)


cdef struct _Prefilter:
    int32_t k  # > 0: _sample_row may hand the chain only the row's k largest (biased) logits
    int32_t n_bias  # the chain's leading logit bias, token ids ascending (owned by the Sampler)
    int32_t * bias_ids
    float * bias_vals
    int64_t n_picked  # rows handed to the chain as their k largest logits ...
    int64_t n_whole  # ... and rows handed to it whole (ties, NaN)


cdef class Sampler:
    cdef llama_sampler * chain
    cdef llama_sampler * grammar  # NULL without a grammar; kept out of the chain for rejection sampling
    cdef llama_token_data * cur   # n_vocab candidates of _sample_row
    cdef _Prefilter pf
    cdef int32_t n_vocab
    cdef readonly Model model
    cdef readonly dict params
    cdef readonly uint32_t seed
    cdef object backend  # (Context, seq_id) while the chain runs in the context's graph, else None

    cdef _init_grammar(self, grammar, str root)
    cdef _add_members(self, params, list bias, int n_ctx)
    cdef _set_prefilter_bias(self, list bias)
    cdef _add_dry(self, params, int32_t last_n)
    cdef _add(self, llama_sampler * member)
    cdef llama_token _sample(self, llama_context * ctx, int32_t idx) noexcept nogil
    cdef int _ensure_cur(self) except -1
    cdef void _check_open(self) except *


cdef class LoraAdapter:
    cdef llama_adapter_lora * ptr
    cdef readonly Model model
    cdef readonly str path
