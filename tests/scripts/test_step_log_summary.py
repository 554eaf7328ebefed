"""scripts/step-log-summary on a made-up --step-log: runs cut at idle gaps, steps by kind, time between steps."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS

SCRIPT = SCRIPTS / "step-log-summary"


def _step(i: int, t: float, ms: float, generating: int, prompt: int) -> dict:
    return {"step": i, "t_start_s": t, "generating": generating, "prompt_slots": int(prompt > 0),
            "prompt_tokens": prompt, "ms": ms, "host_ms": 0.5, "issue_ms": 2.0, "stream_ms": 0.5, "wait_ms": ms - 2.5}


def test_runs_kinds_and_gaps(tmp_path: Path) -> None:
    steps, t, i = [], 0.0, 0
    for _ in range(2):  # each: a prompt step of 50 ms, then 30 steps of 10 ms with 1 ms between them
        steps.append(_step(i, t, 50.0, 3, 512))
        t += 0.050 + 0.001
        i += 1
        for _ in range(30):
            steps.append(_step(i, t, 10.0, 4, 0))
            t += 0.010 + 0.001
            i += 1
        t += 2.0  # idle: the next run
    steps.insert(0, _step(-1, -5.0, 10.0, 1, 0))  # a warm-up step, alone: left out
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    out = tmp_path / "runs.json"
    res = subprocess.run([sys.executable, str(SCRIPT), str(log), "--json", str(out)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    runs = json.loads(out.read_text())
    assert len(runs) == 2
    for r in runs:
        assert r["steps"] == 31 and r["generated"] == 3 + 30 * 4 and r["prompt_tokens"] == 512
        assert abs(r["between_steps_s"] - 0.030) < 1e-9
        assert abs(r["seconds"] - (0.050 + 30 * 0.010 + 30 * 0.001)) < 1e-9
        assert r["generate_only"]["steps"] == 30 and abs(r["generate_only"]["mean_ms"] - 10.0) < 1e-9
        assert r["with_prompt"]["steps"] == 1 and r["with_prompt"]["prompt_tokens_mean"] == 512
    assert "generate only" in res.stdout and "with prompt" in res.stdout

    packed = tmp_path / "steps.jsonl.gz"  # a gzipped log reads the same; two logs, one plot
    packed.write_bytes(gzip.compress(log.read_bytes()))
    png = tmp_path / "steps.png"
    pytest.importorskip("matplotlib")
    res = subprocess.run([sys.executable, str(SCRIPT), str(log), str(packed), "--plot", str(png), "--plot-run", "1",
                          "--labels", "a,b"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("| 1 | 31 |") == 2 and png.read_bytes().startswith(b"\x89PNG")
    res = subprocess.run([sys.executable, str(SCRIPT), str(log), "--plot", str(png), "--plot-run", "2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "no run 2" in res.stderr


def test_not_a_step_log(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    res = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "not a step log" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.jsonl")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "no such file" in res.stderr
