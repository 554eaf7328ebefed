"""Embeddings under tensor split (the Meta backend) over two CPU virtual devices equal those of one device,
for several inputs at once (each goes in its own batch there: embeddings.embedding_sequences); LoRA under
tensor split is refused; the same embeddings over CUDA devices (marked gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from helpers.cuda_devices import cuda_device_count
from pyllama_so import Llama, archs, synth

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
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert float(((g - w) ** 2).sum() / (w ** 2).sum()) < 1e-5



def test_lora_under_tensor_split_is_a_value_error(tiny_model: Path, tmp_path: Path) -> None:
    """llama.cpp's Meta backend aborts on a LoRA adapter's tensors (GGML_ASSERT on an unknown split axis in
    ggml-backend-meta.cpp), so Llama refuses the combination before loading."""
    lora = synth.write_lora(tmp_path / "lora.gguf", synth.lora_weights("tiny"))
    with pytest.raises(ValueError, match='split_mode="tensor"'):
        Llama(tiny_model, split_mode="tensor", lora_path=lora, n_ctx=256)


GPU_CHECK = """
import json, sys
import numpy as np
from pyllama_so import Llama
texts = ["hello world", "The quick brown fox", "0123456789"]
kw = dict(n_ctx=256, n_batch=64, embedding=True, flash_attn=True, n_threads=2)
out = {}
for pooling in ("mean", "none"):
    with Llama(sys.argv[1], split_mode="none", n_gpu_layers=0, pooling_type=pooling, **kw) as cpu:
        want = [np.array(e) for e in cpu.embed(texts)]
    with Llama(sys.argv[1], split_mode="tensor", pooling_type=pooling, **kw) as gpu:
        got = [np.array(e) for e in gpu.embed(texts)]
    out[pooling] = max(float(((w - g) ** 2).sum() / (w ** 2).sum()) for w, g in zip(want, got))
print(json.dumps(out))
"""


@pytest.mark.gpu
def test_gpu_tensor_split_embeddings_equal_the_cpu(tiny_model: Path) -> None:
    """Over two CUDA devices (two GPUs, else two devices of one): embeddings of several inputs under
    -sm tensor, pooled and per token, against the CPU."""
    env = dict(os.environ)
    if cuda_device_count() < 2:
        env["GGML_CUDA_DEVICES"] = "2"
    out = subprocess.run([sys.executable, "-c", GPU_CHECK, str(tiny_model)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mean"] < 1e-4 and result["none"] < 1e-4, result
