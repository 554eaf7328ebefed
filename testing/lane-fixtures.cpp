// Split-overlap race fixtures: see lane-fixtures.h.

#include "lane-fixtures.h"

#include "ggml-backend-impl.h"
#include "llama-ext.h"
#include "ggml-cpu-virtual.h"
#include "pyllama-so-split-overlap.h"

int pyllama_so_testing_delay_lane(struct llama_context * ctx, int32_t lane, int64_t delay_us) {
    ggml_backend_t meta = llama_split_overlap_backend(ctx, lane);
    if (meta == nullptr) {
        return 0;
    }
    int n = 0;
    for (size_t j = 0; j < ggml_backend_meta_n_backends(meta); j++) {
        ggml_backend_t simple = ggml_backend_meta_simple_backend(meta, j);
        if (ggml_backend_is_cpu_virtual(simple)) {
            ggml_backend_cpu_virtual_set_delay_us(simple, delay_us);
            n++;
        }
    }
    return n;
}

size_t pyllama_so_testing_compute_bytes(const struct llama_context * ctx) {
    size_t total = 0;
    for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
        total += data.compute;
    }
    return total;
}
