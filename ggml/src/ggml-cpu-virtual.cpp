// CPU virtual devices: see ggml-cpu-virtual.h.
//
// Every backend instance owns a worker thread that runs its graphs, copies and set/get calls in
// submission order, as a GPU stream does. Graphs are computed by a private CPU backend, so results
// equal the CPU's. Events are counters that the streams advance and wait on.

#include "ggml-cpu-virtual.h"
#include "ggml-backend-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "pyllama-so-allreduce.h"
#include "pyllama-so-test-hooks.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#define GGML_CPU_VIRTUAL_MAX_DEVICES 16
#define GGML_CPU_VIRTUAL_ALIGNMENT   64

static int env_int(const char * name, int def) {
    const char * s = getenv(name);
    return s && *s ? atoi(s) : def;
}

// GGML_CPU_VIRTUAL_DEVICES: a value that is not a count is said, not ignored silently
static size_t ggml_cpu_virtual_parse_env_devices() {
    const char * s = getenv("GGML_CPU_VIRTUAL_DEVICES");
    if (s == nullptr || *s == '\0') {
        return 0;
    }
    char * end = nullptr;
    const long long v = strtoll(s, &end, 10); // out of range: LLONG_MAX, capped when the devices are made
    if (end == s || *end != '\0' || v < 0) {
        GGML_LOG_WARN("%s: GGML_CPU_VIRTUAL_DEVICES=%s is not a count >= 0: using 0 (no virtual devices)\n",
                __func__, s);
        return 0;
    }
    return (size_t) v;
}

// read once, so that a bad value is warned about once
static size_t ggml_cpu_virtual_env_devices() {
    static const size_t n = ggml_cpu_virtual_parse_env_devices();
    return n;
}

// streams

struct ggml_cpu_virtual_stream {
    std::mutex                        mtx;
    std::condition_variable           cv;
    std::deque<std::function<void()>> tasks;
    bool                              busy = false;
    bool                              stop = false;
    const bool                        broken_wait; // its event waits do not wait: only the test harness asks for it
    std::thread                       worker;

    explicit ggml_cpu_virtual_stream(bool broken_wait) : broken_wait(broken_wait), worker([this] { run(); }) {}

    ~ggml_cpu_virtual_stream() {
        {
            std::lock_guard<std::mutex> lock(mtx);
            stop = true;
        }
        cv.notify_all();
        worker.join();
    }

    void run() {
        std::unique_lock<std::mutex> lock(mtx);
        while (true) {
            cv.wait(lock, [this] { return stop || !tasks.empty(); });
            if (tasks.empty()) {
                return; // stop, and nothing left to run
            }
            std::function<void()> task = std::move(tasks.front());
            tasks.pop_front();
            busy = true;
            lock.unlock();
            task();
            lock.lock();
            busy = false;
            cv.notify_all();
        }
    }

    void push(std::function<void()> task) {
        {
            std::lock_guard<std::mutex> lock(mtx);
            tasks.push_back(std::move(task));
        }
        cv.notify_all();
    }

    void drain() {
        std::unique_lock<std::mutex> lock(mtx);
        cv.wait(lock, [this] { return tasks.empty() && !busy; });
    }
};

// events: n_recorded counts record calls, n_done the records that their stream has reached. Queued
// tasks hold a reference, so an event may be freed while its records and waits are still queued.

struct ggml_cpu_virtual_event : std::enable_shared_from_this<ggml_cpu_virtual_event> {
    std::mutex              mtx;
    std::condition_variable cv;
    uint64_t                n_recorded = 0;
    uint64_t                n_done     = 0;

    void record(ggml_cpu_virtual_stream & stream) {
        uint64_t target;
        {
            std::lock_guard<std::mutex> lock(mtx);
            target = ++n_recorded;
        }
        stream.push([self = shared_from_this(), target] {
            {
                std::lock_guard<std::mutex> lock(self->mtx);
                self->n_done = std::max(self->n_done, target);
            }
            self->cv.notify_all();
        });
    }

    // block until the last record made before this call has been reached
    void wait_host(uint64_t target) {
        std::unique_lock<std::mutex> lock(mtx);
        cv.wait(lock, [this, target] { return n_done >= target; });
    }

    uint64_t last_recorded() {
        std::lock_guard<std::mutex> lock(mtx);
        return n_recorded;
    }

    // make the stream wait for the last record made before this call
    void wait_on(ggml_cpu_virtual_stream & stream) {
        if (stream.broken_wait) {
            return; // the bug the test harness asked for
        }
        uint64_t target;
        {
            std::lock_guard<std::mutex> lock(mtx);
            if (n_done >= n_recorded) {
                return; // already reached: nothing to wait for
            }
            target = n_recorded;
        }
        stream.push([self = shared_from_this(), target] { self->wait_host(target); });
    }
};

using ggml_cpu_virtual_event_ptr = std::shared_ptr<ggml_cpu_virtual_event>;

// devices, buffers

struct ggml_cpu_virtual_device_context {
    int                              index;
    std::string                      name;
    std::string                      description;
    ggml_backend_buffer_type         buft;
};

static const char * ggml_cpu_virtual_buffer_type_get_name(ggml_backend_buffer_type_t buft) {
    return ((ggml_cpu_virtual_device_context *) buft->context)->name.c_str();
}

static bool ggml_cpu_virtual_buffer_is_ours(ggml_backend_buffer_t buffer) {
    return buffer != nullptr && buffer->buft != nullptr &&
           buffer->buft->iface.get_name == ggml_cpu_virtual_buffer_type_get_name;
}

// a host source never gets here: ggml_backend_tensor_copy sets it with set_tensor instead
static bool ggml_cpu_virtual_buffer_cpy_tensor(ggml_backend_buffer_t buffer, const ggml_tensor * src, ggml_tensor * dst) {
    if (ggml_cpu_virtual_buffer_is_ours(src->buffer)) {
        memcpy(dst->data, src->data, ggml_nbytes(src));
        return true;
    }
    return false;
    GGML_UNUSED(buffer);
}

// upstream's CPU buffer, typed as ours (not host memory) and copying only from our buffers; with
// GGML_CPU_VIRTUAL_POISON=1 its bytes start as 0xff (NaN as F32), so that a read of memory nothing wrote
// shows in the results instead of depending on what the allocator hands out
static ggml_backend_buffer_t ggml_cpu_virtual_buffer_type_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size);
    if (buffer == nullptr) {
        return nullptr;
    }
    if (env_int("GGML_CPU_VIRTUAL_POISON", 0) != 0) {
        memset(ggml_backend_buffer_get_base(buffer), 0xff, ggml_backend_buffer_get_size(buffer));
    }
    buffer->buft             = buft;
    buffer->iface.cpy_tensor = ggml_cpu_virtual_buffer_cpy_tensor;
    return buffer;
}

static size_t ggml_cpu_virtual_buffer_type_get_alignment(ggml_backend_buffer_type_t buft) {
    return GGML_CPU_VIRTUAL_ALIGNMENT;
    GGML_UNUSED(buft);
}

// not host memory as far as ggml is concerned: like a GPU's, it is reached through set/get/copy
static bool ggml_cpu_virtual_buffer_type_is_host(ggml_backend_buffer_type_t buft) {
    return false;
    GGML_UNUSED(buft);
}

static const ggml_backend_buffer_type_i ggml_cpu_virtual_buffer_type_i = {
    /* .get_name       = */ ggml_cpu_virtual_buffer_type_get_name,
    /* .alloc_buffer   = */ ggml_cpu_virtual_buffer_type_alloc_buffer,
    /* .get_alignment  = */ ggml_cpu_virtual_buffer_type_get_alignment,
    /* .get_max_size   = */ nullptr,
    /* .get_alloc_size = */ nullptr,
    /* .is_host        = */ ggml_cpu_virtual_buffer_type_is_host,
};

// backends

struct ggml_cpu_virtual_backend_context {
    ggml_backend_t                    cpu;          // used by the worker thread only
    int64_t                           delay_us;
    std::unique_ptr<ggml_cpu_virtual_stream> stream; // declared last: joined first
};

static ggml_cpu_virtual_backend_context * vctx(ggml_backend_t backend) {
    return (ggml_cpu_virtual_backend_context *) backend->context;
}

static const char * ggml_cpu_virtual_backend_get_name(ggml_backend_t backend) {
    return ggml_backend_dev_name(backend->device);
}

static void ggml_cpu_virtual_backend_free(ggml_backend_t backend) {
    ggml_cpu_virtual_backend_context * ctx = vctx(backend);
    ctx->stream.reset(); // runs what is queued, then joins
    ggml_backend_free(ctx->cpu);
    delete ctx;
    delete backend;
}

static void ggml_cpu_virtual_backend_set_tensor_async(ggml_backend_t backend, ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    // the caller may reuse its memory once this returns, as with a pageable cudaMemcpyAsync
    auto staged = std::make_shared<std::vector<uint8_t>>((const uint8_t *) data, (const uint8_t *) data + size);
    char * dst = (char *) tensor->data + offset;
    vctx(backend)->stream->push([staged, dst] { memcpy(dst, staged->data(), staged->size()); });
}

static void ggml_cpu_virtual_backend_get_tensor_async(ggml_backend_t backend, const ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    const char * src = (const char *) tensor->data + offset;
    vctx(backend)->stream->push([src, data, size] { memcpy(data, src, size); });
}

// reached through backend_dst's interface, so only the source needs checking
static bool ggml_cpu_virtual_backend_cpy_tensor_async(ggml_backend_t backend_src, ggml_backend_t backend_dst, const ggml_tensor * src, ggml_tensor * dst) {
    if (!ggml_backend_is_cpu_virtual(backend_src) ||
            !ggml_cpu_virtual_buffer_is_ours(src->buffer) || !ggml_cpu_virtual_buffer_is_ours(dst->buffer) ||
            !ggml_is_contiguous(src) || !ggml_is_contiguous(dst)) {
        return false;
    }
    // ggml_backend_tensor_copy_async: the copy happens after everything queued on both backends. So the source
    // stream first waits for what the destination stream has queued (it may still read or write dst: the
    // Meta backend's generic AllReduce copies into a buffer that the destination's previous ADD still reads),
    // then copies, and the destination stream waits for the copy.
    const void * src_data = src->data;
    void *       dst_data = dst->data;
    const size_t nbytes   = ggml_nbytes(src);
    ggml_cpu_virtual_stream & stream_src = *vctx(backend_src)->stream;
    ggml_cpu_virtual_stream & stream_dst = *vctx(backend_dst)->stream;
    if (&stream_src != &stream_dst) {
        auto dst_queued = std::make_shared<ggml_cpu_virtual_event>();
        dst_queued->record(stream_dst);
        dst_queued->wait_on(stream_src);
    }
    auto copied = std::make_shared<ggml_cpu_virtual_event>();
    stream_src.push([src_data, dst_data, nbytes] { memcpy(dst_data, src_data, nbytes); });
    copied->record(stream_src);
    copied->wait_on(stream_dst);
    return true;
}

static void ggml_cpu_virtual_backend_synchronize(ggml_backend_t backend) {
    vctx(backend)->stream->drain();
}

// A snapshot of the graph's nodes and their sources: callers (the Meta backend) rewrite their
// auxiliary tensors on the next call, possibly before this stream has reached the graph.
// The copy has its own hash set with the source's use counts (the CPU backend's fusion reads them,
// and the caller refills its own set for the next graph).
struct ggml_cpu_virtual_graph_copy {
    std::vector<ggml_tensor>   tensors;
    std::vector<ggml_tensor *> nodes;
    ggml_hash_set              hash;
    std::vector<int32_t>       use_counts;
    ggml_cgraph                graph;

    explicit ggml_cpu_virtual_graph_copy(const ggml_cgraph * src) {
        const int n_nodes = src->n_nodes;
        std::unordered_map<const ggml_tensor *, size_t> index;
        index.reserve(2 * (size_t) n_nodes);
        for (int i = 0; i < n_nodes; i++) {
            index.emplace(src->nodes[i], i);
        }
        for (int i = 0; i < n_nodes; i++) {
            for (int s = 0; s < GGML_MAX_SRC; s++) {
                const ggml_tensor * t = src->nodes[i]->src[s];
                if (t != nullptr && index.find(t) == index.end()) {
                    index.emplace(t, index.size());
                }
            }
        }
        tensors.resize(index.size()); // no reallocation below: pointers into it stay valid
        for (const auto & it : index) {
            tensors[it.second] = *it.first;
        }
        for (auto & t : tensors) {
            for (int s = 0; s < GGML_MAX_SRC; s++) {
                if (t.src[s] != nullptr) {
                    auto it = index.find(t.src[s]);
                    if (it != index.end()) {
                        t.src[s] = &tensors[it->second];
                    }
                }
            }
        }
        nodes.resize(n_nodes);
        hash = ggml_hash_set_new(n_nodes);
        use_counts.assign(hash.size, 0);
        for (int i = 0; i < n_nodes; i++) {
            nodes[i] = &tensors[i];
            use_counts[ggml_hash_insert(&hash, nodes[i])] = ggml_node_get_use_count(src, i);
        }
        graph                  = *src;
        graph.grads            = nullptr; // indexed by the original hash set; the CPU backend does not read them
        graph.grad_accs        = nullptr;
        graph.nodes            = nodes.data();
        graph.n_nodes          = n_nodes;
        graph.size             = n_nodes;
        graph.leafs            = nullptr;
        graph.n_leafs          = 0;
        graph.visited_hash_set = hash;
        graph.use_counts       = use_counts.data();
    }

    ~ggml_cpu_virtual_graph_copy() {
        ggml_hash_set_free(&hash);
    }

    ggml_cpu_virtual_graph_copy(const ggml_cpu_virtual_graph_copy &) = delete;
    ggml_cpu_virtual_graph_copy & operator=(const ggml_cpu_virtual_graph_copy &) = delete;
};

static ggml_status ggml_cpu_virtual_backend_graph_compute(ggml_backend_t backend, ggml_cgraph * cgraph) {
    ggml_cpu_virtual_backend_context * ctx = vctx(backend);
    auto copy = std::make_shared<ggml_cpu_virtual_graph_copy>(cgraph);
    ggml_backend_t cpu      = ctx->cpu;
    const int64_t  delay_us = ctx->delay_us;
    ctx->stream->push([copy, cpu, delay_us] {
        if (delay_us > 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        }
        const ggml_status status = ggml_backend_graph_compute(cpu, &copy->graph);
        if (status != GGML_STATUS_SUCCESS) {
            GGML_ABORT("%s: graph compute failed with status %d", __func__, (int) status);
        }
    });
    return GGML_STATUS_SUCCESS;
}

static ggml_cpu_virtual_event & ggml_cpu_virtual_event_of(ggml_backend_event_t event) {
    return **(ggml_cpu_virtual_event_ptr *) event->context;
}

static void ggml_cpu_virtual_backend_event_record(ggml_backend_t backend, ggml_backend_event_t event) {
    ggml_cpu_virtual_event_of(event).record(*vctx(backend)->stream);
}

static void ggml_cpu_virtual_backend_event_wait(ggml_backend_t backend, ggml_backend_event_t event) {
    ggml_cpu_virtual_event_of(event).wait_on(*vctx(backend)->stream);
}

static const ggml_backend_i ggml_cpu_virtual_backend_i = {
    /* .get_name            = */ ggml_cpu_virtual_backend_get_name,
    /* .free                = */ ggml_cpu_virtual_backend_free,
    /* .set_tensor_async    = */ ggml_cpu_virtual_backend_set_tensor_async,
    /* .get_tensor_async    = */ ggml_cpu_virtual_backend_get_tensor_async,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ ggml_cpu_virtual_backend_cpy_tensor_async,
    /* .synchronize         = */ ggml_cpu_virtual_backend_synchronize,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ ggml_cpu_virtual_backend_graph_compute,
    /* .event_record        = */ ggml_cpu_virtual_backend_event_record,
    /* .event_wait          = */ ggml_cpu_virtual_backend_event_wait,
    /* .graph_optimize      = */ nullptr,
};

static ggml_guid_t ggml_cpu_virtual_guid(void) {
    static ggml_guid guid = { 0x5c, 0x7a, 0x31, 0x0e, 0x92, 0x4b, 0x4d, 0x1f, 0xa8, 0x66, 0x2b, 0xd0, 0x13, 0x57, 0xe9, 0xc4 };
    return &guid;
}

bool ggml_backend_is_cpu_virtual(ggml_backend_t backend) {
    return backend != nullptr && ggml_guid_matches(backend->guid, ggml_cpu_virtual_guid());
}

void ggml_backend_cpu_virtual_set_delay_us(ggml_backend_t backend, int64_t delay_us) {
    GGML_ASSERT(ggml_backend_is_cpu_virtual(backend));
    vctx(backend)->delay_us = std::max<int64_t>(0, delay_us); // read when a graph is queued, on the caller's thread
}

static bool ggml_cpu_virtual_delay_selected(int index) {
    const char * sel = getenv("GGML_CPU_VIRTUAL_DELAY_DEVICES");
    if (sel == nullptr || *sel == '\0') {
        return index != 0; // device 0 runs ahead of the others
    }
    for (const char * p = sel; *p;) {
        char * end = nullptr;
        const long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (v == index) {
            return true;
        }
        p = end;
    }
    return false;
}

static ggml_backend_t ggml_cpu_virtual_device_init_backend(ggml_backend_dev_t dev, const char * params) {
    auto * dev_ctx = (ggml_cpu_virtual_device_context *) dev->context;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (cpu == nullptr) {
        return nullptr;
    }
    ggml_backend_cpu_set_n_threads(cpu, std::max(1, env_int("GGML_CPU_VIRTUAL_THREADS", 1)));

    auto * ctx        = new ggml_cpu_virtual_backend_context;
    ctx->cpu          = cpu;
    ctx->delay_us     = ggml_cpu_virtual_delay_selected(dev_ctx->index) ? env_int("GGML_CPU_VIRTUAL_DELAY_US", 0) : 0;
    ctx->stream       = std::make_unique<ggml_cpu_virtual_stream>(
        pyllama_so_test_hook(PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_BREAK_EVENT_WAIT) != 0);

    return new ggml_backend {
        /* .guid    = */ ggml_cpu_virtual_guid(),
        /* .iface   = */ ggml_cpu_virtual_backend_i,
        /* .device  = */ dev,
        /* .context = */ ctx,
    };
    GGML_UNUSED(params);
}

static void ggml_cpu_virtual_backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    GGML_ASSERT(ggml_backend_is_cpu_virtual(backend));
    ggml_backend_t cpu = vctx(backend)->cpu;
    vctx(backend)->stream->push([cpu, n_threads] { ggml_backend_cpu_set_n_threads(cpu, n_threads); });
}

// device interface

static const char * ggml_cpu_virtual_device_get_name(ggml_backend_dev_t dev) {
    return ((ggml_cpu_virtual_device_context *) dev->context)->name.c_str();
}

static const char * ggml_cpu_virtual_device_get_description(ggml_backend_dev_t dev) {
    return ((ggml_cpu_virtual_device_context *) dev->context)->description.c_str();
}

static void ggml_cpu_virtual_device_get_memory(ggml_backend_dev_t dev, size_t * free, size_t * total) {
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    *total = (size_t) sysconf(_SC_PHYS_PAGES) * page;
    *free  = (size_t) sysconf(_SC_AVPHYS_PAGES) * page;
    GGML_UNUSED(dev);
}

// GPU, so that llama.cpp offloads to it and its tensor split mode accepts it
static enum ggml_backend_dev_type ggml_cpu_virtual_device_get_type(ggml_backend_dev_t dev) {
    return GGML_BACKEND_DEVICE_TYPE_GPU;
    GGML_UNUSED(dev);
}

static void ggml_cpu_virtual_device_get_props(ggml_backend_dev_t dev, ggml_backend_dev_props * props) {
    props->name        = ggml_cpu_virtual_device_get_name(dev);
    props->description = ggml_cpu_virtual_device_get_description(dev);
    props->type        = ggml_cpu_virtual_device_get_type(dev);
    props->device_id   = nullptr;
    ggml_cpu_virtual_device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {
        /* .async                = */ true,
        /* .host_buffer          = */ false,
        /* .buffer_from_host_ptr = */ false,
        /* .events               = */ pyllama_so_test_hook(PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_NO_EVENTS) == 0,
        /* .mmap_support         = */ false,
    };
}

static ggml_backend_buffer_type_t ggml_cpu_virtual_device_get_buffer_type(ggml_backend_dev_t dev) {
    return &((ggml_cpu_virtual_device_context *) dev->context)->buft;
}

static bool ggml_cpu_virtual_device_supports_op(ggml_backend_dev_t dev, const ggml_tensor * op) {
    // looked up once: ggml_backend_cpu_reg() re-runs the CPU init (a ggml context, a lock) on every call,
    // and the scheduler asks this for every node
    static ggml_backend_dev_t cpu_dev = ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0);
    return ggml_backend_dev_supports_op(cpu_dev, op);
    GGML_UNUSED(dev);
}

static bool ggml_cpu_virtual_device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    return buft == ggml_cpu_virtual_device_get_buffer_type(dev);
}

static ggml_backend_event_t ggml_cpu_virtual_device_event_new(ggml_backend_dev_t dev) {
    return new ggml_backend_event { dev, new ggml_cpu_virtual_event_ptr(std::make_shared<ggml_cpu_virtual_event>()) };
}

// may be freed with records or waits still queued (ggml_backend_sched_free does not synchronize first)
static void ggml_cpu_virtual_device_event_free(ggml_backend_dev_t dev, ggml_backend_event_t event) {
    delete (ggml_cpu_virtual_event_ptr *) event->context;
    delete event;
    GGML_UNUSED(dev);
}

static void ggml_cpu_virtual_device_event_synchronize(ggml_backend_dev_t dev, ggml_backend_event_t event) {
    ggml_cpu_virtual_event & ev = ggml_cpu_virtual_event_of(event);
    ev.wait_host(ev.last_recorded());
    GGML_UNUSED(dev);
}

static const ggml_backend_device_i ggml_cpu_virtual_device_i = {
    /* .get_name             = */ ggml_cpu_virtual_device_get_name,
    /* .get_description      = */ ggml_cpu_virtual_device_get_description,
    /* .get_memory           = */ ggml_cpu_virtual_device_get_memory,
    /* .get_type             = */ ggml_cpu_virtual_device_get_type,
    /* .get_props            = */ ggml_cpu_virtual_device_get_props,
    /* .init_backend         = */ ggml_cpu_virtual_device_init_backend,
    /* .get_buffer_type      = */ ggml_cpu_virtual_device_get_buffer_type,
    /* .get_host_buffer_type = */ nullptr,
    /* .buffer_from_host_ptr = */ nullptr,
    /* .supports_op          = */ ggml_cpu_virtual_device_supports_op,
    /* .supports_buft        = */ ggml_cpu_virtual_device_supports_buft,
    /* .offload_op           = */ nullptr,
    /* .event_new            = */ ggml_cpu_virtual_device_event_new,
    /* .event_free           = */ ggml_cpu_virtual_device_event_free,
    /* .event_synchronize    = */ ggml_cpu_virtual_device_event_synchronize,
};

// comm context: AllReduce of F32 tensors in three stream steps, each summing in device order so
// that every device ends with bitwise the same values:
//   1. wait until every stream has produced its tensor
//   2. sum all tensors into a private buffer (reads only), then signal
//   3. wait until every stream has finished reading, then overwrite the own tensor with the sum
// It takes AllReduce settings (pyllama-so-allreduce.h) and reports them, as a GPU's comm context does, and acts
// on none: its one reduction is none of the CUDA paths, so its counters stay 0.

struct ggml_cpu_virtual_comm {
    std::vector<ggml_backend_t>                          backends;
    std::vector<ggml_cpu_virtual_event_ptr> produced;
    std::vector<ggml_cpu_virtual_event_ptr> consumed;
    pyllama_so_allreduce_settings           settings = {};
    std::atomic<bool>                       reduced{false}; // from the first reduction on, the settings stay
};

static void * ggml_cpu_virtual_comm_init(ggml_backend_t * backends, size_t n_backends) {
    if (env_int("GGML_CPU_VIRTUAL_COMM", 1) == 0) {
        return nullptr;
    }
    auto * comm = new ggml_cpu_virtual_comm;
    for (size_t i = 0; i < n_backends; i++) {
        if (!ggml_backend_is_cpu_virtual(backends[i])) {
            delete comm;
            return nullptr;
        }
        comm->backends.push_back(backends[i]);
        comm->produced.push_back(std::make_shared<ggml_cpu_virtual_event>());
        comm->consumed.push_back(std::make_shared<ggml_cpu_virtual_event>());
    }
    GGML_ASSERT(pyllama_so_allreduce_resolve(nullptr, &comm->settings) == PYLLAMA_SO_AR_OK);
    return comm;
}

static int ggml_cpu_virtual_comm_configure(void * comm_ctx, const pyllama_so_allreduce_params * params) {
    auto * comm = (ggml_cpu_virtual_comm *) comm_ctx;
    pyllama_so_allreduce_settings settings;
    if (comm == nullptr || pyllama_so_allreduce_resolve(params, &settings) != PYLLAMA_SO_AR_OK) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    if (comm->reduced.load()) {
        return PYLLAMA_SO_AR_EBUSY;
    }
    comm->settings = settings;
    return PYLLAMA_SO_AR_OK;
}

static int ggml_cpu_virtual_comm_report(void * comm_ctx, pyllama_so_allreduce_report * out) {
    const auto * comm = (const ggml_cpu_virtual_comm *) comm_ctx;
    if (comm == nullptr || out == nullptr || out->size != sizeof(pyllama_so_allreduce_report)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    *out = {};
    out->size     = sizeof(pyllama_so_allreduce_report);
    out->settings = comm->settings;
    return PYLLAMA_SO_AR_OK;
}

static void ggml_cpu_virtual_comm_free(void * comm_ctx) {
    auto * comm = (ggml_cpu_virtual_comm *) comm_ctx;
    for (ggml_backend_t backend : comm->backends) {
        ggml_backend_synchronize(backend); // the queued steps write into the reduced tensors
    }
    delete comm;
}

static bool ggml_cpu_virtual_comm_allreduce_tensor(void * comm_ctx, ggml_tensor ** tensors) {
    auto * comm = (ggml_cpu_virtual_comm *) comm_ctx;
    const size_t n = comm->backends.size();
    comm->reduced.store(true);
    for (size_t j = 0; j < n; j++) {
        if (tensors[j]->type != GGML_TYPE_F32 || !ggml_is_contiguous(tensors[j]) ||
                ggml_nelements(tensors[j]) != ggml_nelements(tensors[0])) {
            return false; // the Meta backend's generic path handles it
        }
    }
    // a tensor whose compute flag is off has a zero-sized slice: it contributes zeros
    auto srcs = std::make_shared<std::vector<const float *>>(n);
    for (size_t j = 0; j < n; j++) {
        (*srcs)[j] = (tensors[j]->flags & GGML_TENSOR_FLAG_COMPUTE) ? (const float *) tensors[j]->data : nullptr;
    }
    const int64_t ne = ggml_nelements(tensors[0]);

    for (size_t j = 0; j < n; j++) {
        comm->produced[j]->record(*vctx(comm->backends[j])->stream);
    }
    // every step 2 is recorded before any step 3 waits on it: a wait covers only earlier records
    std::vector<std::shared_ptr<std::vector<float>>> sums(n);
    for (size_t j = 0; j < n; j++) {
        ggml_cpu_virtual_backend_context * ctx = vctx(comm->backends[j]);
        for (size_t k = 0; k < n; k++) {
            if (k != j) {
                comm->produced[k]->wait_on(*ctx->stream);
            }
        }
        auto sum = std::make_shared<std::vector<float>>(ne);
        sums[j] = sum;
        ctx->stream->push([srcs, sum, ne] { // sum starts zeroed
            for (const float * src : *srcs) {
                if (src != nullptr) {
                    for (int64_t i = 0; i < ne; i++) {
                        (*sum)[i] += src[i];
                    }
                }
            }
        });
        comm->consumed[j]->record(*ctx->stream);
    }
    for (size_t j = 0; j < n; j++) {
        ggml_cpu_virtual_backend_context * ctx = vctx(comm->backends[j]);
        auto   sum = sums[j];
        float * dst = (float *) tensors[j]->data;
        for (size_t k = 0; k < n; k++) {
            if (k != j) {
                comm->consumed[k]->wait_on(*ctx->stream);
            }
        }
        ctx->stream->push([sum, dst, ne] { memcpy(dst, sum->data(), ne * sizeof(float)); });
    }
    return true;
}

// registry

struct ggml_cpu_virtual_reg_context {
    std::mutex                                                    mtx;
    std::vector<std::unique_ptr<ggml_cpu_virtual_device_context>> dev_ctxs;
    std::vector<ggml_backend_device>                              devices;
};

static ggml_cpu_virtual_reg_context & ggml_cpu_virtual_reg_ctx() {
    static ggml_cpu_virtual_reg_context ctx;
    return ctx;
}

static const char * ggml_cpu_virtual_reg_get_name(ggml_backend_reg_t reg) {
    return "CPUV";
    GGML_UNUSED(reg);
}

static size_t ggml_cpu_virtual_reg_get_device_count(ggml_backend_reg_t reg) {
    return ggml_cpu_virtual_reg_ctx().devices.size();
    GGML_UNUSED(reg);
}

static ggml_backend_dev_t ggml_cpu_virtual_reg_get_device(ggml_backend_reg_t reg, size_t index) {
    auto & devices = ggml_cpu_virtual_reg_ctx().devices;
    GGML_ASSERT(index < devices.size());
    return &devices[index];
    GGML_UNUSED(reg);
}

static void * ggml_cpu_virtual_reg_get_proc_address(ggml_backend_reg_t reg, const char * name) {
    if (strcmp(name, "ggml_backend_set_n_threads") == 0) {
        return (void *) ggml_cpu_virtual_backend_set_n_threads;
    }
    if (strcmp(name, "ggml_backend_comm_init") == 0) {
        return (void *) ggml_cpu_virtual_comm_init;
    }
    if (strcmp(name, "ggml_backend_comm_free") == 0) {
        return (void *) ggml_cpu_virtual_comm_free;
    }
    if (strcmp(name, "ggml_backend_comm_allreduce_tensor") == 0) {
        return (void *) ggml_cpu_virtual_comm_allreduce_tensor;
    }
    if (strcmp(name, PYLLAMA_SO_AR_COMM_CONFIGURE_NAME) == 0) {
        return (void *) ggml_cpu_virtual_comm_configure;
    }
    if (strcmp(name, PYLLAMA_SO_AR_COMM_REPORT_NAME) == 0) {
        return (void *) ggml_cpu_virtual_comm_report;
    }
    return nullptr;
    GGML_UNUSED(reg);
}

static const ggml_backend_reg_i ggml_cpu_virtual_reg_i = {
    /* .get_name         = */ ggml_cpu_virtual_reg_get_name,
    /* .get_device_count = */ ggml_cpu_virtual_reg_get_device_count,
    /* .get_device       = */ ggml_cpu_virtual_reg_get_device,
    /* .get_proc_address = */ ggml_cpu_virtual_reg_get_proc_address,
};

static ggml_backend_reg ggml_cpu_virtual_reg_obj = {
    /* .api_version = */ GGML_BACKEND_API_VERSION,
    /* .iface       = */ ggml_cpu_virtual_reg_i,
    /* .context     = */ nullptr,
};

// create the devices once; `what` names where n comes from, for the warning; the caller holds the lock
static void ggml_cpu_virtual_create_devices(ggml_cpu_virtual_reg_context & ctx, size_t n, const char * what) {
    if (!ctx.devices.empty() || n == 0) {
        return;
    }
    if (n > GGML_CPU_VIRTUAL_MAX_DEVICES) {
        GGML_LOG_WARN("%s: %s=%zu is more than the %d virtual devices supported: using %d\n",
                __func__, what, n, GGML_CPU_VIRTUAL_MAX_DEVICES, GGML_CPU_VIRTUAL_MAX_DEVICES);
        n = GGML_CPU_VIRTUAL_MAX_DEVICES;
    }
    ctx.devices.reserve(n); // devices are handed out by address
    for (size_t i = 0; i < n; i++) {
        auto * d        = new ggml_cpu_virtual_device_context;
        d->index        = (int) i;
        d->name         = "CPUV" + std::to_string(i);
        d->description  = "CPU virtual device " + std::to_string(i);
        ctx.dev_ctxs.emplace_back(d);
        ctx.devices.push_back({ ggml_cpu_virtual_device_i, &ggml_cpu_virtual_reg_obj, d });
        d->buft = { ggml_cpu_virtual_buffer_type_i, &ctx.devices.back(), d };
    }
}

ggml_backend_reg_t ggml_backend_cpu_virtual_reg(void) {
    auto & ctx = ggml_cpu_virtual_reg_ctx();
    std::lock_guard<std::mutex> lock(ctx.mtx);
    ggml_cpu_virtual_create_devices(ctx, ggml_cpu_virtual_env_devices(), "GGML_CPU_VIRTUAL_DEVICES");
    return ctx.devices.empty() ? nullptr : &ggml_cpu_virtual_reg_obj;
}

size_t ggml_backend_cpu_virtual_init(size_t n) {
    // the registry first: creating it may create the devices from the environment
    ggml_backend_reg_count();
    auto & ctx = ggml_cpu_virtual_reg_ctx();
    {
        std::lock_guard<std::mutex> lock(ctx.mtx);
        ggml_cpu_virtual_create_devices(ctx, n, "ggml_backend_cpu_virtual_init's n");
    }
    if (!ctx.devices.empty()) {
        ggml_backend_register(&ggml_cpu_virtual_reg_obj); // the registry ignores a second registration
    }
    return ctx.devices.size();
}
