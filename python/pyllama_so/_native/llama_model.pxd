# cython: language_level=3
# llama.h, the model: loading (parameters, split modes, metadata overrides, progress), what a model carries
# (sizes, metadata, chat template), quantization and LoRA adapters.

from libcpp cimport bool as cbool
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from pyllama_so._native.ggml cimport ggml_backend_dev_t, ggml_tensor, ggml_type, gguf_context
from pyllama_so._native.llama cimport *


cdef extern from "llama.h" nogil:
    enum llama_split_mode:
        LLAMA_SPLIT_MODE_NONE
        LLAMA_SPLIT_MODE_LAYER
        LLAMA_SPLIT_MODE_ROW
        LLAMA_SPLIT_MODE_TENSOR

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

    ctypedef struct llama_model_quantize_params:
        int32_t nthread
        llama_ftype ftype
        ggml_type output_tensor_type
        ggml_type token_embedding_type
        bint allow_requantize

    llama_model_params llama_model_default_params()
    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_save_to_file(const llama_model * model, const char * path_model)
    llama_model * llama_model_init_from_user(gguf_context * metadata, llama_model_set_tensor_data_t set_tensor_data,
                                             void * set_tensor_data_ud, llama_model_params params)
    void llama_model_free(llama_model * model)
    llama_model_quantize_params llama_model_quantize_default_params()
    uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
                                  const llama_model_quantize_params * params)

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

    llama_adapter_lora * llama_adapter_lora_init(llama_model * model, const char * path_lora)
    void llama_adapter_lora_free(llama_adapter_lora * adapter)
    int32_t llama_adapter_meta_val_str(const llama_adapter_lora * adapter, const char * key, char * buf,
                                       size_t buf_size)
