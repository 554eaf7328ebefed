"""The report of scripts/server-load: the hardware and commit it ran on, and its tables of the runs."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def hardware() -> dict[str, Any]:
    hw: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)"):
                hw[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if shutil.which("nvidia-smi"):
        res = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        hw["gpus"] = [g.strip() for g in res.stdout.splitlines() if g.strip()]
    return hw


def commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=REPO).stdout.strip()
    head = git("rev-parse", "--short=12", "HEAD")
    return head + ("-dirty" if head and git("status", "--porcelain", "--untracked-files=no") else "")


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def phases(steps: dict[str, Any] | None) -> str:
    if not steps or "wait_ms_mean" not in steps:
        return "-"
    return " / ".join(fmt(steps[f"{k}_ms_mean"], 2) for k in ("issue", "stream", "wait"))


def tables(runs: list[dict[str, Any]]) -> str:
    out = []
    load = [r for r in runs if r["scenario"] == "load"]
    if load:
        out += ["| server | C | requests | errors | output tok/s | decode tok/s, all C | TTFT p50 ms | TTFT p90 ms "
                "| ITL p50 ms | ITL p90 ms | host ms/step | issue / stream / wait ms |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {fmt(r['output_tps'])} | "
                f"{fmt(r['full_decode_tps'])} | "
                f"{fmt(r['ttft_ms']['p50'])} | {fmt(r['ttft_ms']['p90'])} | {fmt(r['itl_ms']['p50'], 2)} | "
                f"{fmt(r['itl_ms']['p90'], 2)} | {fmt((r.get('engine_steps') or {}).get('host_ms_mean'), 3)} | "
                f"{phases(r.get('engine_steps'))} |"
                for r in load]
    mixed = [r for r in runs if r["scenario"] == "mixed"]
    if mixed:
        if out:
            out.append("")
        out += ["| server | C | long prompts | prompt t/s | ITL p50 ms alone | ITL p90 ms alone | ITL p50 ms mixed | "
                "ITL p90 ms mixed | errors |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['server']} | {r['concurrency']} | {','.join(str(x['tokens']) for x in r['long_prompts'])} | "
                f"{fmt(r['prompt_tps'])} | {fmt(r['itl_ms_alone']['p50'], 2)} | {fmt(r['itl_ms_alone']['p90'], 2)} | "
                f"{fmt(r['itl_ms_mixed']['p50'], 2)} | {fmt(r['itl_ms_mixed']['p90'], 2)} | {r['errors']} |"
                for r in mixed]
    return "\n".join(out)
