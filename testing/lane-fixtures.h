#pragma once

// Fixtures for the split-overlap race tests (tests/multi_device/test_split_overlap.py). Test harness only: built into
// libpyllama-so-testing, never into libllama.

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Delay every graph of one split-overlap lane's CPU virtual devices by delay_us, so that the other lane
// runs ahead and a missing cross-lane wait shows as wrong output instead of a lucky pass. Returns the
// number of devices delayed (0 when the lane does not exist or its devices are not CPU virtual devices).
int pyllama_so_testing_delay_lane(struct llama_context * ctx, int32_t lane, int64_t delay_us);

// Bytes of compute buffers in llama.cpp's memory breakdown of the context (all devices, both lanes).
size_t pyllama_so_testing_compute_bytes(const struct llama_context * ctx);

// Context (KV cache / recurrent state) bytes per buffer type in llama.cpp's memory breakdown: fills up to
// n_out names and sizes, returns the number of buffer types holding context memory. A Meta buffer type
// counts, per buffer, its largest device (the size upstream reports for a Meta buffer).
int pyllama_so_testing_context_bytes(const struct llama_context * ctx, const char ** names, size_t * bytes, int n_out);

// Bytes of one KV cell (the K and V rows of every attention layer) on each device of the model's tensor
// split, as the Meta backend lays out the KV cache tensors (the model's llama_meta_device_get_split_state on
// tensors named and shaped like cache_k_lN / cache_v_lN; a mirrored one, a replicated KV head, counts on
// every device); one entry (everything) when the model is not
// split by tensor. Returns the number of devices, or < 0 (too many devices for n_out, an unexpected split).
// Where the model's tensor split puts the weight `name`: returns its split axis (0..3, or
// GGML_BACKEND_SPLIT_AXIS_MIRRORED/_PARTIAL), ne[j] the size of device j's slice along it (0 unless split),
// *n_dev the number of devices; -1 when the model is not split by tensor, -2 for an unknown tensor or more
// devices than n_out.
int pyllama_so_testing_weight_split(const struct llama_model * model, const char * name, int64_t * ne, int n_out,
                                    int * n_dev);

int pyllama_so_testing_kv_cell_bytes(const struct llama_context * ctx, enum ggml_type type_k, enum ggml_type type_v,
                                     size_t * out, int n_out);

// Run n_ubatches graphs on a Meta device over the given devices (2 or 3 CPU virtual devices), alternating
// between two linked lanes (lanes != 0) or on one Meta backend; each lane's devices are delayed by its
// delay per graph (a delay of lane 1 between one and n_subgraphs - 1 times lane 0's puts lane 1's state
// write between lane 0's write and read unless lane 1 waits). Each graph writes shared state in its first subgraph and reads it back in its
// last (n_subgraphs >= 3). out receives n_ubatches x (returned count) floats; a negative return is an
// error (bad arguments, lanes not linked, allocation or compute failure). See lane-race-fixture.cpp.
int pyllama_so_testing_lane_race(const int * device_indices, int n_devs, int n_subgraphs, int n_ubatches,
                                 int lanes, int64_t delay_us_lane0, int64_t delay_us_lane1, float * out);

#ifdef __cplusplus
}
#endif
