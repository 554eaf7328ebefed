// pyllama_so: C entry points of the CUDA AllReduce paths, for Python: the counters.
//
// Nothing here is linked directly: each function is looked up by name through the CUDA backend
// registry (ggml_backend_reg_get_proc_address(ggml_backend_reg_by_name("CUDA"), NAME)), so a build
// without CUDA simply finds none of them. Every struct starts with `size`, which the caller sets to
// sizeof(struct); a mismatch (bindings built against another version) is refused, not misread.

#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Where a reduction of the CUDA comm context ran.
enum pyllama_so_ar_path {
    PYLLAMA_SO_AR_PATH_CE       = 0, // copy engines through pinned host memory (allreduce-ce.cu)
    PYLLAMA_SO_AR_PATH_NCCL     = 1,
    PYLLAMA_SO_AR_PATH_INTERNAL = 2, // upstream's internal 2-GPU pipeline (allreduce.cu)
    PYLLAMA_SO_AR_PATH_FALLBACK = 3, // declined: the meta backend's generic reduction ran instead
    PYLLAMA_SO_AR_PATH_LL       = 4, // low latency: data and flags in one store, for small reductions (allreduce-ll.cu)
    PYLLAMA_SO_AR_PATH_COUNT    = 5,
};

// Process-wide counters, summed over all comm contexts.
struct pyllama_so_allreduce_stats {
    uint64_t size;
    uint64_t calls[PYLLAMA_SO_AR_PATH_COUNT];
    uint64_t bytes[PYLLAMA_SO_AR_PATH_COUNT];  // ggml_nbytes of one device's tensor, per call
    uint64_t ce_rounds;                        // slot-sized pieces moved by the copy engines
    uint64_t ce_buffer_allocs;                 // comm contexts that allocated CE buffers
    uint64_t ce_alloc_failures;                // ... and that failed to (then NCCL/internal took over)
};

// Return codes (the test harness's AllReduce rig, testing/cuda/allreduce-rig.h, adds its own).
enum pyllama_so_ar_status {
    PYLLAMA_SO_AR_OK             =  0,
    PYLLAMA_SO_AR_EINVAL         = -1, // bad parameters / struct size mismatch
};

#define PYLLAMA_SO_AR_STATS_NAME       "pyllama_so_allreduce_stats"
#define PYLLAMA_SO_AR_STATS_RESET_NAME "pyllama_so_allreduce_stats_reset"

typedef int  (*pyllama_so_allreduce_stats_t)(struct pyllama_so_allreduce_stats * out);
typedef void (*pyllama_so_allreduce_stats_reset_t)(void);

#ifdef __cplusplus
}
#endif
