"""KL divergence of split configurations against a reference, per model: the precision table of docs/benchmarks.md.

    scripts/precision-table --rows cpu -m SmolLM2-135M-Instruct.Q4_1.gguf -m gemma-3-270m-q4_k_m.gguf --out OUT
    CUDA_VISIBLE_DEVICES=0 scripts/precision-table --rows gpu -m A.gguf -m B.gguf --out OUT   # one H200, two devices

Each model gets one `python -m pyllama_so.perplexity --kl-divergence-base` run of the reference row, then one
`--kl-divergence` run per other row, all on the same chunks of the bundled text (-c, --chunks). Every run is a process
of its own with the row's environment (the CPU virtual devices and the CUDA AllReduce switches are read when the
library starts). No network is needed: the models are paths, the text ships with the package. Writes
OUT/precision.jsonl (the tool's JSON per row, with `row` and `env` added) and prints a markdown table.

Rows (--rows cpu): the reference is the CPU alone (one device) at the default -ub 512; then the CPU at -ub 64 (what a
ubatch size alone changes: nothing, the CPU's kernels do not depend on it), the CPU without flash attention (the same
attention in another order of operations: what a rounding difference of one device does to the model), and tensor
split over 2 and 3 CPU virtual devices (GGML_CPU_VIRTUAL_DEVICES), with split overlap (-so 1, ubatches of 256) and
with the attention on one device (-as 1/0, 0/1).
Rows (--rows gpu; two CUDA devices on GPU 0 by GGML_CUDA_DEVICES=2, so run it with one visible GPU): the reference is
tensor split with every reduction in F32 (GGML_CUDA_AR_CE=0, the internal pipeline with GGML_CUDA_AR_BF16_THRESHOLD=0);
then one CUDA device (-sm none), the internal pipeline as upstream routes it (BF16 round trip, GGML_CUDA_AR_CE=0),
the copy engines for every reduction (BF16 on the wire, F32 sum: GGML_CUDA_AR_CE=1 GGML_CUDA_AR_CE_MIN_BYTES=1),
the default routing (internal below 512 KiB, copy engines above), the copy engines with -so 1, and the meta backend's
generic F32 reduction (GGML_CUDA_ALLREDUCE=none). docs/multi-gpu.md describes the paths.
Rows (--rows gpu-one; the same devices): the reference is one CUDA device at -ub 512; then the same device at -ub 64,
128 and 256 (what a ubatch size alone changes on the GPU, whose kernels depend on the batch size) and without flash
attention, and tensor split with the default routing, the copy engines, the copy engines with -so 1 and F32
reductions.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# label -> (environment, perplexity flags); the first row of each set is the reference
CPU_ROWS: dict[str, tuple[dict[str, str], list[str]]] = {
    "CPU -ub 512 (reference)": ({}, ["-sm", "none", "-ngl", "0"]),
    "CPU -ub 64": ({}, ["-sm", "none", "-ngl", "0", "-ub", "64"]),
    "CPU -fa off": ({}, ["-sm", "none", "-ngl", "0", "-fa", "off"]),
    "Meta 2 CPUV": ({"GGML_CPU_VIRTUAL_DEVICES": "2"}, ["-sm", "tensor"]),
    "Meta 2 CPUV -so 1": ({"GGML_CPU_VIRTUAL_DEVICES": "2"}, ["-sm", "tensor", "-so", "1"]),
    "Meta 3 CPUV": ({"GGML_CPU_VIRTUAL_DEVICES": "3"}, ["-sm", "tensor"]),
    "Meta 3 CPUV -so 1": ({"GGML_CPU_VIRTUAL_DEVICES": "3"}, ["-sm", "tensor", "-so", "1"]),
    "Meta 2 CPUV -as 1/0": ({"GGML_CPU_VIRTUAL_DEVICES": "2"}, ["-sm", "tensor", "-as", "1/0"]),
    "Meta 2 CPUV -as 0/1": ({"GGML_CPU_VIRTUAL_DEVICES": "2"}, ["-sm", "tensor", "-as", "0/1"]),
}
_TWO = {"GGML_CUDA_DEVICES": "2"}
_CE = {**_TWO, "GGML_CUDA_AR_CE": "1", "GGML_CUDA_AR_CE_MIN_BYTES": "1"}
GPU_ROWS: dict[str, tuple[dict[str, str], list[str]]] = {
    "tensor, F32 reductions (reference)": ({**_TWO, "GGML_CUDA_AR_CE": "0", "GGML_CUDA_AR_BF16_THRESHOLD": "0"},
                                           ["-sm", "tensor"]),
    "one CUDA device": ({}, ["-sm", "none"]),
    "tensor, internal (BF16 round trip)": ({**_TWO, "GGML_CUDA_AR_CE": "0"}, ["-sm", "tensor"]),
    "tensor, copy engines (BF16 wire, F32 sum)": (_CE, ["-sm", "tensor"]),
    "tensor, default routing": (_TWO, ["-sm", "tensor"]),
    "tensor, copy engines, -so 1": (_CE, ["-sm", "tensor", "-so", "1"]),
    "tensor, generic F32 (GGML_CUDA_ALLREDUCE=none)": ({**_TWO, "GGML_CUDA_ALLREDUCE": "none"}, ["-sm", "tensor"]),
}
# the yardstick on the GPU: against one CUDA device, what one device's own ubatch size changes (its kernels
# differ by batch size) next to what the split changes
GPU_ONE_ROWS: dict[str, tuple[dict[str, str], list[str]]] = {
    "one CUDA device -ub 512 (reference)": ({}, ["-sm", "none"]),
    "one CUDA device -ub 64": ({}, ["-sm", "none", "-ub", "64"]),
    "one CUDA device -ub 128": ({}, ["-sm", "none", "-ub", "128"]),
    "one CUDA device -ub 256": ({}, ["-sm", "none", "-ub", "256"]),
    "one CUDA device -fa off": ({}, ["-sm", "none", "-fa", "off"]),
    "tensor, default routing": (_TWO, ["-sm", "tensor"]),
    "tensor, copy engines (BF16 wire, F32 sum)": (_CE, ["-sm", "tensor"]),
    "tensor, copy engines, -so 1": (_CE, ["-sm", "tensor", "-so", "1"]),
    "tensor, F32 reductions": ({**_TWO, "GGML_CUDA_AR_CE": "0", "GGML_CUDA_AR_BF16_THRESHOLD": "0"}, ["-sm", "tensor"]),
}
ROWS = {"cpu": CPU_ROWS, "gpu": GPU_ROWS, "gpu-one": GPU_ONE_ROWS}
# variables of the rows: cleared for every run, so that each row has exactly its own
_ROW_VARS = {k for rows in ROWS.values() for env, _ in rows.values() for k in env}


def perplexity(model: str, env: dict[str, str], flags: list[str], common: list[str], base: Path,
               compare: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pyllama_so.perplexity", "-m", model, *common, *flags,
           "--kl-divergence-base", str(base), "-o", "json"] + (["--kl-divergence"] if compare else [])
    run_env = {k: v for k, v in os.environ.items() if k not in _ROW_VARS and not k.startswith("LLAMA_ARG_")}
    res = subprocess.run(cmd, env={**run_env, **env}, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| model | configuration | mean KLD | max KLD | 99 % KLD | same top | PPL | PPL / PPL(ref) | s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        k = r["kld"]
        ppl = f"{r['ppl']:.4f}"
        if k is None:
            lines.append(f"| {r['model_file']} | {r['row']} | | | | | {ppl} | | {r['seconds']:.0f} |")
            continue
        lines.append(f"| {r['model_file']} | {r['row']} | {k['kld_mean']:.3g} ± {k['kld_stderr']:.1g} | "
                     f"{k['kld_max']:.3g} | {k['kld_p99']:.3g} | {100 * k['same_top']:.2f} % | {ppl} | "
                     f"{k['ppl_ratio']:.5f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", choices=list(ROWS), required=True)
    ap.add_argument("-m", "--model", action="append", required=True, help="a GGUF file; repeat for several")
    ap.add_argument("--only", action="append",
                    help="a row label to run after the reference; repeat for several, or give labels without commas "
                         "comma-separated (default: every row)")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("-t", "--threads", type=int, default=None, help="perplexity's -t (default: its own)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = ROWS[args.rows]
    labels = list(rows)
    if args.only:
        # a whole label first: most GPU labels hold commas themselves
        wanted = [w for o in args.only for w in ([o] if o in rows else [s.strip() for s in o.split(",")])]
        unknown = [w for w in wanted if w not in rows]
        if unknown:
            ap.error(f"unknown rows {unknown}; have {labels}")
        labels = [labels[0]] + [w for w in wanted if w != labels[0]]
    for m in args.model:
        if not os.path.isfile(m):
            ap.error(f"model file not found: {m}")
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["-c", str(args.ctx_size), "--chunks", str(args.chunks), "--no-progress"]
    if args.threads:
        common += ["-t", str(args.threads)]
    records = []
    with (args.out / "precision.jsonl").open("a") as log:
        for model in args.model:
            base = args.out / f"{Path(model).stem}.{args.rows}-base.npz"
            for i, label in enumerate(labels):
                env, flags = rows[label]
                t0 = time.monotonic()
                print(f"precision-table: {Path(model).name}: {label}", file=sys.stderr, flush=True)
                try:
                    rec = perplexity(model, env, flags, common, base, compare=i > 0)
                except RuntimeError as e:
                    print(f"precision-table: {e}", file=sys.stderr)
                    if i == 0:
                        return 1  # no reference, no rows
                    continue
                rec.update(row=label, env=env, flags=flags, model_file=Path(model).name,
                           wall_s=time.monotonic() - t0)
                log.write(json.dumps(rec) + "\n")
                log.flush()
                records.append(rec)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
