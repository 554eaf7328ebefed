#pragma once

// Internal interface between upstream's Meta backend (ggml-backend-meta.cpp, patches/0003-*) and the
// split-overlap lanes (ggml-backend-meta-lanes.cpp). Public API: ggml/include/ggml-backend-meta-lanes.h.

#include "ggml-backend.h"

#include <cstddef>

#define GGML_BACKEND_META_MAX_LANES 2

struct ggml_backend_meta_lanes;

// The lane the calling thread works for: selects a Meta buffer's view containers. 0 outside any scope,
// so code that knows nothing of lanes behaves as upstream.
int ggml_backend_meta_lane_current(void);
int ggml_backend_meta_lane_set(int lane); // returns the previous lane

struct ggml_backend_meta_lane_scope {
    int prev;
    explicit ggml_backend_meta_lane_scope(int lane) : prev(ggml_backend_meta_lane_set(lane)) {}
    ~ggml_backend_meta_lane_scope() { ggml_backend_meta_lane_set(prev); }
    ggml_backend_meta_lane_scope(const ggml_backend_meta_lane_scope &) = delete;
    ggml_backend_meta_lane_scope & operator=(const ggml_backend_meta_lane_scope &) = delete;
};

// A map kept once per lane: each call works on the calling thread's lane's map. The lanes' issue threads
// query the Meta buffers they share (weights, KV cache) at the same time, but the threads of one lane take
// turns (the context flushes a lane's issue thread before it works on that lane, see llama-split-overlap.cpp),
// so a lane's map needs no lock, and a Meta backend without lanes uses the lane 0 map alone, as upstream
// its one map. Holds the split-state cache of a Meta buffer (patches/0003-*).
template <typename map_t>
struct ggml_backend_meta_lane_map {
    map_t per_lane[GGML_BACKEND_META_MAX_LANES];

    map_t & lane() { return per_lane[ggml_backend_meta_lane_current()]; }

    typename map_t::iterator      find(const typename map_t::key_type & key)       { return lane().find(key); }
    typename map_t::iterator      end()                                            { return lane().end(); }
    void                          clear()                                          { lane().clear(); }
    typename map_t::mapped_type & operator[](const typename map_t::key_type & key) { return lane()[key]; }
};

// The lane of the first Meta backend in a scheduler's backend list (0 when none is linked).
int ggml_backend_meta_lanes_sched_lane(ggml_backend_t * backends, int n_backends);

// Implemented in ggml-backend-meta.cpp: the lane fields of a Meta backend's context.
void                      ggml_backend_meta_lanes_attach(ggml_backend_t meta_backend, ggml_backend_meta_lanes * lanes, int lane);
ggml_backend_meta_lanes * ggml_backend_meta_lanes_get   (ggml_backend_t meta_backend, int * lane);

// Hooks called by ggml_backend_meta_graph_compute for a linked backend.
void ggml_backend_meta_lanes_on_rebuild     (ggml_backend_meta_lanes * lanes, int lane, const struct ggml_cgraph * cgraph,
                                             const int * offsets, size_t n_subgraphs);
void ggml_backend_meta_lanes_before_subgraph(ggml_backend_meta_lanes * lanes, int lane, size_t i_subgraph, size_t j_device,
                                             ggml_backend_t simple_backend);
void ggml_backend_meta_lanes_after_subgraph (ggml_backend_meta_lanes * lanes, int lane, size_t i_subgraph, size_t j_device,
                                             ggml_backend_t simple_backend);
void ggml_backend_meta_lanes_detach         (ggml_backend_meta_lanes * lanes, int lane); // also stops the lane's thread

// Called by ggml_backend_meta_graph_compute for a linked backend: runs issue(backend, cgraph) on the
// lane's thread (or here with GGML_META_LANES_THREADS=0). Returns the status of the lane's previous
// graph if that failed, else GGML_STATUS_SUCCESS.
enum ggml_status ggml_backend_meta_lanes_compute(ggml_backend_meta_lanes * lanes, int lane, ggml_backend_t backend,
                                                 struct ggml_cgraph * cgraph,
                                                 enum ggml_status (*issue)(ggml_backend_t, struct ggml_cgraph *));
