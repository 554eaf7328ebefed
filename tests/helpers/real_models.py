"""The real models of pyllama_so.models in tests: their paths (a missing one skips the test outside CI and fails
it in CI, where .ci/run fetches them), and one device configuration run in a fresh process (an abort of
llama.cpp there fails that test, not the whole run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pytest

from helpers.logits_reference import log_softmax
from pyllama_so import _llama, models
from pyllama_so.perplexity import TEXT

WORKER = Path(__file__).with_name("real_model_worker.py")

# The tolerances of a split against one device with quantized weights: about 5x what was measured (the
# docstring of tests/multi_device/test_real_models_split.py says why they differ at all)
KLD_MAX, NMSE_MAX, SAME_TOP_MIN = 0.02, 1e-2, 0.85
COUNT = ("1, 2, 3, 4,", " 5, 6, 7")  # both models continue it so on the CPU (test_real_models.py)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def real_model(name: str) -> Path:
    path = models.find(name)
    if path is None:
        reason = (f"{name} is neither in the model cache ({models.cache_path(name)}) nor installed: "
                  f"python -m pyllama_so.models fetch {name}")
        if in_ci():
            pytest.fail(reason + " (CI is set, and .ci/run fetches the models)")
        pytest.skip(reason)
    return path


@dataclass
class Job:
    """What real_model_worker.py runs: the model on these devices, tokens decoded as one batch."""

    model: str
    tokens: list[int]
    devices: list[str] = field(default_factory=list)  # [] = the CPU; else names such as CPUV0
    split_mode: str = "none"
    attn_split: list[float] | None = None
    split_overlap: bool = False
    n_ubatch: int = 64
    n_ctx: int = 2048
    flash_attn: str = "auto"  # the default of Llama, the bench and the server (tensor split turns it on)
    logits_from: int = 0  # logits of the tokens from this index on
    toggle: bool = False  # upstream's causal-attention toggle check after the logits
    roundtrip: bool = False  # save with llama_model_saver, load, and compare the logits bitwise
    generate_after: str = ""  # then, from an empty cache, this text's greedy continuation one token at a time
    generate_tokens: int = 8


@dataclass
class Result:
    logits: np.ndarray
    split_overlap_stats: dict
    toggle_ok: bool | None
    roundtrip_equal: bool | None
    generated: str | None


def run_job(job: Job, tmp_path: Path, timeout: float = 600, env: dict[str, str] | None = None) -> Result:
    """Run job in a fresh Python with 3 CPU virtual devices (and env's variables); fail the test with the worker's
    log when it exits badly (naming the signal for an abort)."""
    out = tmp_path / f"job-{os.getpid()}-{len(list(tmp_path.iterdir()))}.npz"
    # no gdb backtrace on an abort: the assertion's line is what the failure shows
    full_env = {**os.environ, "GGML_CPU_VIRTUAL_DEVICES": "3", "GGML_NO_BACKTRACE": "1", **(env or {})}
    res = subprocess.run([sys.executable, str(WORKER), json.dumps(asdict(job)), str(out)], env=full_env,
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        how = (f"killed by {signal.Signals(-res.returncode).name}" if res.returncode < 0
               else f"exit status {res.returncode}")
        pytest.fail(f"{Path(job.model).name}: {job.split_mode} on {job.devices or 'the CPU'} (attn_split "
                    f"{job.attn_split}, split_overlap {job.split_overlap}): the worker ended with {how}:\n"
                    f"{res.stderr[-3000:]}")
    with np.load(out) as z:
        info = json.loads(str(z["info"]))
        return Result(z["logits"], info["split_overlap_stats"], info["toggle_ok"], info["roundtrip_equal"],
                      info["generated"])


def kld(ref: np.ndarray, x: np.ndarray) -> float:
    """Mean over rows of KL(softmax(ref) || softmax(x))."""
    lr, lx = log_softmax(ref), log_softmax(x)
    return float((np.exp(lr) * (lr - lx)).sum(axis=-1).mean())


def same_top(ref: np.ndarray, x: np.ndarray) -> float:
    return float((ref.argmax(axis=-1) == x.argmax(axis=-1)).mean())


def text_tokens(path: Path, n: int) -> list[int]:
    """The first n tokens of the bundled text (pyllama_so.perplexity's Alice) in the model's vocabulary."""
    model = _llama.Model.load(str(path), n_gpu_layers=0)
    try:
        toks = [int(t) for t in model.tokenize(TEXT.read_text(encoding="utf-8"))]
    finally:
        model.free()
    assert len(toks) >= n
    return toks[:n]
