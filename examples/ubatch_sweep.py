"""Prompt-processing speed against ubatch size for each split mode, saved as a PNG plot.

Runs the bench through its Python API (`pyllama_so.bench.run_benchmarks`, the same runs as
`python -m pyllama_so.bench -o json`) over ubatch sizes, for `-sm layer`, `-sm tensor` and
`-sm tensor -so 1` (split overlap), prints t/s per run and plots t/s against ubatch, one line per
split mode. Needs matplotlib: `python -m pip install "pyllama_so[plot]"`.

    python examples/ubatch_sweep.py                                    # writes ubatch_sweep.png
    python examples/ubatch_sweep.py --model model.gguf --n-prompt 4096 --ubatch 256,512,1024,2048,4096

Without two GPUs it runs on two CPU virtual devices (the numbers then say little about GPUs).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from _setup import add_model_args, model_path, tensor_split_devices  # examples/_setup.py
from pyllama_so import args as A
from pyllama_so.bench import BenchParams, TestResult, run_benchmarks


def label(result: TestResult) -> str:
    """The line a result belongs to: its split mode, with -so 1 for split overlap."""
    return result.model.split_mode + (" -so 1" if result.ctx.split_overlap else "")


def plot(results: list[TestResult], title: str, output: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: nothing needs a display

    lines: dict[str, list[TestResult]] = defaultdict(list)
    for r in results:
        lines[label(r)].append(r)
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, rs in lines.items():
        rs.sort(key=lambda r: r.ctx.n_ubatch)
        ax.errorbar([r.ctx.n_ubatch for r in rs], [r.avg_ts for r in rs], yerr=[r.stddev_ts for r in rs],
                    marker="o", capsize=3, label=name)
    ubatches = sorted({r.ctx.n_ubatch for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ubatches, [str(u) for u in ubatches])
    ax.set_xlabel("ubatch size (tokens)")
    ax.set_ylabel("prompt processing (t/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(output, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--n-prompt", type=int, default=2048, help="prompt tokens per run (default 2048)")
    ap.add_argument("--ubatch", type=A.comma_list(A.positive_int), default=[128, 256, 512, 1024, 2048],
                    help="comma list of ubatch sizes (default 128,256,512,1024,2048)")
    ap.add_argument("--repetitions", type=int, default=3, help="timed runs per point (default 3)")
    ap.add_argument("--output", type=Path, default=Path("ubatch_sweep.png"), help="PNG file (default ubatch_sweep.png)")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401  (checked before minutes of benchmarks, not after)
    except ImportError:
        print('ubatch_sweep: the plot needs matplotlib: python -m pip install "pyllama_so[plot]"', file=sys.stderr)
        return 1

    model = model_path(args)
    split = tensor_split_devices()
    params = BenchParams(
        models=[str(model)], n_prompt=[args.n_prompt], n_gen=[0], n_batch=[max(args.ubatch)], n_ubatch=args.ubatch,
        split_mode=["layer", "tensor"], split_overlap=[False, True],  # -so 1 runs with tensor only
        tensor_split=[tuple(split or ())], flash_attn=["on"], repetitions=args.repetitions)
    results: list[TestResult] = []
    for r in run_benchmarks(params, progress=False):
        print(f"{label(r):<14} ub {r.ctx.n_ubatch:>5}  {r.avg_ts:10.1f} ± {r.stddev_ts:.1f} t/s")
        results.append(r)

    plot(results, f"{model.name}: pp{args.n_prompt}", args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
