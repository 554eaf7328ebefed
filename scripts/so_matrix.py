"""Prompt processing on two GPUs by split mode, AllReduce path and split overlap: one bench process per
configuration, the configurations interleaved over several rounds, peak VRAM per GPU, and a table of
the ratios that matter (best -so 1 against best -sm layer and against best NCCL without peer access).

    scripts/so-matrix --models qwen3-8b:q8_0,qwen3-8b:q4_k_m --rounds 3 --out OUT
    scripts/so-matrix --ubatches 256,512,1024,2048 --configs "one GPU -ub 512,layer -ub 512,..." --out OUT

With --ubatches, each configuration runs every listed ubatch instead of its own (one process per
configuration and round, the ubatches in turn inside it), and rows are labelled with their ubatch:
the data of pp2048 against ubatch (scripts/plot-benchmarks draws it).

Runs `python -m pyllama_so.bench` of the Python that runs this script, so put the build to measure on
its PYTHONPATH (after scripts/gpu-check's build: PYTHONPATH=/tmp/gpu-check/cuda). No peer access is
emulated for NCCL with NCCL_P2P_DISABLE=1 and the copy engines are forced with GGML_CUDA_AR_CE=1; the
`nvlink` rows keep peer access (NCCL over NVLink) for reference. Writes OUT/somatrix.jsonl (the bench's JSONL, with
`tool`, `model_spec`, `round` and `vram_peak_mib` added) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TextIO

from vram_peak import run_sampled  # scripts/vram_peak.py

NO_P2P = {"NCCL_P2P_DISABLE": "1"}

# label -> (environment, bench flags); -b 2048 -p 2048 -n 32 -fa 1 are added to all
CONFIGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "one GPU -ub 512": ({"CUDA_VISIBLE_DEVICES": "0"}, ["-sm", "none", "-ub", "512"]),
    "layer -ub 512": (NO_P2P, ["-sm", "layer", "-ub", "512"]),
    "layer -ub 1024": (NO_P2P, ["-sm", "layer", "-ub", "1024"]),
    "tensor NCCL no-P2P -ub 2048": ({**NO_P2P, "GGML_CUDA_AR_CE": "0"}, ["-sm", "tensor", "-so", "0", "-ub", "2048"]),
    "tensor CE -ub 2048": ({**NO_P2P, "GGML_CUDA_AR_CE": "1"}, ["-sm", "tensor", "-so", "0", "-ub", "2048"]),
    "tensor CE -so 1 -ub 512": ({**NO_P2P, "GGML_CUDA_AR_CE": "1"}, ["-sm", "tensor", "-so", "1", "-ub", "512"]),
    "tensor CE -so 1 -ub 1024": ({**NO_P2P, "GGML_CUDA_AR_CE": "1"}, ["-sm", "tensor", "-so", "1", "-ub", "1024"]),
    "tensor CE -so 1 -ub 1024 chunk 4 MiB": (
        {**NO_P2P, "GGML_CUDA_AR_CE": "1", "GGML_CUDA_AR_CE_CHUNK_BYTES": "4194304"},
        ["-sm", "tensor", "-so", "1", "-ub", "1024"]),
    "tensor CE -so 1 -ub 1024 one issue thread": ({**NO_P2P, "GGML_CUDA_AR_CE": "1", "GGML_META_LANES_THREADS": "0"},
                                                  ["-sm", "tensor", "-so", "1", "-ub", "1024"]),
    "tensor NCCL no-P2P -so 1 -ub 1024": ({**NO_P2P, "GGML_CUDA_AR_CE": "0"},
                                          ["-sm", "tensor", "-so", "1", "-ub", "1024"]),
    "nvlink tensor -ub 2048": ({}, ["-sm", "tensor", "-so", "0", "-ub", "2048"]),
    "nvlink tensor -so 1 -ub 1024": ({}, ["-sm", "tensor", "-so", "1", "-ub", "1024"]),
}
DEFAULT_CONFIGS = [c for c in CONFIGS if not c.startswith("nvlink")]


def model_path(work: Path, spec: str) -> Path:
    shape, wtype = spec.split(":")
    path = work / f"{shape}-{wtype}.gguf"
    if not path.exists():
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "pyllama_so.synth", shape, "-t", wtype, "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"so-matrix: wrote {path.name} in {time.time() - t0:.0f} s", flush=True)
    return path


def without_ubatch(label: str) -> tuple[str, dict[str, str], list[str]]:
    """A configuration's label and flags with its -ub dropped (for --ubatches)."""
    env_extra, flags = CONFIGS[label]
    i = flags.index("-ub")
    base = label.replace(f" -ub {flags[i + 1]}", "")
    return base, env_extra, flags[:i] + flags[i + 2:]


def run_one(model: Path, spec: str, label: str, rnd: int, args: argparse.Namespace, out: TextIO) -> bool:
    env_extra, flags = CONFIGS[label]
    if args.ubatches:
        label, env_extra, flags = without_ubatch(label)
        flags = [*flags, "-ub", args.ubatches]
    depth = ["-d", str(args.depth)] if args.depth else []
    cmd = [sys.executable, "-m", "pyllama_so.bench", "-m", str(model), *flags, *depth, "-fa", "1", "-b", "2048",
           "-p", "2048", "-n", "32", "-r", str(args.reps), "-o", "jsonl", "--no-progress"]
    if args.warmup_runs is not None:
        cmd += ["--warmup-runs", str(args.warmup_runs)]
    res, peak = run_sampled(cmd, env={**os.environ, **env_extra})
    if res.returncode != 0:
        print(f"so-matrix: {spec} {label}: exit {res.returncode}: {res.stderr.strip()[-400:]}", flush=True)
        return False
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            tool = f"{label} -ub {r['n_ubatch']}" if args.ubatches else label
            r.update(tool=tool, model_spec=spec, round=rnd, depth=args.depth, vram_peak_mib=peak)
            out.write(json.dumps(r) + "\n")
    out.flush()
    return True


def best(table: dict[tuple[str, str], list[float]], model: str, prefix: str) -> tuple[str, float] | None:
    """The configuration starting with prefix that has the highest mean for model, and that mean."""
    cands = {lab: statistics.mean(v) for (m, lab), v in table.items() if m == model and lab.startswith(prefix)}
    return max(cands.items(), key=lambda kv: kv[1]) if cands else None


def summary(path: Path) -> None:
    pp: dict[tuple[str, str], list[float]] = defaultdict(list)
    steady: dict[tuple[str, str], list[float]] = defaultdict(list)
    tg: dict[tuple[str, str], list[float]] = defaultdict(list)
    vram: dict[tuple[str, str], list[int]] = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        key = (r["model_spec"] + (f" d{r['depth']}" if r.get("depth") else ""), r["tool"])
        if r["n_prompt"]:
            pp[key].append(r["avg_ts"])
            steady[key].append(statistics.mean(r["samples_ts"][1:] or r["samples_ts"]))
            vram[key].append(max(r["vram_peak_mib"].values(), default=0))
        else:
            tg[key].append(r["avg_ts"])
    models = sorted({m for m, _ in pp})
    for m in models:
        print(f"\n{m}: pp2048 t/s, mean over processes (n); repetitions 2+ in brackets; tg32; "
              "peak VRAM of the fuller GPU")
        print("| config | n | pp2048 | [reps 2+] | tg32 | peak VRAM MiB |\n|---|---:|---:|---:|---:|---:|")
        order = {label: i for i, label in enumerate(CONFIGS)}
        for (mm, label), v in sorted(pp.items(), key=lambda kv: (order.get(kv[0][1], len(order)), kv[0][1])):
            if mm != m:
                continue
            t = tg.get((m, label), [])
            head = f"| {label} | {len(v)} | {statistics.mean(v):.0f} | [{statistics.mean(steady[(m, label)]):.0f}] |"
            print(f"{head} {statistics.mean(t):.1f} | {max(vram[(m, label)])} |" if t else f"{head} | |")
        for table, what in ((pp, "bench means"), (steady, "repetitions 2+")):
            so = best(table, m, "tensor CE -so 1")
            for name, prefix in (("best -sm layer", "layer"), ("best NCCL no-P2P -so 0", "tensor NCCL no-P2P -ub"),
                                 ("best CE -so 0", "tensor CE -ub")):
                other = best(table, m, prefix)
                if so and other:
                    print(f"{m} ({what}): best -so 1 ({so[0]}) / {name} ({other[0]}) = {so[1] / other[1]:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3-8b:q8_0", help="comma list of shape:type (python -m pyllama_so.synth)")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"comma list of: {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=3, help="processes per configuration, interleaved")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--depth", type=int, default=0, help="-d: tokens in the KV cache before the prompt")
    ap.add_argument("--warmup-runs", type=int, default=None, help="passed to the bench (default: its own)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/so-matrix"), help="where the models are written")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ubatches", default="", help="comma list of -ub values every configuration runs (see above)")
    ap.add_argument("--budget-s", type=float, default=480, help="no process starts after this many seconds")
    args = ap.parse_args()
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in labels if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s): {unknown}")
    if args.ubatches:
        try:
            if not all(int(u) > 0 for u in args.ubatches.split(",")):
                raise ValueError
        except ValueError:
            ap.error(f"--ubatches must be a comma list of positive integers, got {args.ubatches!r}")
        bases = [without_ubatch(c)[0] for c in labels]
        labels = [c for i, c in enumerate(labels) if bases[i] not in bases[:i]]  # one process per configuration
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "somatrix.jsonl"
    deadline = time.time() + args.budget_s
    ok = True
    with path.open("a") as out:
        for spec in args.models.split(","):
            model = model_path(args.work, spec)
            for rnd in range(args.rounds):
                for label in labels:
                    if time.time() > deadline:
                        print(f"so-matrix: out of time before {spec} {label} round {rnd + 1}", flush=True)
                        ok = False
                        break
                    ok &= run_one(model, spec, label, rnd, args, out)
    summary(path)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
