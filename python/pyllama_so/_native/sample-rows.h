// A step's output rows sampled in parallel: rows of different sequences, each with its own chain, grammar and
// candidates buffer (the chains share nothing), on the threads of a Context's row pool.
#pragma once

#include "llama.h"
#include "row-pool.h"

#include <cstdint>

// Samples one row with a chain (and grammar) into a candidates buffer of n_vocab entries and accepts the token
// (the bindings' _sample_row); prefilter: the Sampler's prefilter state, opaque here.
typedef llama_token (*pyllama_so_row_sampler)(llama_sampler * chain, llama_sampler * grammar, llama_token_data * cur,
                                              int32_t n_vocab, const float * logits, const void * prefilter);

// out[i] = fn(chains[i], grammars[i], curs[i], n_vocab, rows[i], prefilters[i]) for i in [0, n), on up to
// n_threads threads of pool (the caller's among them).
void pyllama_so_sample_rows(pyllama_so_row_sampler fn, int n, llama_sampler ** chains, llama_sampler ** grammars,
                            llama_token_data ** curs, const void ** prefilters, int32_t n_vocab, const float ** rows,
                            llama_token * out, pyllama_so_row_pool * pool, int n_threads);
