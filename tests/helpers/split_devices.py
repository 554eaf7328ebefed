"""Devices and checks shared by the tensor-split tests (split overlap, attention split): CPU virtual devices,
a pair of CUDA devices, the AllReduce routing of a test's contexts, and bitwise comparison."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from pyllama_so import _llama, allreduce, archs
from pyllama_so.bench.allreduce import cuda_devices


def virtual_devices(n: int) -> list[int]:
    """Indices of n CPU virtual devices (archs.VIRTUAL_DEVICES, made once per process); skips if fewer exist."""
    archs.ensure_virtual_devices()
    idx = [d["index"] for d in _llama.devices() if d["backend"] == "CPUV"]
    if len(idx) < n:
        pytest.skip(f"needs {n} CPU virtual devices, the process has {len(idx)}")
    return idx[:n]


def cuda_device_pair() -> list[int]:
    """Indices of two CUDA devices (two GPUs, or GGML_CUDA_DEVICES=2 on one); skips otherwise."""
    idx = [d["index"] for d in cuda_devices()]
    if len(idx) < 2:
        pytest.skip("needs 2 CUDA devices (GGML_CUDA_DEVICES=2 makes two on one GPU)")
    return idx[:2]


def set_env(values: dict[str, str | None]) -> None:
    """Set each variable, or remove it where the value is None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def copy_engine_routing(forced: bool) -> Iterator[None]:
    """Contexts made inside use the copy engines for every reduction (forced) or upstream's routing, through the
    variables that are every context's default settings (the lane and arch fixtures make their contexts without
    AllReduceParams); the counters start at 0 and the variables are restored afterwards."""
    env = allreduce.AllReduceParams(copy_engines=forced, min_bytes=1 if forced else None).environment()
    saved = {k: os.environ.get(k) for k in env}
    set_env(env)  # before any context
    allreduce.reset_allreduce_stats()
    try:
        yield
    finally:
        set_env(saved)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
