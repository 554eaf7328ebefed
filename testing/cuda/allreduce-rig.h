#pragma once

// The test harness's AllReduce rig (allreduce-ce-bench.cu, library pyllama-so-allreduce-rig, CUDA builds only):
// reductions of host data and timings through a fresh CUDA comm context on two devices, without a model. Used
// by tests/multi_device/test_allreduce_ce.py and by the AllReduce benchmark (python -m pyllama_so.bench.allreduce) through
// pyllama_so.bench.allreduce_rig; the shipped libraries carry none of it. Every struct starts with `size`,
// which the caller sets to sizeof(struct); a mismatch is refused, not misread.

#include "pyllama-so-allreduce.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Run n_iter reductions of n F32 elements on two devices through a fresh comm context (routed as
// the meta backend's would be, with the settings `allreduce`), back to back without host synchronization;
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
    struct pyllama_so_allreduce_params allreduce; // the comm context's settings; allreduce.size == 0: the defaults
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
    struct pyllama_so_allreduce_params allreduce; // the comm context's settings ("comm"), the chunk size of the
                                                  // copies ("ceiling"); allreduce.size == 0: the defaults
};

// Return codes beyond pyllama-so-allreduce.h's PYLLAMA_SO_AR_OK and PYLLAMA_SO_AR_EINVAL (plain ints, so that
// either kind compares and mixes without an enum mismatch).
#define PYLLAMA_SO_AR_ENODEV       (-2) // device index out of range, or backend init failed
#define PYLLAMA_SO_AR_ENOCOMM      (-3) // the CUDA backend created no comm context
#define PYLLAMA_SO_AR_EDECLINED    (-4) // the comm context declined a reduction (fallback path)
#define PYLLAMA_SO_AR_ENOMEM       (-5) // could not allocate test/bench buffers
#define PYLLAMA_SO_AR_EUNSUPPORTED (-6) // not available on this platform (HIP/MUSA builds)

// PYLLAMA_SO_AR_* status codes.
int pyllama_so_allreduce_run(const struct pyllama_so_allreduce_run_params * params);
int pyllama_so_allreduce_bench(const struct pyllama_so_allreduce_bench_params * params);

#ifdef __cplusplus
}
#endif
