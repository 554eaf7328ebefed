#pragma once

// CPU virtual devices: N devices backed by host memory and the CPU backend, each backend instance
// with its own worker thread (a stream) and real events, so that multi-device code paths (the Meta
// backend, -sm tensor) run and race as they would on GPUs, without a GPU.
//
// Environment:
//   GGML_CPU_VIRTUAL_DEVICES=N          register N devices when the backend registry is created
//   GGML_CPU_VIRTUAL_THREADS=N          CPU threads per backend instance (default 1)
//   GGML_CPU_VIRTUAL_DELAY_US=N         sleep N microseconds before each graph ...
//   GGML_CPU_VIRTUAL_DELAY_DEVICES=i,j  ... on these device indices only (default: all but device 0)
//   GGML_CPU_VIRTUAL_COMM=0             no comm context: AllReduce takes the Meta backend's generic path
//   GGML_CPU_VIRTUAL_POISON=1           new buffers start as 0xff bytes (F32 NaN), as uninitialised device memory
//                                       may hold anything: a read of memory nothing wrote shows; read per buffer
//
// The test harness can make event waits return at once (a deliberate ordering bug, to show that tests catch
// it) or the devices report no events (what needs them turns off): pyllama-so-test-hooks.h.

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// the registry entry, or NULL while no virtual device exists
GGML_API ggml_backend_reg_t ggml_backend_cpu_virtual_reg(void);

// create n virtual devices and register them, if none exist yet; returns the number of virtual devices
GGML_API size_t ggml_backend_cpu_virtual_init(size_t n);

GGML_API bool ggml_backend_is_cpu_virtual(ggml_backend_t backend);

// the delay before each graph of this backend instance (e.g. of one split-overlap lane), in microseconds
GGML_API void ggml_backend_cpu_virtual_set_delay_us(ggml_backend_t backend, int64_t delay_us);

#ifdef __cplusplus
}
#endif
