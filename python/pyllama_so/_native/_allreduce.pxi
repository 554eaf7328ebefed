# AllReduce counters of the CUDA backend and the AllReduce settings of a context (ggml/include/pyllama-so-allreduce.h,
# llama/include/pyllama-so-context-allreduce.h). Included at the end of _llama.pyx. Nothing here links against
# ggml-cuda: the process-wide counters are looked up by name through the CUDA backend registry, so a CPU-only build
# finds none and reports zeros. The test and benchmark entries are the test harness's: pyllama_so.bench.allreduce_rig.

cdef extern from "pyllama-so-allreduce.h" nogil:
    enum:
        PYLLAMA_SO_AR_PATH_CE
        PYLLAMA_SO_AR_PATH_NCCL
        PYLLAMA_SO_AR_PATH_INTERNAL
        PYLLAMA_SO_AR_PATH_FALLBACK
        PYLLAMA_SO_AR_PATH_LL
        PYLLAMA_SO_AR_PATH_COUNT
        PYLLAMA_SO_AR_OK
        PYLLAMA_SO_AR_EINVAL
        PYLLAMA_SO_AR_EBUSY
        PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT
        PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN
        PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX
        PYLLAMA_SO_AR_LL_MAX_BYTES_DEFAULT
        PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT

    struct pyllama_so_allreduce_stats:
        uint64_t size
        uint64_t calls[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t bytes[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t ce_rounds
        uint64_t ce_buffer_allocs
        uint64_t ce_alloc_failures

    struct pyllama_so_allreduce_params:
        uint64_t size
        int32_t copy_engines
        int64_t min_bytes
        int64_t chunk_bytes
        int64_t ll_max_bytes

    struct pyllama_so_allreduce_settings:
        int32_t copy_engines
        uint64_t min_bytes
        uint64_t chunk_bytes
        uint64_t ll_max_bytes

    struct pyllama_so_allreduce_report:
        uint64_t size
        pyllama_so_allreduce_settings settings
        int32_t ce_enabled
        uint64_t calls[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t bytes[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t ce_rounds

    ctypedef int (*pyllama_so_allreduce_stats_t)(pyllama_so_allreduce_stats * out)
    ctypedef void (*pyllama_so_allreduce_stats_reset_t)()

    const char * PYLLAMA_SO_AR_STATS_NAME
    const char * PYLLAMA_SO_AR_STATS_RESET_NAME


cdef extern from "pyllama-so-context-allreduce.h" nogil:
    int32_t llama_allreduce_configure(llama_context * ctx, const pyllama_so_allreduce_params * params)
    int32_t llama_allreduce_get_report(const llama_context * ctx, pyllama_so_allreduce_report * out)


# Path names in the order of the header's counter arrays (indexed by enum pyllama_so_ar_path).
_AR_PATH_NAMES = {
    PYLLAMA_SO_AR_PATH_CE: "ce",
    PYLLAMA_SO_AR_PATH_NCCL: "nccl",
    PYLLAMA_SO_AR_PATH_INTERNAL: "internal",
    PYLLAMA_SO_AR_PATH_FALLBACK: "fallback",
    PYLLAMA_SO_AR_PATH_LL: "ll",
}
assert sorted(_AR_PATH_NAMES) == list(range(PYLLAMA_SO_AR_PATH_COUNT)), "a path of the header has no name here"
ALLREDUCE_PATHS = tuple(_AR_PATH_NAMES[i] for i in range(PYLLAMA_SO_AR_PATH_COUNT))

_AR_ERRORS = {
    PYLLAMA_SO_AR_EINVAL: "invalid parameters (or bindings built against another pyllama-so-allreduce.h)",
    PYLLAMA_SO_AR_EBUSY: "the context has reduced already: its AllReduce settings stay as they are",
}

# The settings' built-in defaults and ranges, as the C side checks them (pyllama_so.config.AllReduceParams).
ALLREDUCE_LIMITS = {
    "min_bytes_default": PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT,
    "chunk_bytes_min": PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN,
    "chunk_bytes_max": PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX,
    "ll_max_bytes_default": PYLLAMA_SO_AR_LL_MAX_BYTES_DEFAULT,
    "ll_max_bytes_limit": PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT,
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
    """True when the CUDA backend with pyllama_so's AllReduce counters is compiled in."""
    return _ar_proc(PYLLAMA_SO_AR_STATS_NAME) != NULL


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
    cdef pyllama_so_allreduce_stats_reset_t fn = <pyllama_so_allreduce_stats_reset_t> _ar_proc(
        PYLLAMA_SO_AR_STATS_RESET_NAME)
    if fn != NULL:
        fn()


cdef int64_t _ar_field(value) except? -2:
    return -1 if value is None else value  # -1: the default (its environment variable, else the built-in value)


cdef _context_allreduce_configure(llama_context * ctx, allreduce):
    """Give ctx's comm contexts the settings of `allreduce` (a pyllama_so.config.AllReduceParams: copy_engines,
    min_bytes, chunk_bytes, ll_max_bytes; None each for the default)."""
    cdef pyllama_so_allreduce_params p
    memset(&p, 0, sizeof(p))
    p.size = sizeof(p)
    p.copy_engines = -1 if allreduce.copy_engines is None else int(allreduce.copy_engines)
    p.min_bytes = _ar_field(allreduce.min_bytes)
    p.chunk_bytes = _ar_field(allreduce.chunk_bytes)
    p.ll_max_bytes = _ar_field(allreduce.ll_max_bytes)
    cdef int32_t rc
    with nogil:
        rc = llama_allreduce_configure(ctx, &p)
    if rc == PYLLAMA_SO_AR_EINVAL:
        raise ValueError(f"AllReduce settings refused: {_AR_ERRORS[rc]}")
    _ar_check(rc, "AllReduce settings")


cdef _context_allreduce_report(const llama_context * ctx):
    """{"comm_contexts": n, "settings": {...}, "ce_enabled", "paths": {path: {"calls", "bytes"}}, "ce_rounds"}: the
    settings of ctx's comm contexts and their counters summed (n == 0: none, every value 0)."""
    cdef pyllama_so_allreduce_report r
    memset(&r, 0, sizeof(r))
    r.size = sizeof(r)
    cdef int32_t n = llama_allreduce_get_report(ctx, &r)
    if n < 0:
        _ar_check(n, "AllReduce report")
    return {
        "comm_contexts": n,
        "settings": {"copy_engines": r.settings.copy_engines, "min_bytes": r.settings.min_bytes,
                     "chunk_bytes": r.settings.chunk_bytes, "ll_max_bytes": r.settings.ll_max_bytes},
        "ce_enabled": bool(r.ce_enabled),
        "paths": {name: {"calls": int(r.calls[i]), "bytes": int(r.bytes[i])} for i, name in enumerate(ALLREDUCE_PATHS)},
        "ce_rounds": int(r.ce_rounds),
    }
