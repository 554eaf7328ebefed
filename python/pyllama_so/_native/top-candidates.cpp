#include "top-candidates.h"

#include <algorithm>

int32_t pyllama_so_top_candidates(const float * logits, int32_t n, int32_t k, const int32_t * bias_ids,
                                  const float * bias_vals, int32_t n_bias, llama_token_data * out) {
    if (k <= 0 || k + n_bias >= n) {
        return 0;
    }
    const auto biased = [&](int32_t i) { return n_bias > 0 && std::binary_search(bias_ids, bias_ids + n_bias, i); };
    const auto greater = [](const llama_token_data & a, const llama_token_data & b) { return a.logit > b.logit; };
    int32_t i = 0;
    for (int32_t m = 0; m < k; i++) {
        if (logits[i] != logits[i]) {
            return 0;
        }
        if (!biased(i)) {
            out[m++] = { i, logits[i], 0.0f };
        }
    }
    std::make_heap(out, out + k, greater); // out[0]: the smallest of the k kept so far
    auto offer = [&](int32_t id, float x) {
        if (x > out[0].logit) {
            std::pop_heap(out, out + k, greater);
            out[k - 1] = { id, x, 0.0f };
            std::push_heap(out, out + k, greater);
        }
    };
    auto offer_unbiased = [&](int32_t i) { // a biased token comes later, with its bias
        if (logits[i] > out[0].logit && !biased(i)) {
            offer(i, logits[i]);
        }
    };
    // blocks of 32 that hold nothing above the heap's smallest (nor a NaN) are skipped by one vectorizable
    // test: after the first blocks that is almost all of them
    constexpr int32_t B = 32;
    for (; i + B <= n; i += B) {
        const float thr = out[0].logit;
        int hit = 0;
        for (int32_t j = 0; j < B; j++) {
            const float x = logits[i + j];
            hit |= (x > thr) | (x != x);
        }
        if (hit) {
            for (int32_t j = 0; j < B; j++) {
                if (logits[i + j] != logits[i + j]) {
                    return 0;
                }
                offer_unbiased(i + j);
            }
        }
    }
    for (; i < n; i++) {
        if (logits[i] != logits[i]) {
            return 0;
        }
        offer_unbiased(i);
    }
    for (int32_t b = 0; b < n_bias; b++) {
        const float x = logits[bias_ids[b]] + bias_vals[b];
        if (x != x) {
            return 0;
        }
        offer(bias_ids[b], x);
    }
    const float kth = out[0].logit;
    int32_t n_ge = 0;
    for (int32_t j = 0; j < n; j++) {
        n_ge += logits[j] >= kth;
    }
    for (int32_t b = 0; b < n_bias; b++) { // count the biased tokens by their biased logits
        const float x = logits[bias_ids[b]];
        n_ge += (x + bias_vals[b] >= kth) - (x >= kth);
    }
    if (n_ge != k) {
        return 0; // another entry equals the k-th largest
    }
    std::sort(out, out + k, greater);
    for (int32_t j = 1; j < k; j++) {
        if (out[j].logit == out[j - 1].logit) {
            return 0;
        }
    }
    for (int32_t j = 0; n_bias > 0 && j < k; j++) {
        out[j].logit = logits[out[j].id];
    }
    return k;
}
