#pragma once

// The comm context of a Meta backend: the AllReduce context that the backend of its devices made when the Meta
// backend was created (upstream's ggml_backend_comm_init), which the Meta backend hands every reduction first.
// Its registry's entry points (ggml_backend_reg_get_proc_address) serve it: pyllama-so-allreduce.h names the
// ones that set and report its AllReduce settings. Implemented in ggml-backend-meta.cpp (patches/0015-*).

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// NULL when the devices' backend made none (every reduction then takes the Meta backend's generic path). *reg
// (if reg is not NULL) is set to the registry of the devices' backend either way.
GGML_API void * ggml_backend_meta_comm_context(ggml_backend_t meta_backend, ggml_backend_reg_t * reg);

#ifdef __cplusplus
}
#endif
