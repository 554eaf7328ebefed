# cython: language_level=3
# llama.h, the samplers (_sampler.pxi): the sampler chain, its members, grammars, and sampling in the graph.

from libc.stdint cimport int32_t, int64_t, uint32_t

from pyllama_so._native.llama cimport *


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
