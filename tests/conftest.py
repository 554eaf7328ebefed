"""Shared fixtures: tiny synthetic models, and skipping of GPU tests where no CUDA device exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_devices import cuda_device_count

from pyllama_so import synth


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Modules that make CPU virtual devices (MAKES_CPU_VIRTUAL_DEVICES = True), which stay in the process
    # and which llama.cpp then uses like GPUs, run last so that the others see the machine's own devices.
    items.sort(key=lambda item: bool(getattr(item.module, "MAKES_CPU_VIRTUAL_DEVICES", False)))
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(model_dir: Path) -> Path:
    """A 2-layer qwen3-shaped F16 model with a byte-fallback vocabulary of 512 tokens."""
    return synth.write_model(model_dir / "tiny-f16.gguf", "tiny", "f16", quiet=True)


@pytest.fixture(scope="session")
def small_model() -> Path:
    """The bench's default synthetic model (qwen3-shaped, 33.6 M params), written once to the cache."""
    return synth.cached_model("small", "f16")
