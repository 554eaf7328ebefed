"""examples/: each one runs as a new user would run it (a subprocess), on the tiny model with small sizes.

Without two GPUs the examples make two CPU virtual devices themselves; GGML_CPU_VIRTUAL_DEVICES is taken
out of their environment so that they take that path the same way wherever the suite runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from pyllama_so import allreduce

EXAMPLES = REPO / "examples"


def run_example(name: str, *args: str | Path, cwd: Path | None = None) -> str:
    """Run examples/<name> with args; return its stdout (the test fails with stdout and stderr otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_VIRTUAL_DEVICES"}
    res = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_every_example_has_a_docstring_that_says_how_to_run_it() -> None:
    examples = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))  # _setup.py: shared helpers
    assert {p.name for p in examples} == {"generate.py", "allreduce_paths.py", "ubatch_sweep.py"}
    for path in examples:
        assert f"python examples/{path.name}" in path.read_text().split('"""')[1], path.name


def test_generate_streams_text_and_both_lanes_ran(tiny_model: Path) -> None:
    """A 200-byte prompt (one token per byte on the tiny model) in ubatches of 64: lane 1 takes every
    second full ubatch."""
    out = run_example("generate.py", "--model", tiny_model, "--prompt", "x" * 200, "--max-tokens", "6",
                      "--n-ubatch", "64")
    streamed, _, stats = out.partition("\n\n201 prompt tokens, 6 generated\n")  # the BOS token and the 200 bytes
    assert stats, out
    assert re.sub(r"^\d+ GPU\(s\) found: .*\n", "", streamed).strip(), out  # the text, after the devices line
    assert stats.startswith("split overlap: on\n"), out
    lanes = [int(n) for n in re.findall(r"^  lane \d: (\d+) ubatches", stats, re.M)]
    assert len(lanes) == 2 and min(lanes) > 0, out


def test_allreduce_paths_prints_counts_per_path_for_both_settings(tiny_model: Path) -> None:
    out = run_example("allreduce_paths.py", "--model", tiny_model, "--prompt-tokens", "128", "--decode-tokens", "2",
                      "--n-ubatch", "64")
    header = next(line for line in out.splitlines() if line.startswith("copy engines"))
    n = len(allreduce.PATHS)
    assert header.split()[-n:] == ["ce", "nccl", "internal", "fallback", "ll"], out
    rows = [line.split() for line in out.splitlines() if line.startswith(("auto ", "forced "))]
    assert [(r[0], r[1]) for r in rows] == [("auto", "prompt"), ("auto", "decode"),
                                            ("forced", "prompt"), ("forced", "decode")], out
    assert all(all(c.isdigit() for c in r[-n:]) for r in rows), out
    if not allreduce.allreduce_available():  # a CPU build: nothing counts the CPU virtual devices' reductions
        assert "this build has no CUDA backend: the counters stay at 0" in out
        assert all(r[-n:] == ["0"] * n for r in rows), out


def test_ubatch_sweep_writes_a_png(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    out = run_example("ubatch_sweep.py", "--model", tiny_model, "--n-prompt", "128", "--ubatch", "64,128",
                      "--repetitions", "1", "--output", png)
    assert {line.split(" ub ")[0].strip() for line in out.splitlines() if " ub " in line} == {
        "layer", "tensor", "tensor -so 1"}, out
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_ubatch_sweep_without_matplotlib_says_what_to_install(tiny_model: Path) -> None:
    """Checked before any benchmark runs: one line and exit status 1."""
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "  # None in sys.modules: import fails
            f"sys.argv = ['ubatch_sweep.py', '--model', {str(tiny_model)!r}]; "
            f"sys.path.insert(0, {str(EXAMPLES)!r}); "  # as `python examples/ubatch_sweep.py` has it
            f"runpy.run_path({str(EXAMPLES / 'ubatch_sweep.py')!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout == ""
    assert res.stderr.strip() == 'ubatch_sweep: the plot needs matplotlib: python -m pip install "pyllama_so[plot]"'
