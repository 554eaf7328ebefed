"""The AllReduce rig: reductions of host data and timings through a fresh CUDA comm context on two devices,
without a model, for ``python -m pyllama_so.bench.allreduce`` and tests/multi_device/test_allreduce_ce.py.

Its kernels and entries live in libpyllama-so-allreduce-rig (testing/cuda/allreduce-ce-bench.cu), a library
of its own next to this module, linked against ggml-cuda and built in CUDA builds only; the shipped
libraries (libggml*, libllama) carry none of it. Without it (a build without CUDA) every entry raises
``LlamaError``, after the arguments have been checked, so bad arguments are a ``ValueError`` in every build.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from pyllama_so import _build_info
from pyllama_so._llama import LlamaError
from pyllama_so.config import AllReduceParams

__all__ = ["available", "allreduce_run", "allreduce_bench"]


def _rig() -> ModuleType | None:
    if "CUDA" not in _build_info.COMPILED_BACKENDS:
        return None
    from pyllama_so.bench import _allreduce_rig  # a CUDA build has it: failing here is a broken install, said as such
    return _allreduce_rig


def available() -> bool:
    """True in a CUDA build: the rig is there (whether two devices are is another question)."""
    return _rig() is not None


def allreduce_run(a0: np.ndarray, a1: np.ndarray, n_iter: int = 1, inactive: int = 0,
                  devices: Sequence[int] = (0, 1), n_alt: int = 0,
                  allreduce: AllReduceParams | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reduce a0 (device devices[0]) with a1 (devices[1]) through a fresh CUDA comm context, with the settings
    `allreduce` (None: every knob's default, its environment variable or the built-in value).

    a0, a1: float32 arrays of n_iter * n elements; reduction k uses elements [k*n, (k+1)*n).
    All reductions are issued back to back without host synchronization. Returns (r0, r1), the
    results as each device holds them. inactive: bit i marks device i's part as an inactive shard.
    n_alt: 0, or the size (1..n) of the odd reductions, which then reduce only their first n_alt
    elements and return the rest of their part unchanged (reductions of alternating sizes).
    """
    if n_iter < 1:
        raise ValueError("n_iter must be >= 1")
    x0 = np.ascontiguousarray(a0, dtype=np.float32).ravel()
    x1 = np.ascontiguousarray(a1, dtype=np.float32).ravel()
    if x0.shape != x1.shape or x0.size % n_iter != 0:
        raise ValueError("a0 and a1 must have the same size, a multiple of n_iter")
    if n_alt < 0 or n_alt > x0.size // n_iter:
        raise ValueError("n_alt must be 0 or from 1 to the size of one reduction")
    rig = _rig()
    if rig is None:
        raise LlamaError("allreduce_run needs the CUDA backend (this build has none)")
    return rig.run(x0, x1, n_iter, inactive, tuple(devices), n_alt, allreduce)


def _nan_to_none(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(x) else float(x) for x in values]


def allreduce_bench(sizes: Sequence[int], mode: str = "comm", n_warmup: int = 5, n_iter: int = 50,
                    devices: Sequence[int] = (0, 1), host_time: bool = False, allreduce: AllReduceParams | None = None
                    ) -> list[float] | tuple[list[float], list[float | None], list[float | None]]:
    """Mean microseconds per iteration for each size in bytes.

    mode "comm": reductions of F32 tensors of that many bytes through a fresh CUDA comm context
    with the settings `allreduce` (None: the defaults). mode "ceiling": both GPUs copy that many
    bytes device->host and host->device at once (pinned memory), the copy-engine ceiling, in copies
    of the settings' chunk size (whole when it is automatic).
    host_time ("comm" only): return (us, host_us, queued_us): also the mean host time to issue one
    reduction, and the GPU time per reduction with the reductions queued before the GPUs start them
    (the host's issue time left out; None where the host could not queue them in time).
    """
    rig = _rig()
    if rig is None:
        raise LlamaError("allreduce_bench needs the CUDA backend (this build has none)")
    if mode not in rig.BENCH_MODES:
        raise ValueError(f"mode must be one of {sorted(rig.BENCH_MODES)}")
    nb = np.ascontiguousarray(sizes, dtype=np.int64)
    if nb.ndim != 1 or nb.size == 0:
        raise ValueError("sizes must be a non-empty list of byte counts")
    us, host_us, queued_us = rig.bench(nb, mode, n_warmup, n_iter, tuple(devices), host_time, allreduce)
    if host_time:
        return [float(x) for x in us], _nan_to_none(host_us), _nan_to_none(queued_us)
    return [float(x) for x in us]
