// The sampler's prefilter (Sampler.prefilter_k): a row's k largest logits picked while reading it, so that a
// chain that starts with top-k (or is greedy) gets k candidates instead of the whole vocabulary.
#pragma once

#include "llama.h"

#include <cstdint>

// The k largest logits of a row as candidates (written to out, which has room for n), when they are
// distinct and strictly above every other logit of the row: then llama.cpp's top-k (a partial sort by
// logit) keeps exactly these, in the one order that has no ties, whether it is given the whole row or
// only them. 0 when the row has a tie at or within its top k, a NaN, or at most k entries: the caller
// then gives the chain the whole row.
//
// With a logit bias ahead of top-k in the chain (n_bias tokens, ids ascending and distinct), the k
// largest are those of the biased row: the other tokens are offered with their own logits, then the
// biased ones with logit + bias, as llama.cpp's logit-bias sampler adds it. The candidates keep the row's
// own logits, since the chain's logit-bias sampler adds the bias again to whichever of them it names.
int32_t pyllama_so_top_candidates(const float * logits, int32_t n, int32_t k, const int32_t * bias_ids,
                                  const float * bias_vals, int32_t n_bias, llama_token_data * out);
