"""The real models on CUDA devices: every split mode at ubatch 64 and 512, with and without split overlap and
attn_split, with the default AllReduce and the copy engines forced, against one CUDA device (skipped without two
CUDA devices; one GPU as two devices is enough: CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2).

Each configuration runs in a process of its own (tests/helpers/real_model_worker.py), so an abort fails that row
only. The models are those of pyllama_so.models (their cache), or the GGUF files named by PYLLAMA_SO_GPU_MODELS
(os.pathsep-separated: a GPU machine that receives at most 64 MiB per call gets smaller quantizations of them). The
prompt is longer than Gemma 3's sliding window (512), so -ub 512 makes two ubatches and split overlap runs both lanes.

Tolerances are test_real_models_split.py's: with quantized weights a split changes the order of sums, and one CUDA
device against the F32-reduced split is already at KLD 3e-3 (docs/benchmarks.md, precision on one H200).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from helpers.cuda_devices import cuda_device_count
from helpers.real_models import (
    COUNT,
    KLD_MAX,
    NMSE_MAX,
    SAME_TOP_MIN,
    Job,
    Result,
    kld,
    real_model,
    run_job,
    same_top,
    text_tokens,
)
from pyllama_so import archs, models

pytestmark = pytest.mark.gpu

N_TOKENS = 640
N_OUT = 64
C2 = ["CUDA0", "CUDA1"]
CE = {"GGML_CUDA_AR_CE": "1", "NCCL_P2P_DISABLE": "1"}  # the copy engines, as without peer access
REFERENCE = "CUDA0 -ub 512"
CONFIGS: dict[str, dict] = {
    "CUDA0 -ub 64": {"devices": ["CUDA0"], "split_mode": "layer", "n_ubatch": 64},
    "layer -ub 64": {"devices": C2, "split_mode": "layer", "n_ubatch": 64},
    "layer -ub 512": {"devices": C2, "split_mode": "layer", "n_ubatch": 512},
    "tensor -ub 64": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64},
    "tensor -ub 512": {"devices": C2, "split_mode": "tensor", "n_ubatch": 512},
    "tensor -ub 64 -so": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64, "split_overlap": True},
    "tensor -ub 512 -so": {"devices": C2, "split_mode": "tensor", "n_ubatch": 512, "split_overlap": True},
    "tensor -ub 64 -as 1/0": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64, "attn_split": [1.0, 0.0]},
    "tensor -ub 64 -as 0/1": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64, "attn_split": [0.0, 1.0]},
    "tensor -ub 64 ce": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64, "env": CE},
    "tensor -ub 512 ce": {"devices": C2, "split_mode": "tensor", "n_ubatch": 512, "env": CE},
    "tensor -ub 64 ce -so": {"devices": C2, "split_mode": "tensor", "n_ubatch": 64, "split_overlap": True,
                             "env": CE},
    "tensor -ub 512 ce -so": {"devices": C2, "split_mode": "tensor", "n_ubatch": 512, "split_overlap": True,
                              "env": CE},
}


# GGUF paths, or the names of pyllama_so.models (found when a test runs: no sha256 at collection)
MODELS = [p for p in os.environ.get("PYLLAMA_SO_GPU_MODELS", "").split(os.pathsep) if p] or list(models.MODELS)


def _path(model: str) -> Path:
    return real_model(model) if model in models.MODELS else Path(model)


class GpuRuns:
    """The rows of one model, each run once per module (the -so rows are compared with their plain rows)."""

    def __init__(self, path: Path, tmp: Path) -> None:
        self.path, self.tmp = path, tmp
        self.tokens = text_tokens(path, N_TOKENS)
        self.results: dict[str, Result | BaseException] = {}

    def run(self, label: str) -> Result:
        if label not in self.results:
            cfg = dict(CONFIGS[label]) if label != REFERENCE else {"devices": ["CUDA0"], "split_mode": "layer",
                                                                  "n_ubatch": 512}
            env = cfg.pop("env", {})
            job = Job(model=str(self.path), tokens=self.tokens, logits_from=N_TOKENS - N_OUT,
                      generate_after=COUNT[0], **cfg)
            try:
                self.results[label] = run_job(job, self.tmp, env=env)
            except BaseException as e:  # the rows that need this one fail at once
                self.results[label] = e
        got = self.results[label]
        if isinstance(got, BaseException):
            raise got
        return got


@pytest.fixture(scope="module")
def runs() -> dict[str, GpuRuns]:
    return {}


@pytest.mark.parametrize("label", list(CONFIGS))
@pytest.mark.parametrize("model", MODELS, ids=[Path(m).name for m in MODELS])
def test_real_model_on_cuda_devices(runs: dict[str, GpuRuns], tmp_path_factory: pytest.TempPathFactory,
                                    model: str, label: str) -> None:
    """No abort; logits within rounding of one CUDA device; the greedy continuation still counts on; a -so row
    ran both lanes and equals its plain row bitwise."""
    if cuda_device_count() < 2:
        pytest.skip("needs two CUDA devices (one GPU as two: GGML_CUDA_DEVICES=2)")
    if model not in runs:
        path = _path(model)
        runs[model] = GpuRuns(path, tmp_path_factory.mktemp(path.stem))
    r = runs[model]
    ref, got = r.run(REFERENCE), r.run(label)
    assert ref.generated is not None and ref.generated.startswith(COUNT[1]), f"reference: {ref.generated!r}"
    assert np.isfinite(got.logits).all(), f"{label}: non-finite logits"
    nmse, d, top = archs.nmse(ref.logits, got.logits), kld(ref.logits, got.logits), same_top(ref.logits, got.logits)
    assert nmse <= NMSE_MAX and d <= KLD_MAX and top >= SAME_TOP_MIN, \
        f"{label}: NMSE {nmse:.3e}, KLD {d:.3e}, same top token {top:.3f} against {REFERENCE}"
    assert got.generated is not None and got.generated.startswith(COUNT[1]), f"{label}: {got.generated!r}"
    if CONFIGS[label].get("split_overlap"):
        stats = got.split_overlap_stats
        assert stats["enabled"] and all(stats["ubatches"]), stats
        plain = r.run(label.removesuffix(" -so"))
        assert np.array_equal(got.logits, plain.logits), "split overlap changed the logits"
