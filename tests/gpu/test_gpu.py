"""CUDA builds: the GPU paths give the CPU's logits (skipped without CUDA devices)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from helpers.cuda_devices import cuda_device_count
from pyllama_so import Llama, _llama
from pyllama_so.archs import nmse
from pyllama_so.sampling import SamplingParams

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


def test_a_step_is_awaited_without_the_gil(small_model: Path) -> None:
    """decode_batch_sample_end() waits for a step left running on the GPU with the GIL released, so another
    Python thread runs meanwhile (a server's HTTP thread streams while the engine waits for its step)."""
    n = 16384  # one ubatch long enough that the GPU is still computing when the wait starts
    model = _llama.Model.load(small_model, n_gpu_layers=-1, split_mode="none")
    ctx = _llama.Context(model, n_ctx=n, n_batch=n, n_ubatch=n, n_seq_max=1, flash_attn="on")
    smp = _llama.Sampler(model, SamplingParams(temperature=0.0))
    counts = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counts[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        c0 = counts[0]
        time.sleep(0.05)  # the GIL free: the spinning thread's own rate
        rate = (counts[0] - c0) / 0.05
        prompt = list(np.random.default_rng(0).integers(0, model.n_vocab, n))
        ctx.decode_batch_sample_begin([(0, prompt, smp, None)])
        c0, t0 = counts[0], time.perf_counter()
        ctx.decode_batch_sample_end()
        waited, spun = time.perf_counter() - t0, counts[0] - c0
    finally:
        stop.set()
        thread.join()
        smp.free()
        ctx.free()
        model.free()
    assert waited > 1e-3, "the step ended before the wait began: nothing measured"
    assert spun > 0.3 * rate * waited, (spun, rate, waited)


def test_chained_steps_sample_what_separate_steps_do(tiny_model: Path) -> None:
    """decode_batch_sample_chain on a GPU (where llama_decode returns before the step is computed): the
    tokens of steps begun and ended apart, greedy and seeded."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=-1, split_mode="none")
    ctx = _llama.Context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=2)
    prompts = [list(range(3, 20)), list(range(40, 90))]
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=11)]
    runs = []
    try:
        for chained in (False, True):
            samplers = [_llama.Sampler(model, p) for p in params]
            got: list[list[int]] = [[], []]
            ctx.decode_batch_sample_begin([(i, p, samplers[i], None) for i, p in enumerate(prompts)])
            for _ in range(12):
                if chained:
                    outs, started, *_, error = ctx.decode_batch_sample_chain(
                        [(i, None, samplers[i], None, True) for i in range(2)])
                    assert error is None and len(started) == 2
                else:
                    outs = ctx.decode_batch_sample_end()
                for i, o in enumerate(outs):
                    got[i].append(o[0])
                if not chained:
                    ctx.decode_batch_sample_begin([(i, [got[i][-1]], samplers[i], None) for i in range(2)])
            for i, o in enumerate(ctx.decode_batch_sample_end()):
                got[i].append(o[0])
            runs.append(got)
            for i, smp in enumerate(samplers):
                smp.free()
                ctx.truncate(0, i)
    finally:
        ctx.free()
        model.free()
    assert runs[0] == runs[1]
