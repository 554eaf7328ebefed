"""CUDA builds: the GPU paths give the CPU's logits (skipped without CUDA devices)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuda_devices import cuda_device_count

import pyllama_so
from pyllama_so import Llama
from pyllama_so.archs import nmse

pytestmark = pytest.mark.gpu
PROMPT = "Tensor parallel inference on two GPUs."


def logits(model: Path, **kw: object) -> np.ndarray:
    with Llama(model, n_ctx=256, **kw) as llm:  # type: ignore[arg-type]
        return llm.eval(llm.tokenize(PROMPT))


def test_cuda_is_compiled_in() -> None:
    info = pyllama_so.build_info()
    assert "CUDA" in info["compiled_backends"]


@pytest.fixture(scope="module")
def cpu_logits(tiny_model: Path) -> np.ndarray:
    return logits(tiny_model, n_gpu_layers=0, split_mode="none")


@pytest.mark.parametrize("split_mode", ["none", "layer", "tensor"])
def test_gpu_matches_cpu_device(tiny_model: Path, cpu_logits: np.ndarray, split_mode: str) -> None:
    if split_mode == "tensor" and cuda_device_count() < 2:
        pytest.skip("needs two CUDA devices (or GGML_CUDA_DEVICES=2)")
    got = logits(tiny_model, n_gpu_layers=-1, split_mode=split_mode)
    assert np.isfinite(got).all()
    assert nmse(cpu_logits, got) < 1e-4


def test_tensor_split_greedy_tokens_match_layer_split(tiny_model: Path) -> None:
    if cuda_device_count() < 2:
        pytest.skip("needs two CUDA devices")
    outs = []
    for sm in ("layer", "tensor"):
        with Llama(tiny_model, n_ctx=256, split_mode=sm) as llm:
            outs.append(list(llm.generate(llm.tokenize("abc"), max_tokens=16, temperature=0.0, stop_on_eog=False)))
    assert outs[0] == outs[1]
