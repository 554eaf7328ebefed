// Split-overlap lanes of the Meta backend: cross-lane ordering that follows the state tensors.
// See ggml/include/ggml-backend-meta-lanes.h for the contract and ggml-backend-meta-lanes-impl.h for the
// hooks that patches/0003-* adds to upstream's ggml-backend-meta.cpp.
//
// Each lane issues its graphs on its own thread (see ggml_backend_meta_lanes_compute), so that the thread
// that drives the context builds the next ubatch's graph while the previous one is still being issued.
// The bookkeeping is shared by the two issue threads and guarded by one mutex. A graph is ordered after
// every graph submitted before it on the other lane: before one of its subgraphs waits for the other
// lane's last use of a state tensor, the other lane's earlier graph must have issued (recorded) all of
// its subgraphs that touch that tensor. So every wait targets a record that precedes it in submission
// order, and waits cannot form a cycle.

#include "ggml-backend-meta-lanes.h"
#include "ggml-backend-meta-lanes-impl.h"
#include "pyllama-so-test-hooks.h"

#include "ggml-backend-impl.h"
#include "ggml-impl.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

static thread_local int g_lane_current = 0;

int ggml_backend_meta_lane_current(void) {
    return g_lane_current;
}

int ggml_backend_meta_lane_set(int lane) {
    GGML_ASSERT(lane >= 0 && lane < GGML_BACKEND_META_MAX_LANES);
    const int prev = g_lane_current;
    g_lane_current = lane;
    return prev;
}

namespace {

// The thread that issues a lane's graphs, one at a time, in submission order.
struct lane_worker {
    std::thread                  thread;
    std::mutex                   mutex;
    std::condition_variable      cv;
    std::function<ggml_status()> job;             // set and not taken yet
    bool                         busy    = false; // a job is queued or being issued
    bool                         quit    = false;
    ggml_status                  failure = GGML_STATUS_SUCCESS; // the first failed job's status, until reported

    void run() {
        for (;;) {
            std::function<ggml_status()> next;
            {
                std::unique_lock<std::mutex> lock(mutex);
                cv.wait(lock, [this] { return job || quit; });
                if (!job) {
                    return;
                }
                next = std::move(job);
                job  = nullptr;
            }
            const ggml_status status = next();
            std::lock_guard<std::mutex> lock(mutex);
            if (status != GGML_STATUS_SUCCESS && failure == GGML_STATUS_SUCCESS) {
                failure = status;
            }
            busy = false;
            cv.notify_all();
        }
    }

    void wait_idle() {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [this] { return !busy; });
    }

    ~lane_worker() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            quit = true;
        }
        cv.notify_all();
        if (thread.joinable()) {
            thread.join();
        }
    }
};

struct lane_record {
    ggml_backend_event_t event;
    uint64_t             seq; // position of the record on its lane's stream of that device (1, 2, ...)
};

struct lane_state {
    ggml_backend_t meta = nullptr; // nullptr once the backend is freed

    std::vector<std::vector<const ggml_tensor *>> roots; // per subgraph of the lane's current graph

    // per device
    std::vector<std::vector<ggml_backend_event_t>>                    events;    // [subgraph index], made on first use
    std::vector<std::vector<uint64_t>>                                index_seq; // [subgraph index]: seq of its last record
    std::vector<uint64_t>                                             seq;       // records issued so far
    std::vector<std::unordered_map<const ggml_tensor *, lane_record>> last;      // state root -> last record touching it
    std::vector<uint64_t>                                             waited;    // highest seq of the other lane waited for

    ggml_backend_meta_lanes_stats stats = {};

    // the graph being issued (or the last one): its submission ticket and how far its issue got
    uint64_t ticket      = 0;
    bool     issuing     = false; // submitted and not fully issued
    bool     roots_ready = false; // roots belong to this graph (its rebuild, if any, is done)
    size_t   n_issued    = 0;     // subgraphs issued on every device

    std::unique_ptr<lane_worker> worker; // made on the first graph; none with GGML_META_LANES_THREADS=0
    bool issue_inline = false;           // ggml_backend_meta_lanes_issue_inline: on the calling thread

    void free_events() {
        for (auto & evs : events) {
            for (ggml_backend_event_t ev : evs) {
                if (ev != nullptr) {
                    ggml_backend_event_free(ev);
                }
            }
            evs.clear();
        }
        for (auto & m : last) {
            m.clear();
        }
    }
};

} // namespace

struct ggml_backend_meta_lanes {
    size_t                      n_devs  = 0;
    pyllama_so_test_lanes_order order   = PYLLAMA_SO_TEST_LANES_ORDER_STATE; // another one only from the test harness
    bool                        threads = true; // GGML_META_LANES_THREADS=0: issue on the calling thread
    lane_state      lane[GGML_BACKEND_META_MAX_LANES];

    std::mutex              mutex;   // guards the lane states between the two issue threads
    std::condition_variable cv;      // a lane's issue progressed
    uint64_t                tickets = 0;
};

static bool is_state_root(const ggml_tensor * t) {
    // KV cache and recurrent state: Meta buffers that are neither weights nor compute buffers
    return t != nullptr && t->buffer != nullptr && ggml_backend_buffer_is_meta(t->buffer) &&
        ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_ANY;
}

static const ggml_tensor * root_of(const ggml_tensor * t) {
    return t->view_src != nullptr ? t->view_src : t; // ggml keeps view_src pointing at the root
}

void ggml_backend_meta_lanes_on_rebuild(ggml_backend_meta_lanes * lanes, int lane, const ggml_cgraph * cgraph,
                                        const int * offsets, size_t n_subgraphs) {
    std::lock_guard<std::mutex> lock(lanes->mutex);
    lane_state & ls = lanes->lane[lane];
    ls.roots.assign(n_subgraphs, {});
    for (size_t k = 0; k < n_subgraphs; k++) {
        const int i_stop = k + 1 < n_subgraphs ? offsets[k + 1] : ggml_graph_n_nodes(const_cast<ggml_cgraph *>(cgraph));
        std::vector<const ggml_tensor *> & roots = ls.roots[k];
        for (int i = offsets[k]; i < i_stop; i++) {
            const ggml_tensor * node = ggml_graph_node(const_cast<ggml_cgraph *>(cgraph), i);
            const ggml_tensor * root = root_of(node);
            if (is_state_root(root)) {
                roots.push_back(root);
            }
            for (int s = 0; s < GGML_MAX_SRC; s++) {
                if (node->src[s] != nullptr && is_state_root(root_of(node->src[s]))) {
                    roots.push_back(root_of(node->src[s]));
                }
            }
        }
        std::sort(roots.begin(), roots.end());
        roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
        ls.stats.state_subgraphs += roots.empty() ? 0 : 1;
    }
    for (size_t j = 0; j < lanes->n_devs; j++) {
        if (ls.events[j].size() < n_subgraphs) {
            ls.events[j].resize(n_subgraphs, nullptr);
            ls.index_seq[j].resize(n_subgraphs, 0);
        }
    }
    ls.stats.rebuilds++;
}

// The last subgraph of `ls`'s graph that touches any of `roots` (sorted), -1 if none.
static long last_touching(const lane_state & ls, const std::vector<const ggml_tensor *> & roots) {
    for (long k = (long) ls.roots.size() - 1; k >= 0; k--) {
        const auto & theirs = ls.roots[k];
        auto a = theirs.begin();
        auto b = roots.begin();
        while (a != theirs.end() && b != roots.end()) {
            if (*a == *b) {
                return k;
            }
            if (*a < *b) { ++a; } else { ++b; }
        }
    }
    return -1;
}

void ggml_backend_meta_lanes_before_subgraph(ggml_backend_meta_lanes * lanes, int lane, size_t i_subgraph, size_t j_device,
                                             ggml_backend_t simple_backend) {
    std::unique_lock<std::mutex> lock(lanes->mutex);
    lane_state & self  = lanes->lane[lane];
    lane_state & other = lanes->lane[lane ^ 1];
    if (i_subgraph == 0 && j_device == 0) {
        self.roots_ready = true; // any rebuild of this graph is done
        lanes->cv.notify_all();
    }
    if (i_subgraph >= self.roots.size() || self.roots[i_subgraph].empty() || other.meta == nullptr ||
            lanes->order == PYLLAMA_SO_TEST_LANES_ORDER_NOWAIT) {
        return;
    }
    if (j_device == 0) {
        // the other lane's graph submitted before ours must first issue its subgraphs touching our state;
        // once that holds it holds for the later devices too (n_issued only grows, a newer graph of the
        // other lane has a later ticket), and the other graph's roots do not change while it is issued
        long need = -2; // its last subgraph touching our state, found once its roots are known
        lanes->cv.wait(lock, [&] {
            if (!other.issuing || other.ticket > self.ticket) {
                return true;
            }
            if (!other.roots_ready) {
                return false;
            }
            if (need == -2) {
                need = last_touching(other, self.roots[i_subgraph]);
            }
            return (long) other.n_issued > need;
        });
    }
    lane_record best = { nullptr, 0 };
    if (lanes->order == PYLLAMA_SO_TEST_LANES_ORDER_SAME_INDEX) {
        if (i_subgraph < other.events[j_device].size() && other.events[j_device][i_subgraph] != nullptr) {
            best = { other.events[j_device][i_subgraph], other.index_seq[j_device][i_subgraph] };
        }
    } else {
        // the other lane's stream on this device runs in order: its latest relevant record covers the rest
        const auto & last = other.last[j_device];
        for (const ggml_tensor * root : self.roots[i_subgraph]) {
            const auto it = last.find(root);
            if (it != last.end() && it->second.seq > best.seq) {
                best = it->second;
            }
        }
    }
    if (best.event == nullptr) {
        return;
    }
    if (best.seq <= self.waited[j_device]) {
        self.stats.waits_skipped++;
        return;
    }
    // under the lock: the other lane cannot record this event again before the wait has taken it
    ggml_backend_event_wait(simple_backend, best.event);
    self.waited[j_device] = best.seq;
    self.stats.waits++;
}

void ggml_backend_meta_lanes_after_subgraph(ggml_backend_meta_lanes * lanes, int lane, size_t i_subgraph, size_t j_device,
                                            ggml_backend_t simple_backend) {
    std::lock_guard<std::mutex> lock(lanes->mutex);
    lane_state & self = lanes->lane[lane];
    if (j_device + 1 == lanes->n_devs) {
        self.n_issued = i_subgraph + 1; // after this call: the record below is issued
        lanes->cv.notify_all();
    }
    if (i_subgraph >= self.roots.size() || self.roots[i_subgraph].empty()) {
        return;
    }
    ggml_backend_event_t & ev = self.events[j_device][i_subgraph];
    if (ev == nullptr) {
        ev = ggml_backend_event_new(ggml_backend_get_device(simple_backend));
        GGML_ASSERT(ev != nullptr); // share_lanes checked that the device has events
    }
    ggml_backend_event_record(ev, simple_backend);
    const uint64_t seq = ++self.seq[j_device];
    self.index_seq[j_device][i_subgraph] = seq;
    for (const ggml_tensor * root : self.roots[i_subgraph]) {
        self.last[j_device][root] = { ev, seq };
    }
    self.stats.records++;
}

ggml_status ggml_backend_meta_lanes_compute(ggml_backend_meta_lanes * lanes, int lane, ggml_backend_t backend,
                                           ggml_cgraph * cgraph, ggml_status (*issue)(ggml_backend_t, ggml_cgraph *)) {
    lane_state & self = lanes->lane[lane];
    const bool threaded = lanes->threads && !self.issue_inline;
    if (threaded && !self.worker) {
        self.worker = std::make_unique<lane_worker>();
        self.worker->thread = std::thread([w = self.worker.get()] { w->run(); });
    }
    ggml_status failure = GGML_STATUS_SUCCESS;
    if (self.worker) {
        self.worker->wait_idle(); // one graph at a time per lane
        std::lock_guard<std::mutex> lock(self.worker->mutex);
        std::swap(failure, self.worker->failure);
    }
    {
        std::lock_guard<std::mutex> lock(lanes->mutex);
        self.ticket      = ++lanes->tickets;
        self.issuing     = true;
        self.roots_ready = false;
        self.n_issued    = 0;
    }
    auto job = [lanes, lane, backend, cgraph, issue] {
        const ggml_status status = issue(backend, cgraph);
        std::lock_guard<std::mutex> lock(lanes->mutex);
        lanes->lane[lane].issuing = false;
        lanes->cv.notify_all();
        return status;
    };
    if (!threaded) {
        const ggml_status status = job();
        return failure != GGML_STATUS_SUCCESS ? failure : status;
    }
    {
        std::lock_guard<std::mutex> lock(self.worker->mutex);
        self.worker->job  = std::move(job);
        self.worker->busy = true;
    }
    self.worker->cv.notify_all();
    // the graph is issued asynchronously: a failure is returned by the next graph of this lane
    return failure;
}

void ggml_backend_meta_lanes_detach(ggml_backend_meta_lanes * lanes, int lane) {
    lanes->lane[lane].worker.reset(); // issues what is queued, then stops
    lanes->lane[lane].free_events();
    lanes->lane[lane].meta = nullptr;
    bool any = false;
    for (const lane_state & ls : lanes->lane) {
        any = any || ls.meta != nullptr;
    }
    if (!any) {
        delete lanes;
    }
}

// The lanes a backend is linked to and its lane there; nullptr for any other backend (or nullptr).
static ggml_backend_meta_lanes * linked_lanes(ggml_backend_t backend, int * lane) {
    *lane = 0;
    return backend != nullptr && ggml_backend_is_meta(backend) ? ggml_backend_meta_lanes_get(backend, lane) : nullptr;
}

int ggml_backend_meta_lanes_sched_lane(ggml_backend_t * backends, int n_backends) {
    for (int i = 0; i < n_backends; i++) {
        if (ggml_backend_is_meta(backends[i])) {
            int lane = 0;
            return linked_lanes(backends[i], &lane) != nullptr ? lane : 0;
        }
    }
    return 0;
}

static bool devices_have_events(ggml_backend_t meta) {
    for (size_t j = 0; j < ggml_backend_meta_n_backends(meta); j++) {
        ggml_backend_dev_t dev = ggml_backend_get_device(ggml_backend_meta_simple_backend(meta, j));
        ggml_backend_dev_props props;
        ggml_backend_dev_get_props(dev, &props);
        if (!props.caps.events) {
            return false;
        }
        ggml_backend_event_t probe = ggml_backend_event_new(dev);
        if (probe == nullptr) {
            return false;
        }
        ggml_backend_event_free(probe);
    }
    return true;
}

bool ggml_backend_meta_share_lanes(ggml_backend_t a, ggml_backend_t b) {
    if (!ggml_backend_is_meta(a) || !ggml_backend_is_meta(b) || a == b) {
        GGML_LOG_DEBUG("%s: lanes need two distinct Meta backends\n", __func__);
        return false;
    }
    if (ggml_backend_meta_lanes_get(a, nullptr) != nullptr || ggml_backend_meta_lanes_get(b, nullptr) != nullptr) {
        GGML_LOG_DEBUG("%s: a backend is already linked to another lane\n", __func__);
        return false;
    }
    const size_t n_devs = ggml_backend_meta_n_backends(a);
    bool same_devices = n_devs == ggml_backend_meta_n_backends(b);
    for (size_t j = 0; same_devices && j < n_devs; j++) {
        same_devices = ggml_backend_get_device(ggml_backend_meta_simple_backend(a, j)) ==
                       ggml_backend_get_device(ggml_backend_meta_simple_backend(b, j));
    }
    if (!same_devices) {
        GGML_LOG_DEBUG("%s: the two Meta backends are not on the same devices\n", __func__);
        return false;
    }
    if (!devices_have_events(a)) {
        GGML_LOG_DEBUG("%s: a device has no events, lanes stay off\n", __func__);
        return false;
    }

    auto * lanes = new ggml_backend_meta_lanes;
    lanes->n_devs = n_devs;
    switch (pyllama_so_test_hook(PYLLAMA_SO_TEST_HOOK_META_LANES_ORDER)) { // the test harness breaking it on purpose
        case PYLLAMA_SO_TEST_LANES_ORDER_NOWAIT:     lanes->order = PYLLAMA_SO_TEST_LANES_ORDER_NOWAIT;     break;
        case PYLLAMA_SO_TEST_LANES_ORDER_SAME_INDEX: lanes->order = PYLLAMA_SO_TEST_LANES_ORDER_SAME_INDEX; break;
        default:                                     break;
    }
    const char * threads = getenv("GGML_META_LANES_THREADS");
    lanes->threads = threads == nullptr || strcmp(threads, "0") != 0;
    ggml_backend_t metas[GGML_BACKEND_META_MAX_LANES] = { a, b };
    for (int l = 0; l < GGML_BACKEND_META_MAX_LANES; l++) {
        lane_state & ls = lanes->lane[l];
        ls.meta = metas[l];
        ls.events.resize(n_devs);
        ls.index_seq.resize(n_devs);
        ls.seq.assign(n_devs, 0);
        ls.last.resize(n_devs);
        ls.waited.assign(n_devs, 0);
        ls.stats.size = sizeof(ggml_backend_meta_lanes_stats);
        ggml_backend_meta_lanes_attach(metas[l], lanes, l);
    }
    return true;
}

int ggml_backend_meta_lane(ggml_backend_t meta_backend) {
    int lane = 0;
    return linked_lanes(meta_backend, &lane) != nullptr ? lane : -1;
}

void ggml_backend_meta_lanes_flush(ggml_backend_t meta_backend) {
    int lane = 0;
    ggml_backend_meta_lanes * lanes = linked_lanes(meta_backend, &lane);
    if (lanes != nullptr && lanes->lane[lane].worker) {
        lanes->lane[lane].worker->wait_idle();
    }
}

void ggml_backend_meta_lanes_issue_inline(ggml_backend_t meta_backend, bool on) {
    int lane = 0;
    ggml_backend_meta_lanes * lanes = linked_lanes(meta_backend, &lane);
    if (lanes != nullptr) {
        lanes->lane[lane].issue_inline = on;
    }
}

bool ggml_backend_meta_lanes_get_stats(ggml_backend_t meta_backend, ggml_backend_meta_lanes_stats * stats) {
    int lane = 0;
    ggml_backend_meta_lanes * lanes = linked_lanes(meta_backend, &lane);
    if (stats == nullptr || stats->size != sizeof(ggml_backend_meta_lanes_stats) || lanes == nullptr) {
        return false;
    }
    std::lock_guard<std::mutex> lock(lanes->mutex);
    *stats = lanes->lane[lane].stats;
    return true;
}
