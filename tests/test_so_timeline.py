"""scripts/so-timeline draws a PNG from an Nsight Systems SQLite export (here a small synthetic one)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "so-timeline"


def _export(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, 'mul_mat')")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, shortName INT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT, copyKind INT)")
    for lane, stream in enumerate((13, 21)):  # two lanes' streams on each of two devices, overlapping in time
        for dev in (0, 1):
            for k in range(20):
                t = k * 2_000_000 + lane * 1_000_000
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, 1)", (t, t + 900_000, dev, stream))
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?, 2)", (t + 900_000, t + 1_000_000, dev, stream + 1))
    con.commit()
    con.close()


def test_timeline_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    db = tmp_path / "prof.sqlite"
    _export(db)
    png = tmp_path / "t.png"
    res = subprocess.run([sys.executable, str(SCRIPT), str(db), "-o", str(png), "--window-ms", "20"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "8 streams" in res.stdout  # 2 devices x (2 kernel streams + 2 copy streams)


def test_no_kernels_is_an_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    db = tmp_path / "empty.sqlite"
    sqlite3.connect(db).close()
    res = subprocess.run([sys.executable, str(SCRIPT), str(db), "-o", str(tmp_path / "t.png")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "no kernels" in res.stderr
