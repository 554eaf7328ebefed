# AllReduce counters, test and benchmark entries of the CUDA backend (ggml/include/pyllama-so-allreduce.h).
# Included at the end of _llama.pyx. Nothing here links against ggml-cuda: the C functions are looked
# up by name through the CUDA backend registry, so a CPU-only build finds none and reports zeros.

cdef extern from "pyllama-so-allreduce.h" nogil:
    enum:
        PYLLAMA_SO_AR_PATH_CE
        PYLLAMA_SO_AR_PATH_NCCL
        PYLLAMA_SO_AR_PATH_INTERNAL
        PYLLAMA_SO_AR_PATH_FALLBACK
        PYLLAMA_SO_AR_PATH_COUNT
        PYLLAMA_SO_AR_BENCH_COMM
        PYLLAMA_SO_AR_BENCH_CEILING
        PYLLAMA_SO_AR_OK
        PYLLAMA_SO_AR_EINVAL
        PYLLAMA_SO_AR_ENODEV
        PYLLAMA_SO_AR_ENOCOMM
        PYLLAMA_SO_AR_EDECLINED
        PYLLAMA_SO_AR_ENOMEM
        PYLLAMA_SO_AR_EUNSUPPORTED

    struct pyllama_so_allreduce_stats:
        uint64_t size
        uint64_t calls[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t bytes[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t ce_rounds
        uint64_t ce_buffer_allocs
        uint64_t ce_alloc_failures

    struct pyllama_so_allreduce_run_params:
        uint64_t size
        int32_t devices[2]
        int64_t n
        int32_t n_iter
        uint32_t inactive
        int64_t n_alt
        const float * input[2]
        float * output[2]

    struct pyllama_so_allreduce_bench_params:
        uint64_t size
        int32_t devices[2]
        int32_t mode
        int32_t n_sizes
        const int64_t * n_bytes
        int32_t n_warmup
        int32_t n_iter
        double * us_per_iter
        double * host_us_per_iter
        double * queued_us_per_iter

    ctypedef int (*pyllama_so_allreduce_stats_t)(pyllama_so_allreduce_stats * out)
    ctypedef void (*pyllama_so_allreduce_stats_reset_t)()
    ctypedef int (*pyllama_so_allreduce_run_t)(const pyllama_so_allreduce_run_params * params)
    ctypedef int (*pyllama_so_allreduce_bench_t)(const pyllama_so_allreduce_bench_params * params)

    const char * PYLLAMA_SO_AR_STATS_NAME
    const char * PYLLAMA_SO_AR_STATS_RESET_NAME
    const char * PYLLAMA_SO_AR_RUN_NAME
    const char * PYLLAMA_SO_AR_BENCH_NAME


# Path names in the order of the header's counter arrays (indexed by enum pyllama_so_ar_path).
_AR_PATH_NAMES = {
    PYLLAMA_SO_AR_PATH_CE: "ce",
    PYLLAMA_SO_AR_PATH_NCCL: "nccl",
    PYLLAMA_SO_AR_PATH_INTERNAL: "internal",
    PYLLAMA_SO_AR_PATH_FALLBACK: "fallback",
}
assert sorted(_AR_PATH_NAMES) == list(range(PYLLAMA_SO_AR_PATH_COUNT)), "a path of the header has no name here"
ALLREDUCE_PATHS = tuple(_AR_PATH_NAMES[i] for i in range(PYLLAMA_SO_AR_PATH_COUNT))

_AR_ERRORS = {
    PYLLAMA_SO_AR_EINVAL: "invalid parameters (or bindings built against another pyllama-so-allreduce.h)",
    PYLLAMA_SO_AR_ENODEV: "device index out of range, or the CUDA backend could not be initialised on it",
    PYLLAMA_SO_AR_ENOCOMM: "the CUDA backend created no comm context",
    PYLLAMA_SO_AR_EDECLINED: "the comm context declined the reduction (it would fall back to the meta backend's generic path)",
    PYLLAMA_SO_AR_ENOMEM: "out of memory for the test/benchmark buffers",
    PYLLAMA_SO_AR_EUNSUPPORTED: "not supported on this platform",
}


cdef void * _ar_proc(const char * name) noexcept nogil:
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name("CUDA")
    if reg == NULL:
        return NULL
    return ggml_backend_reg_get_proc_address(reg, name)


cdef _ar_check(int rc, str what):
    if rc != PYLLAMA_SO_AR_OK:
        raise LlamaError(f"{what}: {_AR_ERRORS.get(rc, f'error {rc}')}")


def allreduce_available():
    """True when the CUDA backend with pyllama_so's AllReduce entries is compiled in."""
    return _ar_proc(PYLLAMA_SO_AR_RUN_NAME) != NULL


def allreduce_stats():
    """Process-wide AllReduce counters: {"paths": {path: {"calls", "bytes"}}, "ce_rounds", ...}.

    All zeros (and "available": False) in a build without CUDA.
    """
    cdef pyllama_so_allreduce_stats st
    memset(&st, 0, sizeof(st))
    st.size = sizeof(st)
    cdef pyllama_so_allreduce_stats_t fn = <pyllama_so_allreduce_stats_t> _ar_proc(PYLLAMA_SO_AR_STATS_NAME)
    if fn != NULL:
        _ar_check(fn(&st), "allreduce_stats")
    return {
        "available": fn != NULL,
        "paths": {name: {"calls": int(st.calls[i]), "bytes": int(st.bytes[i])}
                  for i, name in enumerate(ALLREDUCE_PATHS)},
        "ce_rounds": int(st.ce_rounds),
        "ce_buffer_allocs": int(st.ce_buffer_allocs),
        "ce_alloc_failures": int(st.ce_alloc_failures),
    }


def allreduce_stats_reset():
    cdef pyllama_so_allreduce_stats_reset_t fn = <pyllama_so_allreduce_stats_reset_t> _ar_proc(PYLLAMA_SO_AR_STATS_RESET_NAME)
    if fn != NULL:
        fn()


def allreduce_run(a0, a1, int n_iter=1, unsigned int inactive=0, devices=(0, 1), int64_t n_alt=0):
    """Reduce a0 (device devices[0]) with a1 (devices[1]) through a fresh CUDA comm context.

    a0, a1: float32 arrays of n_iter * n elements; reduction k uses elements [k*n, (k+1)*n).
    All reductions are issued back to back without host synchronization. Returns (r0, r1), the
    results as each device holds them. inactive: bit i marks device i's part as an inactive shard.
    n_alt: 0, or the size (1..n) of the odd reductions, which then reduce only their first n_alt
    elements and return the rest of their part unchanged (reductions of alternating sizes).
    """
    # arguments first, so that bad ones are a ValueError in every build
    if n_iter < 1:
        raise ValueError("n_iter must be >= 1")
    x0 = np.ascontiguousarray(a0, dtype=np.float32).ravel()
    x1 = np.ascontiguousarray(a1, dtype=np.float32).ravel()
    if x0.shape != x1.shape or x0.size % n_iter != 0:
        raise ValueError("a0 and a1 must have the same size, a multiple of n_iter")
    if n_alt < 0 or n_alt > x0.size // n_iter:
        raise ValueError("n_alt must be 0 or from 1 to the size of one reduction")
    cdef pyllama_so_allreduce_run_t fn = <pyllama_so_allreduce_run_t> _ar_proc(PYLLAMA_SO_AR_RUN_NAME)
    if fn == NULL:
        raise LlamaError("allreduce_run needs the CUDA backend (this build has none)")
    r0 = np.empty_like(x0)
    r1 = np.empty_like(x1)
    cdef float[::1] vx0 = x0
    cdef float[::1] vx1 = x1
    cdef float[::1] vr0 = r0
    cdef float[::1] vr1 = r1
    cdef float dummy[4]
    cdef pyllama_so_allreduce_run_params p
    memset(&p, 0, sizeof(p))
    p.size = sizeof(p)
    p.devices[0] = devices[0]
    p.devices[1] = devices[1]
    p.n = x0.size // n_iter
    p.n_iter = n_iter
    p.inactive = inactive
    p.n_alt = n_alt
    p.input[0] = &vx0[0] if x0.size else dummy
    p.input[1] = &vx1[0] if x1.size else dummy
    p.output[0] = &vr0[0] if r0.size else dummy
    p.output[1] = &vr1[0] if r1.size else dummy
    cdef int rc
    with nogil:
        rc = fn(&p)
    _ar_check(rc, "allreduce_run")
    return r0, r1


def _nan_to_none(values):
    return [None if np.isnan(x) else float(x) for x in values]


def allreduce_bench(sizes, str mode="comm", int n_warmup=5, int n_iter=50, devices=(0, 1), bint host_time=False):
    """Mean microseconds per iteration for each size in bytes.

    mode "comm": reductions of F32 tensors of that many bytes through a fresh CUDA comm context
    (routed by the GGML_CUDA_* variables in effect now). mode "ceiling": both GPUs copy that many
    bytes device->host and host->device at once (pinned memory), the copy-engine ceiling.
    host_time ("comm" only): return (us, host_us, queued_us): also the mean host time to issue one
    reduction, and the GPU time per reduction with the reductions queued before the GPUs start them
    (the host's issue time left out; None where the host could not queue them in time).
    """
    cdef pyllama_so_allreduce_bench_t fn = <pyllama_so_allreduce_bench_t> _ar_proc(PYLLAMA_SO_AR_BENCH_NAME)
    if fn == NULL:
        raise LlamaError("allreduce_bench needs the CUDA backend (this build has none)")
    modes = {"comm": PYLLAMA_SO_AR_BENCH_COMM, "ceiling": PYLLAMA_SO_AR_BENCH_CEILING}
    if mode not in modes:
        raise ValueError(f"mode must be one of {sorted(modes)}")
    nb = np.ascontiguousarray(sizes, dtype=np.int64)
    if nb.ndim != 1 or nb.size == 0:
        raise ValueError("sizes must be a non-empty list of byte counts")
    us = np.zeros(nb.size, dtype=np.float64)
    host_us = np.full(nb.size, np.nan, dtype=np.float64)
    queued_us = np.full(nb.size, np.nan, dtype=np.float64)
    cdef int64_t[::1] vnb = nb
    cdef double[::1] vus = us
    cdef double[::1] vhost = host_us
    cdef double[::1] vqueued = queued_us
    cdef pyllama_so_allreduce_bench_params p
    memset(&p, 0, sizeof(p))
    p.size = sizeof(p)
    p.devices[0] = devices[0]
    p.devices[1] = devices[1]
    p.mode = modes[mode]
    p.n_sizes = nb.size
    p.n_bytes = &vnb[0]
    p.n_warmup = n_warmup
    p.n_iter = n_iter
    p.us_per_iter = &vus[0]
    p.host_us_per_iter = &vhost[0] if host_time else NULL
    p.queued_us_per_iter = &vqueued[0] if host_time and mode == "comm" else NULL
    cdef int rc
    with nogil:
        rc = fn(&p)
    _ar_check(rc, "allreduce_bench")
    if host_time:
        return [float(x) for x in us], _nan_to_none(host_us), _nan_to_none(queued_us)
    return [float(x) for x in us]
