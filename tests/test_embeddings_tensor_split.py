"""Embeddings under tensor split (the Meta backend) over two CPU virtual devices equal those of one device,
for several inputs at once (each goes in its own batch there: embeddings.embedding_sequences)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from pyllama_so import Llama, archs

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

TEXTS = ["hello world", "The quick brown fox", "0123456789"]


@pytest.mark.parametrize("pooling", ["mean", "last", "none"])
def test_tensor_split_embeddings_equal_one_devices(tiny_model: Path, pooling: str) -> None:
    archs.ensure_virtual_devices()
    split = [float(d["name"] in ("CPUV0", "CPUV1")) for d in pyllama_so.devices() if d["type"] in ("gpu", "igpu")]
    kw = dict(n_ctx=256, n_batch=64, embedding=True, pooling_type=pooling, flash_attn=True, n_threads=2)
    with Llama(tiny_model, split_mode="none", n_gpu_layers=0, **kw) as one:  # type: ignore[arg-type]
        want = [np.array(e) for e in one.embed(TEXTS)]
    with Llama(tiny_model, split_mode="tensor", tensor_split=split, **kw) as llm:  # type: ignore[arg-type]
        got = [np.array(e) for e in llm.embed(TEXTS)]
        assert llm.create_completion("hello", max_tokens=3, temperature=0)["usage"]["completion_tokens"] == 3
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert float(((g - w) ** 2).sum() / (w ** 2).sum()) < 1e-5
