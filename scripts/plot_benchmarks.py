"""Draw the plots of docs/benchmarks.md from the raw results in docs/bench-raw.

    scripts/plot-benchmarks                           # docs/bench-raw -> docs/img
    scripts/plot-benchmarks --raw DIR --out DIR

Writes:

  allreduce-time-vs-size.png          AllReduce time by payload size: the copy engines, NCCL without
                                      peer access (NCCL_P2P_DISABLE=1) and the pinned-copy ceiling,
                                      with NCCL time / copy-engine time beside it.
                                      Input: the newest *-allreduce-ce-vs-nccl.json
                                      (python -m pyllama_so.bench.allreduce --json).
  tensor-split-pp2048-by-ubatch.png   pp2048 t/s by -ub under -sm tensor: every process and the mean,
                                      per configuration (the "tool" field: nccl, ce, ...; also layer or
                                      none split rows if the raw data has them).
                                      Input: every *-tensor-split-ce-vs-nccl*.jsonl of the newest date
                                      (pyllama_so.bench -o jsonl, as scripts/gpu-check's tpbench stage
                                      writes it).
  split-overlap-pp2048-two-gpus.png   pp2048 t/s of each configuration of the split-overlap run on two
                                      GPUs (-sm layer, -sm tensor -so 0 and -so 1 by -ub): every
                                      process and the mean. Input: the newest
                                      *-split-overlap-two-gpus.jsonl (gpu-check's so2bench stage).
  pp2048-by-ubatch-two-gpus.png       pp2048 t/s against -ub on two GPUs without peer access: one GPU,
                                      -sm layer, -sm tensor with NCCL (NCCL_P2P_DISABLE=1), with the
                                      copy engines, and with the copy engines and split overlap; the
                                      mean over processes and every process. Input: the newest
                                      *-pp2048-by-ubatch-*.jsonl (scripts/so-matrix --ubatches).

Needs matplotlib (`python -m pip install "pyllama_so[plot]"` or `python -m pip install matplotlib`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent

ALLREDUCE_GLOB = "*-allreduce-ce-vs-nccl.json"
TENSOR_SPLIT_GLOB = "*-tensor-split-ce-vs-nccl*.jsonl"
SPLIT_OVERLAP_GLOB = "*-split-overlap-two-gpus.jsonl"
UBATCH_SWEEP_GLOB = "*-pp2048-by-ubatch-*.jsonl"
ALLREDUCE_PNG = "allreduce-time-vs-size.png"
TENSOR_SPLIT_PNG = "tensor-split-pp2048-by-ubatch.png"
SPLIT_OVERLAP_PNG = "split-overlap-pp2048-two-gpus.png"
UBATCH_SWEEP_PNG = "pp2048-by-ubatch-two-gpus.png"
# so-matrix configuration (its label without -ub) -> (legend, colour, marker)
SWEEP_STYLE = {
    "one GPU": ("one GPU", "tab:gray", "v"),
    "layer": ("-sm layer", "tab:green", "D"),
    "tensor NCCL no-P2P": ("-sm tensor, NCCL (NCCL_P2P_DISABLE=1)", "tab:orange", "s"),
    "tensor CE": ("-sm tensor, copy engines", "tab:blue", "o"),
    "tensor CE -so 1": ("-sm tensor, copy engines, -so 1", "tab:purple", "P"),
}

# path or configuration -> (label, colour, marker)
STYLE = {
    "ce": ("copy engines", "tab:blue", "o"),
    "nccl_nop2p": ("NCCL, NCCL_P2P_DISABLE=1", "tab:orange", "s"),
    "nccl": ("NCCL, NCCL_P2P_DISABLE=1", "tab:orange", "s"),  # the tensor-split baseline runs without P2P
    "ceiling": ("pinned-copy ceiling", "0.35", "^"),
    "layer": ("-sm layer", "tab:green", "D"),
    "none": ("one GPU (-sm none)", "tab:gray", "v"),
}


def newest(paths: list[Path]) -> list[Path]:
    """The files of the newest date (names start with YYYY-MM-DD)."""
    if not paths:
        return []
    date = max(p.name[:10] for p in paths)
    return sorted(p for p in paths if p.name[:10] == date)


def pp2048_rows(jsonl_paths: list[Path]) -> Iterator[dict[str, Any]]:
    """The pp2048 results (prompt only, no generation) of bench JSONL files, in order."""
    for p in jsonl_paths:
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("n_prompt") == 2048 and not r.get("n_gen"):
                    yield r


def size_label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def plot_allreduce(plt: ModuleType, report_path: Path, out: Path) -> Path:
    rep = json.loads(report_path.read_text())
    sizes = rep["sizes"]
    res = rep["results"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name in ("ceiling", "nccl_nop2p", "ce"):
        if name not in res or "us" not in res[name]:
            continue
        label, colour, marker = STYLE[name]
        ax.plot(sizes, res[name]["us"], marker=marker, color=colour, label=label,
                linestyle="--" if name == "ceiling" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [size_label(s) for s in sizes], rotation=30)
    ax.set_xlabel("payload (BF16 bytes crossing between the GPUs)")
    ax.set_ylabel("µs per AllReduce (lower is better)")
    ax.set_title("AllReduce, 2 GPUs without peer access")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if "ce" in res and "nccl_nop2p" in res:
        ratio = [b / t for b, t in zip(res["nccl_nop2p"]["us"], res["ce"]["us"], strict=True)]
        ax2.bar(range(len(sizes)), ratio, color=STYLE["ce"][1])
        for i, r in enumerate(ratio):
            ax2.text(i, r + 0.02, f"{r:.2f}", ha="center", fontsize=8)
        ax2.axhline(1.0, color="0.3", linewidth=1)
        ax2.set_xticks(range(len(sizes)), [size_label(s) for s in sizes], rotation=30)
        ax2.set_ylabel("NCCL no-P2P time / copy-engine time")
        ax2.set_title("speed-up over NCCL through host memory")
        ax2.set_ylim(0, max(ratio) * 1.15)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"python -m pyllama_so.bench.allreduce ({report_path.name})", fontsize=8, y=0.02)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = out / ALLREDUCE_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tensor_split(plt: ModuleType, jsonl_paths: list[Path], out: Path) -> Path:
    # (configuration, ubatch) -> avg_ts of each process
    runs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in pp2048_rows(jsonl_paths):
        split = str(r.get("split_mode", "tensor")).replace("LLAMA_SPLIT_MODE_", "").lower()
        config = r.get("tool", "ce") if split == "tensor" else split
        runs[(config, int(r["n_ubatch"]))].append(float(r["avg_ts"]))
    order = ["none", "layer", "nccl", "ce"]  # baselines left of the copy engines
    configs = sorted({c for c, _ in runs}, key=lambda c: order.index(c) if c in order else len(order))
    ubatches = sorted({u for _, u in runs})
    width = 0.8 / max(1, len(configs))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, config in enumerate(configs):
        label, colour, marker = STYLE.get(config, (config, None, "o"))
        if config == "nccl":
            label = "-sm tensor, NCCL (NCCL_P2P_DISABLE=1)"
        elif config == "ce":
            label = "-sm tensor, copy engines (GGML_CUDA_AR_CE=1)"
        xs, means = [], []
        for i, ub in enumerate(ubatches):
            v = runs.get((config, ub))
            if not v:
                continue
            x = i + (k - (len(configs) - 1) / 2) * width
            xs.append(x)
            means.append(statistics.mean(v))
            ax.scatter([x] * len(v), v, color="black", s=8, zorder=3)
        bars = ax.bar(xs, means, width=width * 0.95, color=colour, label=f"{label}, mean", alpha=0.85)
        for bar, m in zip(bars, means, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, m * 0.5, f"{m:,.0f}", ha="center", rotation=90,
                    fontsize=8, color="white")
    if "nccl" in configs and "ce" in configs:
        for i, ub in enumerate(ubatches):
            n, c = runs.get(("nccl", ub)), runs.get(("ce", ub))
            if n and c:
                top = max(max(n), max(c))
                ax.text(i, top * 1.02, f"{statistics.mean(c) / statistics.mean(n):.3f}×", ha="center", fontsize=9)
        ax.text(0.0, -0.1, "n.nnn×: copy-engine mean / NCCL mean at that -ub", transform=ax.transAxes, fontsize=8)
    ax.scatter([], [], color="black", s=8, label="one process (mean of 5 repetitions)")
    ax.set_xticks(range(len(ubatches)), [f"-ub {u}" for u in ubatches])
    ax.set_ylabel("pp2048 tokens/s (higher is better)")
    ax.set_title("Prompt processing, 8B F16, two H200s without peer access (emulated)")
    top = max((max(v) for v in runs.values()), default=1.0)
    ax.set_ylim(0, top * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / TENSOR_SPLIT_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_split_overlap(plt: ModuleType, jsonl_path: Path, out: Path) -> Path:
    # configuration (the "tool" field: the bench flags) -> avg_ts of each process, in the run's order
    runs: dict[str, list[float]] = {}
    for r in pp2048_rows([jsonl_path]):
        runs.setdefault(r["tool"], []).append(float(r["avg_ts"]))
    configs = list(runs)
    means = [statistics.mean(runs[c]) for c in configs]
    colours = ["tab:green" if "layer" in c else ("tab:blue" if "-so 1" in c else "tab:orange") for c in configs]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ys = range(len(configs))
    bars = ax.barh(ys, means, color=colours, alpha=0.85)
    for y, c in zip(ys, configs, strict=True):
        ax.scatter(runs[c], [y] * len(runs[c]), color="black", s=10, zorder=3)
    for bar, m in zip(bars, means, strict=True):
        ax.text(m * 0.02, bar.get_y() + bar.get_height() / 2, f"{m:,.0f}", va="center", fontsize=8, color="white")
    ax.set_yticks(list(ys), configs)
    ax.invert_yaxis()
    ax.set_xlabel("pp2048 tokens/s (higher is better); dots: one process each (mean of its repetitions)")
    ax.set_title("Split overlap: 8B Q8_0, two H200s without peer access (emulated), copy engines")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = out / SPLIT_OVERLAP_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_ubatch_sweep(plt: ModuleType, jsonl_path: Path, out: Path) -> Path:
    # configuration -> ubatch -> avg_ts of each process
    runs: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    model = ""
    for r in pp2048_rows([jsonl_path]):
        ub = int(r["n_ubatch"])
        runs[r["tool"].replace(f" -ub {ub}", "")][ub].append(float(r["avg_ts"]))
        model = r.get("model_spec", model)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    order = list(SWEEP_STYLE)
    for config in sorted(runs, key=lambda c: order.index(c) if c in order else len(order)):
        label, colour, marker = SWEEP_STYLE.get(config, (config, None, "o"))
        ubs = sorted(runs[config])
        ax.plot(ubs, [statistics.mean(runs[config][u]) for u in ubs], marker=marker, color=colour, label=label)
        for u in ubs:
            ax.scatter([u] * len(runs[config][u]), runs[config][u], color=colour, s=6, alpha=0.6, zorder=3)
    ubatches = sorted({u for per in runs.values() for u in per})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ubatches, [str(u) for u in ubatches])
    ax.set_xlabel("-ub (tokens per ubatch; -b 2048)")
    ax.set_ylabel("pp2048 tokens/s (higher is better)")
    ax.set_title(f"Prompt processing by ubatch, {model or 'synthetic model'}, two H200s without peer access (emulated)")
    ax.set_ylim(0, max(max(v) for per in runs.values() for v in per.values()) * 1.15)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"scripts/so-matrix --ubatches ({jsonl_path.name}); lines: mean over processes, "
                 "dots: one process each", fontsize=8, y=0.02)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = out / UBATCH_SWEEP_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, default=REPO / "docs" / "bench-raw",
                    help="raw results (default docs/bench-raw)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go (default docs/img)")
    args = ap.parse_args(argv)

    try:
        import matplotlib
    except ImportError:
        print("plot-benchmarks: needs matplotlib (python -m pip install matplotlib)", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allreduce = newest(sorted(args.raw.glob(ALLREDUCE_GLOB)))
    tensor_split = newest(sorted(args.raw.glob(TENSOR_SPLIT_GLOB)))
    split_overlap = newest(sorted(args.raw.glob(SPLIT_OVERLAP_GLOB)))
    ubatch_sweep = newest(sorted(args.raw.glob(UBATCH_SWEEP_GLOB)))
    if not allreduce and not tensor_split and not split_overlap and not ubatch_sweep:
        globs = ", ".join((ALLREDUCE_GLOB, TENSOR_SPLIT_GLOB, SPLIT_OVERLAP_GLOB, UBATCH_SWEEP_GLOB))
        print(f"plot-benchmarks: no raw results in {args.raw} (looked for {globs})", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update({"font.size": 9, "savefig.bbox": "tight"})
    written = []
    if allreduce:
        written.append(plot_allreduce(plt, allreduce[-1], args.out))
    if tensor_split:
        written.append(plot_tensor_split(plt, tensor_split, args.out))
    if split_overlap:
        written.append(plot_split_overlap(plt, split_overlap[-1], args.out))
    if ubatch_sweep:
        written.append(plot_ubatch_sweep(plt, ubatch_sweep[-1], args.out))
    for path in written:
        print(f"plot-benchmarks: {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
