# AllReduce counters of the CUDA backend (ggml/include/pyllama-so-allreduce.h). Included at the end of
# _llama.pyx. Nothing here links against ggml-cuda: the C functions are looked up by name through the CUDA
# backend registry, so a CPU-only build finds none and reports zeros. The test and benchmark entries are the
# test harness's: pyllama_so.bench.allreduce_rig.

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

    struct pyllama_so_allreduce_stats:
        uint64_t size
        uint64_t calls[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t bytes[PYLLAMA_SO_AR_PATH_COUNT]
        uint64_t ce_rounds
        uint64_t ce_buffer_allocs
        uint64_t ce_alloc_failures

    ctypedef int (*pyllama_so_allreduce_stats_t)(pyllama_so_allreduce_stats * out)
    ctypedef void (*pyllama_so_allreduce_stats_reset_t)()

    const char * PYLLAMA_SO_AR_STATS_NAME
    const char * PYLLAMA_SO_AR_STATS_RESET_NAME


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
    cdef pyllama_so_allreduce_stats_reset_t fn = <pyllama_so_allreduce_stats_reset_t> _ar_proc(PYLLAMA_SO_AR_STATS_RESET_NAME)
    if fn != NULL:
        fn()
