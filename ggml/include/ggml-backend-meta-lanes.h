#pragma once

// Split overlap: two Meta backends ("lanes") on the same devices, sharing the weight and state buffers
// (KV cache, recurrent state), so that one lane's AllReduces run while the other lane computes.
//
// ggml_backend_meta_share_lanes(a, b) links two Meta backends of one Meta device. From then on, each
// time a graph is (re)built, every subgraph records the state tensors it reads or writes (tensors whose
// root lies in a Meta buffer that is neither a weights nor a compute buffer). Before a subgraph runs on
// a device, that device's stream waits (by event) for the subgraphs of the other lane that last touched
// any of those tensors, from any earlier graph and at any subgraph index; the other lane's AllReduces
// are not waited for. Subgraphs without state neither wait nor record. Each lane keeps its own views of
// the shared buffers, so a rebuild on one lane never invalidates the other lane's graph.
//
// The test harness can break the ordering on purpose (no cross-lane waits, or waits for the other lane's
// subgraph of the same index only), to show that the tests catch it: pyllama-so-test-hooks.h, asked by
// ggml_backend_meta_share_lanes.

#include "ggml-backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Link two Meta backends of the same Meta device as lanes 0 (a) and 1 (b). Returns false if they are
// not two distinct unlinked Meta backends of one device, or if a device has no events; the backends
// then stay independent. The reason is logged at debug level: the caller says what it gives up (llama's
// split overlap warns once, "split overlap stays off: <reason>").
GGML_API bool ggml_backend_meta_share_lanes(ggml_backend_t a, ggml_backend_t b);

// Each linked lane issues its graphs on its own thread: ggml_backend_graph_compute_async returns once the
// graph is queued, and the lane's other operations (tensor copies, synchronize) first wait for the queued
// graph to be issued. Returns once everything submitted to this lane has been issued to the devices (not
// executed); a no-op for other backends. GGML_META_LANES_THREADS=0 issues on the calling thread instead.
GGML_API void ggml_backend_meta_lanes_flush(ggml_backend_t meta_backend);

// Issue the lane's next graphs on the calling thread (on) or on the lane's thread (off, the default):
// for small graphs, such as decoding one token, the hand-over costs more than the overlap gains.
GGML_API void ggml_backend_meta_lanes_issue_inline(ggml_backend_t meta_backend, bool on);

// The lane of a linked Meta backend (0 or 1), -1 if it is not linked.
GGML_API int ggml_backend_meta_lane(ggml_backend_t meta_backend);

struct ggml_backend_meta_lanes_stats {
    size_t   size;             // set to sizeof(struct ggml_backend_meta_lanes_stats) by the caller
    uint64_t rebuilds;         // graphs this lane (re)built
    uint64_t state_subgraphs;  // subgraphs with state, summed over the rebuilds
    uint64_t records;          // events recorded after a subgraph with state (all devices)
    uint64_t waits;            // event waits on the other lane issued (all devices)
    uint64_t waits_skipped;    // waits not issued because an earlier wait already covered them
};

// Counters of one linked lane since it was linked; false if the backend is not linked or size is wrong.
GGML_API bool ggml_backend_meta_lanes_get_stats(ggml_backend_t meta_backend, struct ggml_backend_meta_lanes_stats * stats);

#ifdef __cplusplus
}
#endif
