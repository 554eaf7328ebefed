// pyllama_so: C entry points of the CUDA AllReduce paths, for Python.
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
    PYLLAMA_SO_AR_PATH_COUNT    = 4,
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

// Run n_iter reductions of n F32 elements on two devices through a fresh comm context (routed as
// the meta backend's would be, env vars read now), back to back without host synchronization;
// reduction k reads input[i][k*n ...] and its result lands in output[i][k*n ...]. With n_alt > 0,
// odd reductions reduce only their first n_alt elements (the rest of their output is the input).
struct pyllama_so_allreduce_run_params {
    uint64_t      size;
    int32_t       devices[2];
    int64_t       n;
    int32_t       n_iter;
    uint32_t      inactive;  // bit i set: device i's tensor lacks GGML_TENSOR_FLAG_COMPUTE (contributes zeros)
    int64_t       n_alt;     // 0, or 1..n: the size of the odd reductions (sizes alternate)
    const float * input[2];
    float *       output[2];
};

enum pyllama_so_ar_bench_mode {
    PYLLAMA_SO_AR_BENCH_COMM    = 0, // reductions of F32 tensors of n_bytes[k] bytes through a fresh comm context
    PYLLAMA_SO_AR_BENCH_CEILING = 1, // both GPUs copy n_bytes[k] D2H and H2D (pinned) at once: the CE ceiling
};

struct pyllama_so_allreduce_bench_params {
    uint64_t        size;
    int32_t         devices[2];
    int32_t         mode;
    int32_t         n_sizes;
    const int64_t * n_bytes;
    int32_t         n_warmup;
    int32_t         n_iter;
    double *        us_per_iter;      // out, n_sizes entries: mean GPU time per iteration (slower device)
    double *        host_us_per_iter; // out, optional (may be NULL): mean host time to issue one iteration
    double *        queued_us_per_iter; // out, optional (may be NULL), "comm" only: mean GPU time per reduction
                                        // with the reductions queued before the GPUs start them (a delay on
                                        // GPU 0 holds both), so the host's issue time is left out; NaN if the
                                        // host had not queued them all before the delay ended
};

// Return codes of run/bench.
enum pyllama_so_ar_status {
    PYLLAMA_SO_AR_OK             =  0,
    PYLLAMA_SO_AR_EINVAL         = -1, // bad parameters / struct size mismatch
    PYLLAMA_SO_AR_ENODEV         = -2, // device index out of range, or backend init failed
    PYLLAMA_SO_AR_ENOCOMM        = -3, // the CUDA backend created no comm context
    PYLLAMA_SO_AR_EDECLINED      = -4, // the comm context declined a reduction (fallback path)
    PYLLAMA_SO_AR_ENOMEM         = -5, // could not allocate test/bench buffers
    PYLLAMA_SO_AR_EUNSUPPORTED   = -6, // not available on this platform (HIP/MUSA builds)
};

#define PYLLAMA_SO_AR_STATS_NAME       "pyllama_so_allreduce_stats"
#define PYLLAMA_SO_AR_STATS_RESET_NAME "pyllama_so_allreduce_stats_reset"
#define PYLLAMA_SO_AR_RUN_NAME         "pyllama_so_allreduce_run"
#define PYLLAMA_SO_AR_BENCH_NAME       "pyllama_so_allreduce_bench"

typedef int  (*pyllama_so_allreduce_stats_t)(struct pyllama_so_allreduce_stats * out);
typedef void (*pyllama_so_allreduce_stats_reset_t)(void);
typedef int  (*pyllama_so_allreduce_run_t)(const struct pyllama_so_allreduce_run_params * params);
typedef int  (*pyllama_so_allreduce_bench_t)(const struct pyllama_so_allreduce_bench_params * params);

#ifdef __cplusplus
}
#endif
