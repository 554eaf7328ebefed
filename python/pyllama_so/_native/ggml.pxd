# cython: language_level=3
# ggml's headers, as far as the bindings use them: tensors and types (ggml.h), devices and backend registries
# (ggml-backend.h), GGUF metadata (gguf.h), our CPU virtual devices (ggml-cpu-virtual.h) and the RPC protocol
# version (ggml-rpc.h). A signature that drifts upstream fails the Cython/C++ compile, not an import.

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
    ctypedef struct ggml_backend_buffer_type:
        pass
    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)
    ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device)
    ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type()


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


cdef extern from "ggml-cpu-virtual.h" nogil:
    size_t ggml_backend_cpu_virtual_init(size_t n)


cdef extern from "ggml-rpc.h" nogil:
    enum:
        RPC_PROTO_MAJOR_VERSION
        RPC_PROTO_MINOR_VERSION
