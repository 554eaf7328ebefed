"""scripts/generation-bench (generation from Python against the context's decode rate) on the tiny model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

SCRIPT = REPO / "scripts" / "generation-bench"


def test_reports_every_rate_and_ratio(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "gen.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "-m", str(tiny_model), "-p", "16", "-n", "8", "-r", "1",
                          "--streams", "1,3", "-t", "2", "--sampling-threads", "1,2", "--requests", "5",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    c = data["completion"]
    assert len(c["greedy"]["samples"]) == 1 and c["greedy"]["mean"] > 0 and c["default"]["mean"] > 0
    assert c["ratio_default_over_greedy"] == c["default"]["mean"] / c["greedy"]["mean"]
    assert [d["streams"] for d in data["decode"]] == [1, 3]
    for d in data["decode"]:
        assert all(d[m]["mean"] > 0 for m in ("raw", "outputs", "greedy", "sampled", "whole", "backend"))
        assert d["ratio_sampled_over_outputs"] == d["sampled"]["mean"] / d["outputs"]["mean"]
        assert d["backend"]["in_graph"] is True  # the CPU backend takes the default chain
        for mode in ("greedy", "sampled"):  # 8 steps of 1 or 3 rows, none with ties at the top of a random model
            assert d[mode]["prefilter_rows"] == {"picked": 8 * d["streams"], "whole": 0}
    assert "| streams | raw decode t/s | raw with outputs t/s |" in res.stdout and "| sampled / outputs |" in res.stdout
    assert set(data["row_ms"]) == {"default_prefilter", "default_whole", "greedy_prefilter", "greedy_whole"}
    assert all(v > 0 for v in data["row_ms"].values())
    assert all(set(d["sampled_by_threads"]) == {"1", "2"} for d in data["decode"])
    # the workload: 5 requests of 8 tokens in waves of 1 and of 3, on a context of 3 slots
    assert [w["streams"] for w in data["workload"]] == [1, 3] and all(w["mean"] > 0 for w in data["workload"])
    assert data["workload_context"]["slots"] == 3


def test_bad_stream_count_is_an_argparse_error() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--streams", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--streams" in res.stderr


def test_modes_pick_the_decode_modes(tiny_model: Path, tmp_path: Path) -> None:
    """--modes raw,greedy --no-completion (what a tracer wants): only those steps run, and only their ratio."""
    out = tmp_path / "gen.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "-m", str(tiny_model), "-p", "8", "-n", "4", "-r", "1",
                          "--streams", "2", "-t", "2", "--requests", "0", "--modes", "raw,greedy", "--no-completion",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert "completion" not in data and "row_ms" not in data and "workload" not in data
    (d,) = data["decode"]
    assert {k for k in d if not k.startswith("ratio_")} == {"streams", "raw", "greedy", "sampling_threads_default"}
    assert set(k for k in d if k.startswith("ratio_")) == {"ratio_greedy_over_raw"}
    assert "| streams | raw decode t/s | greedy rows t/s | greedy / raw |" in res.stdout


def test_bad_modes_are_argparse_errors() -> None:
    for argv in (["--modes", "raw,bogus"], ["--modes", "raw", "--sampling-threads", "2"]):
        res = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "--modes" in res.stderr, argv
