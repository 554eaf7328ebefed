"""Where a server load's time went, from our server's --step-log: the log cut into runs where the engine
idled longer than --gap-s, and per run its steps by kind (generating slots only, or with a prompt piece):
how many, their mean time and phases, the tokens they generated, and the time between steps (the host's
gaps, and the engine idle for want of work).

    python -m pyllama_so.server -m MODEL --step-log steps.jsonl ...   # then a load, e.g. scripts/server-load
    scripts/step-log-summary steps.jsonl [--json out.json]
    scripts/step-log-summary before.jsonl.gz after.jsonl.gz --gap-s 0.08 --plot steps.png --plot-run=0

With --plot, each log's run --plot-run is drawn: the time of each step that holds no prompt piece.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

PHASES = ("host", "issue", "stream", "wait")


def runs_of(steps: list[dict[str, Any]], gap_s: float) -> list[list[dict[str, Any]]]:
    """Consecutive steps, cut where one starts more than gap_s after the one before ended."""
    runs: list[list[dict[str, Any]]] = []
    end = None
    for st in steps:
        if end is None or st["t_start_s"] - end > gap_s:
            runs.append([])
        runs[-1].append(st)
        end = st["t_start_s"] + st["ms"] / 1e3
    return runs


def summarize(run: list[dict[str, Any]]) -> dict[str, Any]:
    span = run[-1]["t_start_s"] + run[-1]["ms"] / 1e3 - run[0]["t_start_s"]
    between = sum(max(0.0, b["t_start_s"] - (a["t_start_s"] + a["ms"] / 1e3)) for a, b in pairwise(run))
    out: dict[str, Any] = {"steps": len(run), "seconds": span, "between_steps_s": between,
                           "generated": sum(st["generating"] for st in run),
                           "prompt_tokens": sum(st["prompt_tokens"] for st in run)}
    kinds: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
        ("generate_only", lambda st: st["prompt_tokens"] == 0), ("with_prompt", lambda st: st["prompt_tokens"] > 0))
    for kind, pick in kinds:
        sel = [st for st in run if pick(st)]
        if not sel:
            continue
        out[kind] = {"steps": len(sel), "seconds": sum(st["ms"] for st in sel) / 1e3,
                     "mean_ms": sum(st["ms"] for st in sel) / len(sel),
                     "generating_mean": sum(st["generating"] for st in sel) / len(sel),
                     "prompt_tokens_mean": sum(st["prompt_tokens"] for st in sel) / len(sel),
                     **{f"{p}_ms_mean": sum(st[f"{p}_ms"] for st in sel) / len(sel) for p in PHASES}}
    return out


def table(runs: list[dict[str, Any]]) -> str:
    rows = ["| run | steps | s | generated | prompt tokens | between steps s | kind | steps | s | ms a step "
            "| generating | prompt tokens a step | host / issue / stream / wait ms |",
            "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for i, r in enumerate(runs):
        head = (f"| {i} | {r['steps']} | {r['seconds']:.3f} | {r['generated']} | {r['prompt_tokens']} "
                f"| {r['between_steps_s']:.3f}")
        for kind in ("generate_only", "with_prompt"):
            k = r.get(kind)
            if k is None:
                continue
            phases = " / ".join(f"{k[f'{p}_ms_mean']:.2f}" for p in PHASES)
            rows.append(f"{head} | {kind.replace('_', ' ')} | {k['steps']} | {k['seconds']:.3f} | {k['mean_ms']:.2f} "
                        f"| {k['generating_mean']:.1f} | {k['prompt_tokens_mean']:.0f} | {phases} |")
            head = "| | | | | |"
    return "\n".join(rows)


def read_log(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(logs: list[tuple[str, list[dict[str, Any]]]], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for name, run in logs:
        xs = [i for i, st in enumerate(run) if st["prompt_tokens"] == 0]
        ax.scatter(xs, [run[i]["ms"] for i in xs], s=5, label=name)
    ax.set_xlabel("step of the run")
    ax.set_ylabel("ms, steps without a prompt piece")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path, nargs="+", help="the server's --step-log files (.gz read as gzip)")
    ap.add_argument("--gap-s", type=float, default=0.5, help="idle seconds that end a run (default 0.5)")
    ap.add_argument("--min-steps", type=int, default=20,
                    help="runs of fewer steps (a warm-up) are left out (default 20)")
    ap.add_argument("--json", type=Path, help="write the runs' numbers here (of the first log)")
    ap.add_argument("--plot", type=Path, metavar="PNG", help="draw each log's run --plot-run (needs matplotlib)")
    ap.add_argument("--plot-run", type=int, default=0, help="the run to draw, counted as in the table (default 0)")
    ap.add_argument("--labels", help="the logs' names in the plot, comma-separated (default: the file names)")
    ap.add_argument("--title", default="server steps (--step-log)")
    a = ap.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [p.name for p in a.logs]
    if len(labels) != len(a.logs):
        ap.error(f"--labels names {len(labels)} logs, {len(a.logs)} given")
    drawn = []
    for n, path in enumerate(a.logs):
        if not path.is_file():
            ap.error(f"{path}: no such file")
        try:
            steps = read_log(path)
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
            print(f"step-log-summary: {path}: not a step log: {e}", file=sys.stderr)
            return 1
        kept = [r for r in runs_of(steps, a.gap_s) if len(r) >= a.min_steps]
        if not kept:
            print(f"step-log-summary: {path}: no run of {a.min_steps} steps or more", file=sys.stderr)
            return 1
        runs = [summarize(r) for r in kept]
        print(f"{path}:\n{table(runs)}")
        if a.json and n == 0:
            a.json.write_text(json.dumps(runs, indent=1) + "\n")
        if a.plot:
            if not 0 <= a.plot_run < len(kept):
                print(f"step-log-summary: {path} has {len(kept)} runs, no run {a.plot_run}", file=sys.stderr)
                return 1
            drawn.append((labels[n], kept[a.plot_run]))
    if a.plot:
        try:
            plot(drawn, a.plot, a.title)
        except ImportError:
            print("step-log-summary: --plot needs matplotlib", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
