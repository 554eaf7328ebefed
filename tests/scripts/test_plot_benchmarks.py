"""scripts/plot-benchmarks draws the plots of docs/benchmarks.md from the committed raw results."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

SCRIPT = REPO / "scripts" / "plot-benchmarks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED = ("allreduce-time-vs-size.png", "tensor-split-pp2048-by-ubatch.png", "split-overlap-pp2048-two-gpus.png",
            "pp2048-by-ubatch-two-gpus.png")


def test_plots_from_the_committed_raw_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = subprocess.run([sys.executable, str(SCRIPT), "--raw", str(REPO / "docs" / "bench-raw"),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for name in EXPECTED:
        png = tmp_path / name
        assert png.is_file(), f"{name} not written: {res.stdout}{res.stderr}"
        data = png.read_bytes()
        assert len(data) > len(PNG_MAGIC) and data.startswith(PNG_MAGIC), name


def test_the_docs_show_the_plots() -> None:
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    for name in EXPECTED:
        assert (REPO / "docs" / "img" / name).is_file()
        assert f"img/{name}" in doc


def test_no_raw_data_is_an_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = subprocess.run([sys.executable, str(SCRIPT), "--raw", str(tmp_path), "--out", str(tmp_path / "img")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "no " in res.stderr and not (tmp_path / "img").exists()
