"""Peak GPU memory while a process runs, for the benchmark scripts beside this file (so-matrix,
so-scenario, server-scenario, gpu-check). Imports nothing of pyllama_so: a CUDA context in the measuring
process would count too.

    python scripts/vram_peak.py CSV LABEL    # the peak of an nvidia-smi CSV log (gpu-check's vram_start)
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterable
from typing import Any


def add_samples(peak: dict[int, int], lines: Iterable[str]) -> None:
    """Raise peak[i] to each `index, memory.used` line of nvidia-smi's CSV (other lines are skipped)."""
    for line in lines:
        try:
            i, mib = (int(x) for x in line.split(","))
        except ValueError:
            continue
        peak[i] = max(peak.get(i, 0), mib)


def format_peak(peak: dict[int, int]) -> str:
    return ", ".join(f"GPU{i} {m} MiB" for i, m in sorted(peak.items()))


class VramSampler:
    """Peak memory.used per GPU index, from nvidia-smi every 200 ms; empty without an NVIDIA driver."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}
        try:
            self._proc: subprocess.Popen[str] | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:  # no NVIDIA driver: nothing to sample (CPU virtual devices)
            self._proc = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        if self._proc is None or self._proc.stdout is None:
            return
        add_samples(self.peak, self._proc.stdout)

    def stop(self) -> dict[int, int]:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        self._thread.join(timeout=2)
        return dict(self.peak)


def run_sampled(cmd: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], dict[int, int]]:
    """subprocess.run(cmd, capture_output=True, text=True, **kwargs) and the peak VRAM per GPU meanwhile."""
    sampler = VramSampler()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    finally:
        peak = sampler.stop()
    return res, peak


if __name__ == "__main__":
    csv_path, label = sys.argv[1:3]
    peak: dict[int, int] = {}
    with open(csv_path) as f:
        add_samples(peak, f)
    print(f"peak VRAM {label}: {format_peak(peak)}")
