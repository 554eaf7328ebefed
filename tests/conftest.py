"""Shared fixtures: tiny synthetic models, the real models, and skipping of GPU tests where no CUDA device exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.chat_prompts import CHAT_TEMPLATE
from helpers.cuda_devices import cuda_device_count
from helpers.paths import SCRIPTS
from helpers.real_models import real_model
from pyllama_so import synth

# scripts/ holds modules (server_process, server_load, fetch_upstream, gpu_check, ...) that tests import by name
sys.path.insert(0, str(SCRIPTS))


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
def small_model(model_dir: Path) -> Path:
    """The bench's default synthetic shape (qwen3-shaped, 33.6 M params), in the session's pytest folder (not
    the user's model cache)."""
    return synth.write_model(model_dir / "small-f16.gguf", "small", "f16", quiet=True)


@pytest.fixture(scope="session")
def chat_model(model_dir: Path) -> Path:
    """The tiny model with CHAT_TEMPLATE as its tokenizer.chat_template."""
    return synth.write_model(model_dir / "tiny-chat-f16.gguf", "tiny", "f16", quiet=True, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the model cache (pyllama_so.models; skipped outside CI when missing)."""
    return real_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_model() -> Path:
    """Gemma 3 270M Q4_K_M from the model cache (pyllama_so.models; skipped outside CI when missing)."""
    return real_model("gemma3-270m")
