# cython: language_level=3
# The C-level interface of pyllama_so._llama: the bindings' classes and error helpers, for the modules that
# cimport them (the test harness, testing/_fixtures.pyx). Cython finds a module's .pxd by its import name, so
# this file sits where the module is installed, beside its stub _llama.pyi. The sources are in _native/, with
# the declarations of the C headers they call, one .pxd per area: ggml.pxd, llama.pxd (the core of llama.h)
# and llama_model / llama_context / llama_vocab / llama_sampler.pxd, common.pxd (our common/ layer) and
# helpers.pxd (the bindings' own C++). A signature that drifts upstream fails the Cython/C++ compile, not an
# import at run time.

from libcpp cimport bool as cbool
from libcpp.string cimport string
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from pyllama_so._native.ggml cimport *
from pyllama_so._native.llama cimport *
from pyllama_so._native.llama_model cimport *
from pyllama_so._native.llama_context cimport *
from pyllama_so._native.llama_vocab cimport *
from pyllama_so._native.llama_sampler cimport *
from pyllama_so._native.common cimport *
from pyllama_so._native.helpers cimport *


cdef str _take_last_error()
cdef _check_decode(int rc, str what, str call=*)
cdef _null_check(const void * ptr, exc_type, str what)


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


cdef class _StepPlan:
    # a step's tokens, checked (_step.pxi)
    cdef list items  # (seq_id, tokens, wants an output, sampler, n_logprobs, go_on) each
    cdef list samplers  # of the items with an output, in order ...
    cdef list tops  # ... and their logprob counts
    cdef object tokens  # owns tok
    cdef llama_token * tok  # the items' tokens, flat, in order
    cdef int32_t n_items, n_tokens, n_out
    # per item: where its tokens start in tok and how many, its sequence and the position of its first token,
    # the index of its first token with an output (length: none), the output row of the running step whose
    # token it takes (-1: none), whether it may go into the batch, and whether it went in (Context._fill_batch)
    cdef int32_t * first  # owns the other seven
    cdef int32_t * length
    cdef int32_t * seq
    cdef int32_t * pos0
    cdef int32_t * out_from
    cdef int32_t * follow
    cdef int32_t * go
    cdef int32_t * went

    @staticmethod
    cdef _StepPlan sequence(int32_t[::1] toks, llama_pos pos0, llama_seq_id seq_id, int32_t out_from)
    cdef void take_sampled(self, const llama_token * sampled, const llama_vocab * vocab) noexcept nogil


cdef class _RunningStep:
    # the step decode_batch_sample_begin() left running, until decode_batch_sample_end() (_step.pxi)
    cdef list items  # as _StepPlan.items
    cdef list at  # the batch positions of the outputs of its last llama_decode call, which still runs
    cdef int32_t first  # the output row of the first of them
    cdef list samplers  # per output row: its sampler ...
    cdef list tops  # ... logprobs count ...
    cdef list out  # ... and (token, logprob, top) once sampled

    cdef check_samplers(self)
    cdef dict rows_of(self)


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
    cdef _RunningStep running  # the step decode_batch_sample_begin left running, until decode_batch_sample_end

    cdef int32_t _fill_batch(self, _StepPlan plan, int32_t start, int32_t end) noexcept nogil
    cdef void _release(self) noexcept
    cdef void _check_open(self) except *
    cdef llama_token _rand_token(self, int32_t n_vocab) noexcept nogil
    cdef int _decode_one(self, llama_token token, llama_pos pos, llama_seq_id seq_id) noexcept nogil


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
