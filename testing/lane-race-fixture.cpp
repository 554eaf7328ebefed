// A ggml-level race fixture for split overlap: state written early and read many subgraphs later, as
// in Gemma-style layers that read another layer's KV cache (with swa_full = false the other lane may
// overwrite those cells in between). No architecture with tensor split in the pinned llama.cpp shares
// KV across layers, so the pattern is built directly on a Meta device over CPU virtual devices.
//
// Each ubatch's graph has n_subgraphs subgraphs, cut by AllReduces as in a transformer (a matrix split
// by its output dimension, then one split by its input dimension: a partial sum):
//   subgraph 0               writes the ubatch's input into the state rows (the KV write)
//   subgraphs 1..n-2         compute without state (FFN-like)
//   subgraph n-1             reads the state rows back (the shared-KV read) into the output
// Every ubatch writes the same rows, so a lane that overwrites them before the other lane has read them
// changes the other lane's output: the cross-lane wait must follow the state from subgraph n-1 of one
// lane to subgraph 0 of the other, which a wait on the same subgraph index misses.

#include "lane-fixtures.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-backend-meta-lanes.h"
#include "ggml-cpp.h"
#include "ggml-cpu-virtual.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t N_EMBD   = 64;
constexpr int64_t N_HIDDEN = 96; // divisible by 2 and 3 devices
constexpr int64_t N_TOK    = 8;

struct split_ud {
    int n_devs;
};

ggml_backend_meta_split_state fixture_split_state(const ggml_tensor * tensor, void * userdata) {
    const int n_devs = ((const split_ud *) userdata)->n_devs;
    ggml_backend_meta_split_state st = {};
    st.n_segments = 1;
    st.nr[0]      = 1;
    const std::string name = tensor->name;
    if (name.rfind("up", 0) == 0 || name.rfind("down", 0) == 0) {
        // up: split by its output dimension (ne1); down: by its input dimension (ne0), a partial sum
        const int axis = name.rfind("up", 0) == 0 ? 1 : 0;
        st.axis = (ggml_backend_meta_split_axis) axis;
        for (int j = 0; j < n_devs; j++) {
            st.ne[j] = tensor->ne[axis] / n_devs;
        }
    } else {
        st.axis = GGML_BACKEND_SPLIT_AXIS_MIRRORED; // the state
    }
    return st;
}

float weight_value(int layer, int64_t i) {
    // small deterministic weights, so that values stay bounded over the layers
    return 0.05f * std::sin(0.37f * (float) (i + 1) + 1.3f * (float) layer);
}

} // namespace

int pyllama_so_testing_lane_race(const int * device_indices, int n_devs, int n_subgraphs, int n_ubatches,
                                 int lanes, int64_t delay_us_lane0, int64_t delay_us_lane1, float * out) {
    if (n_devs < 2 || n_devs > 3 || n_subgraphs < 3 || n_ubatches < 1) {
        return -1;
    }
    std::vector<ggml_backend_dev_t> devs;
    for (int j = 0; j < n_devs; j++) {
        if (device_indices[j] < 0 || (size_t) device_indices[j] >= ggml_backend_dev_count()) {
            return -1;
        }
        devs.push_back(ggml_backend_dev_get(device_indices[j]));
    }
    static split_ud ud_by_n[4] = { {0}, {1}, {2}, {3} }; // the Meta device keeps the pointer
    ggml_backend_dev_t meta_dev = ggml_backend_meta_device(devs.data(), devs.size(), fixture_split_state, &ud_by_n[n_devs]);
    ggml_backend_buffer_type_t meta_buft = ggml_backend_dev_buffer_type(meta_dev);

    // weights (usage WEIGHTS) and the state (usage ANY), as llama.cpp allocates them
    const int n_layers = n_subgraphs; // one up/down pair per subgraph
    ggml_init_params wparams = { (size_t) (2*n_layers + 8)*ggml_tensor_overhead(), nullptr, true };
    ggml_context_ptr wctx(ggml_init(wparams));
    std::vector<ggml_tensor *> up(n_layers), down(n_layers);
    for (int l = 0; l < n_layers; l++) {
        up[l]   = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_F32, N_EMBD, N_HIDDEN);
        down[l] = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_F32, N_HIDDEN, N_EMBD);
        ggml_format_name(up[l],   "up%d",   l);
        ggml_format_name(down[l], "down%d", l);
    }
    ggml_backend_buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors_from_buft(wctx.get(), meta_buft));
    ggml_backend_buffer_set_usage(wbuf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int l = 0; l < n_layers; l++) {
        for (ggml_tensor * t : { up[l], down[l] }) {
            std::vector<float> v(ggml_nelements(t));
            for (size_t i = 0; i < v.size(); i++) {
                v[i] = weight_value(l + (t == down[l] ? 100 : 0), (int64_t) i);
            }
            ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
        }
    }
    ggml_init_params sparams = { 4*ggml_tensor_overhead(), nullptr, true };
    ggml_context_ptr sctx(ggml_init(sparams));
    ggml_tensor * state = ggml_new_tensor_2d(sctx.get(), GGML_TYPE_F32, N_EMBD, N_TOK);
    ggml_set_name(state, "state");
    ggml_backend_buffer_ptr sbuf(ggml_backend_alloc_ctx_tensors_from_buft(sctx.get(), meta_buft));
    ggml_backend_buffer_clear(sbuf.get(), 0);

    // the lanes: a Meta backend and a scheduler each, sharing the weights and the state
    ggml_backend_ptr cpu(ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr));
    ggml_backend_ptr metas[2];
    ggml_backend_sched_ptr scheds[2];
    const int n_lanes = lanes ? 2 : 1;
    for (int l = 0; l < n_lanes; l++) {
        metas[l].reset(ggml_backend_dev_init(meta_dev, nullptr));
    }
    if (lanes && !ggml_backend_meta_share_lanes(metas[0].get(), metas[1].get())) {
        return -2;
    }
    for (int l = 0; l < n_lanes; l++) {
        ggml_backend_t backends[2] = { metas[l].get(), cpu.get() };
        scheds[l].reset(ggml_backend_sched_new(backends, nullptr, 2, 1024, false, true));
    }
    const int64_t delays[2] = { delay_us_lane0, delay_us_lane1 };
    for (int l = 0; l < n_lanes; l++) {
        for (size_t j = 0; j < ggml_backend_meta_n_backends(metas[l].get()); j++) {
            ggml_backend_t simple = ggml_backend_meta_simple_backend(metas[l].get(), j);
            if (ggml_backend_is_cpu_virtual(simple)) {
                ggml_backend_cpu_virtual_set_delay_us(simple, delays[l]);
            }
        }
    }

    std::vector<ggml_context_ptr> gctxs; // kept until the end: queued work still points into the graphs
    for (int u = 0; u < n_ubatches; u++) {
        const int l = u % n_lanes;
        ggml_backend_sched_t sched = scheds[l].get();
        ggml_init_params gparams = { (size_t) (16*n_subgraphs + 16)*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        gctxs.emplace_back(ggml_init(gparams));
        ggml_context * ctx = gctxs.back().get();

        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N_EMBD, N_TOK);
        ggml_set_name(x, "x");
        ggml_set_input(x);
        ggml_cgraph * gf = ggml_new_graph(ctx);

        ggml_tensor * cur = x;
        for (int k = 0; k < n_subgraphs; k++) {
            if (k == 0) {
                ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_scale(ctx, x, 1.0f), state)); // the write
            }
            if (k == n_subgraphs - 1) {
                cur = ggml_add(ctx, cur, state); // the read, many subgraphs after the write
            }
            ggml_tensor * h = ggml_relu(ctx, ggml_mul_mat(ctx, up[k], cur));
            ggml_tensor * y = ggml_mul_mat(ctx, down[k], h); // partial sums: the AllReduce cuts here
            cur = ggml_add(ctx, cur, y);
        }
        ggml_set_output(cur);
        ggml_build_forward_expand(gf, cur);

        ggml_backend_sched_reset(sched); // waits for nothing: the lane's previous inputs were copied in its compute
        if (!ggml_backend_sched_alloc_graph(sched, gf)) {
            return -3;
        }
        std::vector<float> xv(N_EMBD*N_TOK);
        for (size_t i = 0; i < xv.size(); i++) {
            xv[i] = std::cos(0.11f * (float) i + 0.7f * (float) u); // a different input per ubatch
        }
        ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
        if (ggml_backend_sched_graph_compute_async(sched, gf) != GGML_STATUS_SUCCESS) {
            return -4;
        }
        ggml_backend_t out_backend = ggml_backend_sched_get_tensor_backend(sched, cur);
        ggml_backend_tensor_get_async(out_backend, cur, out + (size_t) u*N_EMBD*N_TOK, 0, ggml_nbytes(cur));
    }
    for (int l = 0; l < n_lanes; l++) {
        ggml_backend_sched_synchronize(scheds[l].get());
    }
    return (int) (N_EMBD*N_TOK); // floats per ubatch
}
