# cython: language_level=3, boundscheck=False, wraparound=False
"""Bindings of the AllReduce rig (testing/cuda/allreduce-rig.h, libpyllama-so-allreduce-rig beside this
module), built in CUDA builds only. Called through pyllama_so.bench.allreduce_rig, which checks the
arguments first.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset

import numpy as np

from pyllama_so._llama import LlamaError

cdef extern from "allreduce-rig.h" nogil:
    enum:
        PYLLAMA_SO_AR_OK
        PYLLAMA_SO_AR_EINVAL
        PYLLAMA_SO_AR_ENODEV
        PYLLAMA_SO_AR_ENOCOMM
        PYLLAMA_SO_AR_EDECLINED
        PYLLAMA_SO_AR_ENOMEM
        PYLLAMA_SO_AR_EUNSUPPORTED
        PYLLAMA_SO_AR_BENCH_COMM
        PYLLAMA_SO_AR_BENCH_CEILING

    struct pyllama_so_allreduce_params:
        uint64_t size
        int32_t copy_engines
        int64_t min_bytes
        int64_t chunk_bytes
        int64_t ll_max_bytes

    struct pyllama_so_allreduce_run_params:
        uint64_t size
        int32_t devices[2]
        int64_t n
        int32_t n_iter
        uint32_t inactive
        int64_t n_alt
        const float * input[2]
        float * output[2]
        pyllama_so_allreduce_params allreduce

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
        pyllama_so_allreduce_params allreduce

    int pyllama_so_allreduce_run(const pyllama_so_allreduce_run_params * params)
    int pyllama_so_allreduce_bench(const pyllama_so_allreduce_bench_params * params)


BENCH_MODES = {"comm": PYLLAMA_SO_AR_BENCH_COMM, "ceiling": PYLLAMA_SO_AR_BENCH_CEILING}

_ERRORS = {
    PYLLAMA_SO_AR_EINVAL: "invalid parameters (or bindings built against another allreduce-rig.h)",
    PYLLAMA_SO_AR_ENODEV: "device index out of range, or the CUDA backend could not be initialised on it",
    PYLLAMA_SO_AR_ENOCOMM: "the CUDA backend created no comm context",
    PYLLAMA_SO_AR_EDECLINED: "the comm context declined the reduction (it would fall back to the meta backend's "
                             "generic path)",
    PYLLAMA_SO_AR_ENOMEM: "out of memory for the test/benchmark buffers",
    PYLLAMA_SO_AR_EUNSUPPORTED: "not supported on this platform",
}


cdef void _settings(pyllama_so_allreduce_params * out, allreduce) except *:
    """An AllReduceParams (None: leave out->size 0, the defaults) as the C struct; -1 for a knob left None."""
    if allreduce is None:
        return
    out.size = sizeof(pyllama_so_allreduce_params)
    out.copy_engines = -1 if allreduce.copy_engines is None else int(allreduce.copy_engines)
    out.min_bytes = -1 if allreduce.min_bytes is None else allreduce.min_bytes
    out.chunk_bytes = -1 if allreduce.chunk_bytes is None else allreduce.chunk_bytes
    out.ll_max_bytes = -1 if allreduce.ll_max_bytes is None else allreduce.ll_max_bytes


cdef _check(int rc, str what):
    if rc != PYLLAMA_SO_AR_OK:
        raise LlamaError(f"{what}: {_ERRORS.get(rc, f'error {rc}')}")


def run(x0, x1, int n_iter, unsigned int inactive, devices, int64_t n_alt, allreduce=None):
    """x0, x1: contiguous float32 arrays of one size, a multiple of n_iter; allreduce: an AllReduceParams (None:
    the defaults); returns (r0, r1)."""
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
    _settings(&p.allreduce, allreduce)
    cdef int rc
    with nogil:
        rc = pyllama_so_allreduce_run(&p)
    _check(rc, "allreduce_run")
    return r0, r1


def bench(nb, str mode, int n_warmup, int n_iter, devices, bint host_time, allreduce=None):
    """nb: a non-empty int64 array of byte counts; returns (us, host_us, queued_us) float64 arrays (NaN: not
    measured)."""
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
    p.mode = BENCH_MODES[mode]
    p.n_sizes = nb.size
    p.n_bytes = &vnb[0]
    p.n_warmup = n_warmup
    p.n_iter = n_iter
    p.us_per_iter = &vus[0]
    p.host_us_per_iter = &vhost[0] if host_time else NULL
    p.queued_us_per_iter = &vqueued[0] if host_time and mode == "comm" else NULL
    _settings(&p.allreduce, allreduce)
    cdef int rc
    with nogil:
        rc = pyllama_so_allreduce_bench(&p)
    _check(rc, "allreduce_bench")
    return us, host_us, queued_us
