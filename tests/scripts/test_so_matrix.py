"""scripts/so-matrix (the split-overlap benchmark matrix of the GPU runs) on CPU virtual devices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

SCRIPT = REPO / "scripts" / "so-matrix"


def test_matrix_runs_interleaved_and_prints_the_ratios(tmp_path: Path) -> None:
    configs = ["layer -ub 512", "tensor CE -ub 2048", "tensor CE -so 1 -ub 512"]
    env = dict(os.environ, GGML_CPU_VIRTUAL_DEVICES="2")
    res = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny:f16", "--configs", ",".join(configs),
                          "--rounds", "2", "--reps", "1", "--work", str(tmp_path / "models"), "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [json.loads(line) for line in (tmp_path / "somatrix.jsonl").read_text().splitlines()]
    pp = [r for r in rows if r["n_prompt"]]
    assert [r["tool"] for r in pp] == configs * 2  # one process per configuration, rounds interleaved
    assert [r["round"] for r in pp] == [0, 0, 0, 1, 1, 1]
    so = [r for r in pp if "-so 1" in r["tool"]]
    assert all(r["split_overlap"]["enabled"] and min(r["split_overlap"]["ubatches"]) > 0 for r in so)
    assert "best -so 1 (tensor CE -so 1 -ub 512) / best -sm layer (layer -ub 512) = " in res.stdout


def test_unknown_configuration_is_an_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--configs", "layer -ub 3", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "unknown configuration" in res.stderr


def test_ubatch_sweep_runs_each_configuration_once_with_every_ubatch(tmp_path: Path) -> None:
    configs = ["layer -ub 512", "layer -ub 1024", "tensor CE -so 1 -ub 512"]
    env = dict(os.environ, GGML_CPU_VIRTUAL_DEVICES="2")
    res = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny:f16", "--configs", ",".join(configs),
                          "--ubatches", "64,128", "--rounds", "1", "--reps", "1", "--work", str(tmp_path / "models"),
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    pp = [json.loads(line) for line in (tmp_path / "somatrix.jsonl").read_text().splitlines()]
    pp = [r for r in pp if r["n_prompt"]]
    # the two layer configurations differ only in -ub: one process for both
    assert [r["tool"] for r in pp] == ["layer -ub 64", "layer -ub 128",
                                       "tensor CE -so 1 -ub 64", "tensor CE -so 1 -ub 128"]
    assert [r["n_ubatch"] for r in pp] == [64, 128, 64, 128]
    assert "best -so 1 (tensor CE -so 1 -ub " in res.stdout


def test_bad_ubatch_list_is_an_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--ubatches", "512,x", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--ubatches must be" in res.stderr
