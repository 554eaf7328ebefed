"""scripts/precision-table (docs/benchmarks.md's precision table) on the tiny model: every CPU row against the CPU
reference, and its GPU rows on two CUDA devices (gpu mark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from helpers.split_devices import cuda_device_pair

SCRIPT = SCRIPTS / "precision-table"


def _run(rows: str, model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--rows", rows, "-m", str(model), "-c", "128", "--chunks", "2",
                           "-t", "2", "--out", str(out), *extra], capture_output=True, text=True, timeout=600)


def test_cpu_rows(tiny_model: Path, tmp_path: Path) -> None:
    res = _run("cpu", tiny_model, tmp_path)
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in (tmp_path / "precision.jsonl").read_text().splitlines()]
    assert [r["row"] for r in records] == ["CPU -ub 512 (reference)", "CPU -ub 64", "CPU -fa off", "Meta 2 CPUV",
                                           "Meta 2 CPUV -so 1", "Meta 3 CPUV", "Meta 3 CPUV -so 1",
                                           "Meta 2 CPUV -as 1/0", "Meta 2 CPUV -as 0/1"]
    assert records[0]["kld"] is None and all(r["n_chunk"] == 2 for r in records)
    for r in records[1:]:  # F16 random weights: rounding only
        assert r["kld"]["kld_max"] < 1e-4 and r["kld"]["same_top"] == 1.0, r
    assert records[4]["split_overlap_stats"]["enabled"]
    table = res.stdout.splitlines()
    assert table[0].startswith("| model | configuration | mean KLD") and len(table) == 2 + len(records)


def test_only_takes_labels_with_commas(tiny_model: Path, tmp_path: Path) -> None:
    """--only repeats, and a label that holds commas (most GPU rows) is taken whole."""
    res = _run("cpu", tiny_model, tmp_path, "--only", "Meta 2 CPUV", "--only", "CPU -ub 64,Meta 3 CPUV")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line)["row"] for line in (tmp_path / "precision.jsonl").read_text().splitlines()]
    assert rows == ["CPU -ub 512 (reference)", "Meta 2 CPUV", "CPU -ub 64", "Meta 3 CPUV"]
    res = _run("gpu", tmp_path / "none.gguf", tmp_path, "--only", "tensor, copy engines, -so 1")
    assert res.returncode == 2 and "model file not found" in res.stderr  # the label was accepted


def test_unknown_row_and_missing_model(tiny_model: Path, tmp_path: Path) -> None:
    res = _run("cpu", tiny_model, tmp_path, "--only", "Meta 9")
    assert res.returncode == 2 and "unknown rows ['Meta 9']" in res.stderr
    res = _run("gpu", tmp_path / "none.gguf", tmp_path)
    assert res.returncode == 2 and "model file not found" in res.stderr


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "n_rows", "close_row"), [
    ("gpu", 7, "tensor, copy engines (BF16 wire, F32 sum)"),  # BF16 on the wire, near the F32 reductions
    ("gpu-one", 9, "tensor, F32 reductions"),  # against one CUDA device (its own -ub and -fa rows included)
])
def test_gpu_rows(tiny_model: Path, tmp_path: Path, rows: str, n_rows: int, close_row: str) -> None:
    """Two CUDA devices: every row of the set runs, and the row named stays close to the reference."""
    cuda_device_pair()
    res = _run(rows, tiny_model, tmp_path)
    assert res.returncode == 0, res.stderr
    records = {r["row"]: r for r in map(json.loads, (tmp_path / "precision.jsonl").read_text().splitlines())}
    assert len(records) == n_rows
    k = records[close_row]["kld"]
    assert k["kld_mean"] < 1e-3 and k["same_top"] >= 0.99, k
