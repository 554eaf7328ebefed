"""scripts/so-timeline draws a PNG from an Nsight Systems SQLite export (here a small synthetic one)."""
from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS

SCRIPT = SCRIPTS / "so-timeline"


def _export(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, 'mul_mat')")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL "
                "(start INT, end INT, deviceId INT, streamId INT, shortName INT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY "
                "(start INT, end INT, deviceId INT, streamId INT, copyKind INT)")
    for lane, stream in enumerate((13, 21)):  # two lanes' streams on each of two devices, overlapping in time
        for dev in (0, 1):
            for k in range(20):
                t = k * 2_000_000 + lane * 1_000_000
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, 1)",
                            (t, t + 900_000, dev, stream))
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?, 2)",
                            (t + 900_000, t + 1_000_000, dev, stream + 1))
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


def _cupti_csv(path: Path) -> None:
    ms = 1_000_000
    rows = ["kind,device,stream,start_ns,end_ns,bytes,name",
            f"kernel,0,7,0,{10 * ms},0,mul_mat",           # lane 0
            f"kernel,0,9,{5 * ms},{15 * ms},0,flash_attn",  # lane 1, overlapping lane 0 for 5 ms
            f"memcpy,0,11,{15 * ms},{20 * ms},4096,D2H",
            f"kernel,1,7,0,{20 * ms},0,mul_mat",
            f"api,4242,-1,0,{1 * ms},0,cudaLaunchKernel",
            f"api,4242,-1,{10 * ms},{12 * ms},0,cudaStreamSynchronize"]
    path.write_text("\n".join(rows) + "\n")


def test_cupti_csv_summary_and_png(tmp_path: Path) -> None:
    csv_path = tmp_path / "trace.csv"
    _cupti_csv(csv_path)
    res = subprocess.run([sys.executable, str(SCRIPT), str(csv_path), "--no-plot", "--window-ms", "20",
                          "--end-ms", "20"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "GPU0: busy 75.0 %, two streams at once 25.0 %, copies in flight 25.0 % of 20.0 ms" in res.stdout
    assert "GPU1: busy 100.0 %, two streams at once 0.0 %, copies in flight 0.0 %" in res.stdout
    assert "host thread 4242: in CUDA calls 15.0 %, in synchronizing calls 10.0 %" in res.stdout
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    res = subprocess.run([sys.executable, str(SCRIPT), str(csv_path), "-o", str(png), "--window-ms", "20",
                          "--end-ms", "20"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "4 streams, 1 host threads" in res.stdout


def test_missing_input_is_an_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.csv"), "--no-plot"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no such file" in res.stderr


def test_steps_and_top_kernels_from_a_cupti_csv(tmp_path: Path) -> None:
    """Five decode steps of 10 ms: kernels for 6 ms (a 5 ms matmul, a 1 ms norm), the logits' 20 MiB copy for
    1 ms, then 3 ms without a kernel; small copies do not cut steps."""
    ms = 1_000_000
    lines = ["kind,device,stream,start_ns,end_ns,bytes,name"]
    for k in range(5):
        t = k * 10 * ms
        lines.append(f"kernel,0,7,{t},{t + 5 * ms},0,mul_mat")
        lines.append(f"kernel,0,7,{t + 5 * ms},{t + 6 * ms},0,rms_norm")
        lines.append(f"memcpy,0,7,{t + 6 * ms},{t + 7 * ms},{20 << 20},D2H")
        lines.append(f"memcpy,0,7,{t + 7 * ms},{t + 7 * ms + 1000},64,D2H")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(lines) + "\n")
    res = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--no-plot", "--window-ms", "50", "--end-ms", "49",
                          "--top-kernels", "2", "--steps-d2h", str(1 << 20)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "steps: 4 cut at D2H copies" in out
    assert "period 10.000 ms (p50 10.000, p90 10.000), the copy 1.000 ms (20.0 MiB)" in out
    assert "GPU0: kernels 6.000 ms a step (60.0 %), copy end to the next kernel 3.000 ms (p50 3.000, p90 3.000)" in out
    assert "kernel mul_mat: 5 calls, 25.00 ms" in out and "kernel rms_norm: 5 calls, 5.00 ms" in out
    assert out.index("kernel mul_mat") < out.index("kernel rms_norm")

    window = tmp_path / "window.csv.gz"
    # the last kernel ends at 46 ms: -end-ms -3 is 43 ms after the first, as 49 would be 49
    res = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--no-plot", "--window-ms", "30", "--end-ms", "-3",
                          "--steps-d2h", str(1 << 20)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "steps: 2 cut at D2H copies" in res.stdout  # the copies ending at 17, 27 and 37 ms of [13, 43]

    res = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--no-plot", "--window-ms", "15", "--end-ms", "49",
                          "--write-window", str(window)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    with gzip.open(window, "rt") as f:
        kept = f.read().splitlines()
    # [34, 49] ms: the records of steps 3 (its matmul ends at 35 ms) and 4, and nothing of the others
    assert kept[0] == lines[0] and kept[1:] == lines[1 + 4 * 3:]
    assert "(8 records of the window)" in res.stdout
