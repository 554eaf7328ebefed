# cython: language_level=3
# The bindings' own C++ helpers, in this folder: compiled as C++ with warnings on (python/CMakeLists.txt), not
# as strings inside Cython.

from libc.stdint cimport int32_t

from pyllama_so._native.llama cimport llama_token
from pyllama_so._native.llama_sampler cimport llama_sampler, llama_token_data


cdef extern from "last-error.h":
    # the error lines llama.cpp logged on the calling thread (_errors.pxi)
    char _last_error "pyllama_so_last_error"[1024]


cdef extern from "row-pool.h":
    # the worker threads of a Context that sample a step's output rows
    ctypedef struct _RowPool "pyllama_so_row_pool":
        pass
    _RowPool * _row_pool_new "pyllama_so_row_pool_new"() nogil
    void _row_pool_free "pyllama_so_row_pool_free"(_RowPool * pool) nogil


cdef extern from "top-candidates.h" nogil:
    # the Sampler's prefilter: a row's k largest (biased) logits, or 0 where the chain needs the whole row
    int32_t _top_candidates "pyllama_so_top_candidates"(
        const float * logits, int32_t n, int32_t k, const int32_t * bias_ids, const float * bias_vals, int32_t n_bias,
        llama_token_data * out) noexcept


cdef extern from "sample-rows.h" nogil:
    # a step's rows sampled in parallel, each with its own chain, on a Context's row pool
    ctypedef llama_token (*_row_sampler_t "pyllama_so_row_sampler")(llama_sampler *, llama_sampler *,
                                                                    llama_token_data *, int32_t, const float *,
                                                                    const void *) noexcept nogil
    void _sample_rows "pyllama_so_sample_rows"(_row_sampler_t fn, int n, llama_sampler ** chains,
                                               llama_sampler ** grammars, llama_token_data ** curs,
                                               const void ** prefilters, int32_t n_vocab, const float ** rows,
                                               llama_token * out, _RowPool * pool, int n_threads)
