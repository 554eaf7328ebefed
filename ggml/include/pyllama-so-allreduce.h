// pyllama_so: the AllReduce settings of a comm context, and the counters of the CUDA AllReduce paths.
//
// Entry points looked up by name through a backend registry
// (ggml_backend_reg_get_proc_address(reg, NAME)), so that a backend without them simply finds none:
// - the CUDA backend's process-wide counters (PYLLAMA_SO_AR_STATS_NAME, ..._RESET_NAME);
// - for one comm context (the AllReduce context a backend made for a Meta backend, see
//   ggml-backend-meta-comm.h), its settings and its own counters (PYLLAMA_SO_AR_COMM_*_NAME), through the
//   registry of the backend that made it: the CUDA backend, and the CPU virtual devices, which keep the
//   settings and report them but act on none (their one reduction is none of these paths).
// One function linked from ggml-base: pyllama_so_allreduce_resolve, the rule that turns requested settings
// into the ones a comm context uses.
//
// Every struct with `size` is refused, not misread, when the caller's sizeof differs (bindings built
// against another version).

#pragma once

#include "ggml.h"

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

// Return codes (the test harness's AllReduce rig, testing/cuda/allreduce-rig.h, adds -2 to -6).
enum pyllama_so_ar_status {
    PYLLAMA_SO_AR_OK             =  0,
    PYLLAMA_SO_AR_EINVAL         = -1, // bad parameters / struct size mismatch
    PYLLAMA_SO_AR_EBUSY          = -7, // the comm context has reduced already: its settings stay as they are
};

// Built-in defaults and ranges of the settings.
#define PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT (512 * 1024)
#define PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN   (64 * 1024)
#define PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX   (4 * 1024 * 1024) // one copy-engine slot
#define PYLLAMA_SO_AR_LL_MAX_BYTES_DEFAULT (64 * 1024)
#define PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT   (4 * 1024 * 1024)

// Requested settings of a comm context. A field < 0 asks for the default: its environment variable (the
// command line's setting: GGML_CUDA_AR_CE, GGML_CUDA_AR_CE_MIN_BYTES, GGML_CUDA_AR_CE_CHUNK_BYTES,
// GGML_CUDA_AR_LL_MAX_BYTES), else the built-in value.
struct pyllama_so_allreduce_params {
    uint64_t size;
    int32_t  copy_engines; // 0: never; 1: forced, even with peer access; default: automatic (GPUs without peer access)
    int64_t  min_bytes;    // smallest F32 reduction (bytes) for the copy engines, >= 1
    int64_t  chunk_bytes;  // bytes per copy-engine copy, a power of two from ..._CHUNK_BYTES_MIN to _MAX; 0: automatic
    int64_t  ll_max_bytes; // largest F32 reduction for the low-latency path, 0 (never) to ..._LL_MAX_BYTES_LIMIT
};

// The settings a comm context uses.
struct pyllama_so_allreduce_settings {
    int32_t  copy_engines; // -1 automatic, 0 never, 1 forced
    uint64_t min_bytes;
    uint64_t chunk_bytes;  // 0: automatic (1 MiB below 8 MiB of BF16 payload, 2 MiB from there)
    uint64_t ll_max_bytes;
};

// One comm context: its settings, and what it reduced since it was made.
struct pyllama_so_allreduce_report {
    uint64_t                             size;
    struct pyllama_so_allreduce_settings settings;
    int32_t                              ce_enabled; // 1: its large reductions go to the copy engines (settings,
                                                     // two CUDA devices, peer access, GGML_CUDA_ALLREDUCE)
    uint64_t                             calls[PYLLAMA_SO_AR_PATH_COUNT];
    uint64_t                             bytes[PYLLAMA_SO_AR_PATH_COUNT];
    uint64_t                             ce_rounds;
};

#define PYLLAMA_SO_AR_STATS_NAME          "pyllama_so_allreduce_stats"
#define PYLLAMA_SO_AR_STATS_RESET_NAME    "pyllama_so_allreduce_stats_reset"
#define PYLLAMA_SO_AR_COMM_CONFIGURE_NAME "pyllama_so_allreduce_comm_configure"
#define PYLLAMA_SO_AR_COMM_REPORT_NAME    "pyllama_so_allreduce_comm_report"

typedef int  (*pyllama_so_allreduce_stats_t)(struct pyllama_so_allreduce_stats * out);
typedef void (*pyllama_so_allreduce_stats_reset_t)(void);
// Settings for comm_ctx (resolved by pyllama_so_allreduce_resolve); PYLLAMA_SO_AR_EBUSY once it has reduced.
typedef int  (*pyllama_so_allreduce_comm_configure_t)(void * comm_ctx, const struct pyllama_so_allreduce_params * params);
typedef int  (*pyllama_so_allreduce_comm_report_t)(void * comm_ctx, struct pyllama_so_allreduce_report * out);

// params (NULL: every field default) -> the settings: each field as params sets it, else its environment
// variable, else the built-in default (a variable that is no valid value is warned about and ignored).
// PYLLAMA_SO_AR_EINVAL, out untouched, when params->size is wrong or a field is out of range.
GGML_API int pyllama_so_allreduce_resolve(const struct pyllama_so_allreduce_params * params,
                                          struct pyllama_so_allreduce_settings * out);

#ifdef __cplusplus
}
#endif
