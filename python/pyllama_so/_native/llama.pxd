# cython: language_level=3
# llama.h, its core: the handles and ids every area uses, and the process-wide calls (version, backend
# initialisation, log, system and device limits). The areas: llama_model.pxd, llama_context.pxd,
# llama_vocab.pxd, llama_sampler.pxd.

from libcpp cimport bool as cbool
from libc.stdint cimport int32_t

from pyllama_so._native.ggml cimport ggml_log_callback


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

    const char * llama_version()
    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()
    size_t llama_max_devices()
    size_t llama_max_parallel_sequences()
    bint llama_supports_gpu_offload()
