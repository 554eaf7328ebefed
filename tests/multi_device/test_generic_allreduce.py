"""The Meta backend's generic AllReduce (copies + ADD graphs, what runs without a comm context) on CPU virtual
devices with GGML_CPU_VIRTUAL_COMM=0: bitwise the same logits on every run, equal to the CPU virtual devices'
own AllReduce (the default). Two hazards made it differ from run to run: a device's copy into another device's
staging buffer while that device's previous ADD still read it (ggml/src/ggml-cpu-virtual.cpp: a copy now waits
for what the destination has queued, as ggml_backend_tensor_copy_async promises), and the zeroing of a skipped
device's partial sum as 0 * (whatever the memory held), NaN where it held -inf or NaN (patches/0012-*).
GGML_CPU_VIRTUAL_POISON=1 fills new buffers with NaN, so the second shows on every run instead of now and then."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from helpers.split_devices import cuda_device_pair, same_bits
from pyllama_so import archs, testing

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

RUNS = 4


def _logits(runner: archs.Runner, devices: list[int], split_overlap: bool, mqa: bool) -> np.ndarray:
    """The archs row's logits (128 tokens in ubatches of 64, then single-token decode steps) on a fresh model
    and context, so that every run allocates its buffers anew."""
    model = testing.arch_model("llama", False, devices, "tensor", mqa=mqa)
    try:
        ctx = runner._context(model, False, split_overlap)
        try:
            return runner.decode(ctx, False)
        finally:
            ctx.free()
    finally:
        model.free()


@pytest.fixture()
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GGML_CPU_VIRTUAL_POISON", "1")  # read per buffer
    yield


def _runs(runner: archs.Runner, devices: list[int], split_overlap: bool, mqa: bool) -> list[np.ndarray]:
    runs = [_logits(runner, devices, split_overlap, mqa) for _ in range(RUNS)]
    for i, run in enumerate(runs):
        assert np.isfinite(run).all(), f"run {i}: {int((~np.isfinite(run)).any(axis=-1).sum())} rows not finite"
        assert same_bits(run, runs[0]), f"run {i} differs from run 0 by up to {np.abs(run - runs[0]).max()}"
    return runs


# llama's dense fixture has two query heads: over three devices one device has no attention in each layer (its
# partial sum is zeroed); its MQA variant copies the KV head to every device
@pytest.mark.parametrize("split_overlap", [False, True], ids=["meta", "meta-so"])
@pytest.mark.parametrize("n_devices", [2, 3])
@pytest.mark.parametrize("mqa", [False, True], ids=["dense", "mqa"])
def test_generic_allreduce_is_deterministic(monkeypatch: pytest.MonkeyPatch, poisoned: None, mqa: bool,
                                            n_devices: int, split_overlap: bool) -> None:
    archs.ensure_virtual_devices()
    devices = archs.resolve([f"CPUV{i}" for i in range(n_devices)])
    runner = archs.Runner()
    reference = _logits(runner, devices, split_overlap, mqa)  # the CPU virtual devices' own AllReduce
    assert np.isfinite(reference).all()
    monkeypatch.setenv("GGML_CPU_VIRTUAL_COMM", "0")  # read when a context makes its comm context
    runs = _runs(runner, devices, split_overlap, mqa)
    if n_devices == 2:
        # a + b either way round: the generic butterfly and the device-order sum agree bitwise
        assert same_bits(runs[0], reference), f"max |diff| vs the default path {np.abs(runs[0] - reference).max()}"
    else:
        # three devices: the generic path folds the third into the first before the butterfly, (a + c) + b
        # against (a + b) + c, so the sums round differently
        assert archs.nmse(reference, runs[0]) < 1e-10, archs.nmse(reference, runs[0])
    assert archs.nmse(runner.cpu_logits("llama", False, False, mqa), runs[0]) < archs.NMSE_MAX


@pytest.mark.gpu
@pytest.mark.parametrize("split_overlap", [False, True], ids=["meta", "meta-so"])
@pytest.mark.parametrize("mqa", [False, True], ids=["dense", "mqa"])
def test_gpu_generic_allreduce_is_deterministic(monkeypatch: pytest.MonkeyPatch, mqa: bool,
                                                split_overlap: bool) -> None:
    """The same on two CUDA devices with GGML_CUDA_ALLREDUCE=none (every reduction takes the generic path): its
    copies run on the source device's stream, so this also tells whether upstream's CUDA copy orders itself
    after the destination's queued ADD."""
    devices = cuda_device_pair()
    monkeypatch.setenv("GGML_CUDA_ALLREDUCE", "none")  # read when a context makes its comm context
    runner = archs.Runner()
    runs = _runs(runner, devices, split_overlap, mqa)
    assert archs.nmse(runner.cpu_logits("llama", False, False, mqa), runs[0]) < archs.NMSE_MAX
