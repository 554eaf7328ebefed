"""AllReduce benchmark for two GPUs: copy engines vs NCCL vs the internal pipeline vs the ceiling.

    python -m pyllama_so.bench.allreduce [--sizes 512K,2M,8M,32M] [--iters 50] [--paths ce,internal] [--json OUT]

Sizes are the 16-bit payload that crosses between the GPUs (as in docs/benchmarks.md and NCCL's
algBW); the reduced F32 tensor is twice as large. For each size it times, in one run:

  ce            the copy-engine path (copy engines forced, every size)
  ce_c<K>k      with --ce-sweep: the copy-engine path with a fixed chunk of K KiB (chunk_bytes)
                instead of the automatic 1 or 2 MiB
  nccl          NCCL as the machine allows (NVLink/peer access where present)
  nccl_nop2p    NCCL with NCCL_P2P_DISABLE=1, through host memory
  internal      llama.cpp's internal pipeline (GGML_CUDA_ALLREDUCE=internal)
  ll            the low-latency path (copy engines forced, every size up to its 4 MiB limit of F32;
                with --paths only: python -m pyllama_so.bench.allreduce --sizes 2K,8K,32K --paths ll,internal)

The copy-engine and low-latency paths get their settings (AllReduceParams) in this process; a setting they
leave unset takes its environment variable. nccl, nccl_nop2p and internal run in a child process each, with
upstream's variables in its environment (the CUDA backend reads GGML_CUDA_ALLREDUCE when it makes a comm
context, NCCL its variables once per process).
  ceiling       both GPUs copying the payload device->host and host->device at once (pinned),
                the bound for any reduction through host memory
  ceiling_c<K>k with --ce-sweep: the same traffic issued as copies of K KiB (the copy engines'
                own cost per copy, without any synchronization)

and prints time, algBW (payload / time), the ratio to the ceiling (ceiling time / time), the host
time to issue one reduction (when it comes close to the time, the path is bound by its API calls),
and the GPU time per reduction with the reductions queued before the GPUs start (host time left out).
Each path's reductions are checked against the counters, so a path that silently fell back to
another one is reported as such.

Exit status: 0 measured, 2 bad arguments, 3 skipped: needs a CUDA build and 2 CUDA devices (nothing
was measured; --json still gets a report saying so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from pyllama_so import _llama, args as A
from pyllama_so.allreduce import ENV_ALLREDUCE, LL_MAX_BYTES_LIMIT, AllReduceParams
from pyllama_so.bench import allreduce_rig

DEFAULT_SIZES = "512K,1M,2M,4M,8M,16M,32M"
EXIT_SKIPPED = 3  # nothing measured: a CPU build or fewer than two CUDA devices
SKIPPED = "skipped: needs a CUDA build and 2 CUDA devices"

class PathSetup(NamedTuple):
    """How one path is timed: the comm context's settings, upstream's variables for a child process (None: the
    path runs in this process) and the counter that must move."""

    params: AllReduceParams
    child_env: dict[str, str] | None
    counter: str


_CE = AllReduceParams(copy_engines=True, min_bytes=1)
_OFF = AllReduceParams(copy_engines=False)
# the copy engines on but above every size (the low-latency path comes after them in the routing)
_LL = AllReduceParams(copy_engines=True, min_bytes=1 << 40, ll_max_bytes=LL_MAX_BYTES_LIMIT)
SWEEP_CHUNKS_KIB = (256, 512, 1024, 2048, 4096)
CEILING_CHUNKS_KIB = (256, 512, 1024, 2048)
# --ce-sweep: the copy engines with each fixed chunk size, and the ceiling issued in chunks
SWEEP_PATHS = tuple(f"ce_c{kib}k" for kib in SWEEP_CHUNKS_KIB)
CEILING_ROWS = {f"ceiling_c{kib}k": kib << 10 for kib in CEILING_CHUNKS_KIB}
PATHS: dict[str, PathSetup] = {
    "ce": PathSetup(_CE, None, "ce"),
    **{name: PathSetup(AllReduceParams(copy_engines=True, min_bytes=1, chunk_bytes=kib << 10), None, "ce")
       for name, kib in zip(SWEEP_PATHS, SWEEP_CHUNKS_KIB, strict=True)},
    "nccl": PathSetup(_OFF, {ENV_ALLREDUCE: "nccl"}, "nccl"),
    "internal": PathSetup(_OFF, {ENV_ALLREDUCE: "internal"}, "internal"),
    "ll": PathSetup(_LL, None, "ll"),
}
ORDER = ("ce", "nccl", "nccl_nop2p", "internal")  # the default --paths
CHOICES = (*ORDER, "ll")


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in mult:
        value = int(float(text[:-1]) * mult[text[-1]])
    else:
        value = int(text)
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive multiple of 4 bytes")
    return value


def fmt_size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def time_path(path: str, sizes: Sequence[int], warmup: int, iters: int, devices: Sequence[int]) -> dict[str, Any]:
    """Times one comm-context path in this process; `sizes` are payloads (F32 tensor = 2x)."""
    params, _, counter = PATHS[path]
    _llama.allreduce_stats_reset()
    try:
        us, host_us, queued_us = allreduce_rig.allreduce_bench([2 * s for s in sizes], "comm", warmup, iters,
                                                               tuple(devices), host_time=True, allreduce=params)
    except _llama.LlamaError as e:
        return {"error": str(e)}
    stats = _llama.allreduce_stats()["paths"]
    ran = {name: v["calls"] for name, v in stats.items() if v["calls"]}
    out: dict[str, Any] = {"us": us, "host_us": host_us, "queued_us": queued_us, "paths_counted": ran}
    if set(ran) != {counter}:
        out["warning"] = f"expected every reduction on {counter!r}, counted {ran}"
    return out


def time_ceiling(sizes: Sequence[int], warmup: int, iters: int, devices: Sequence[int],
                 chunk_bytes: int | None = None) -> dict[str, Any]:
    """The pinned-copy ceiling; with chunk_bytes, the same traffic issued as copies of that size (else in copies of
    the chunk size that GGML_CUDA_AR_CE_CHUNK_BYTES sets, whole otherwise)."""
    params = None if chunk_bytes is None else AllReduceParams(chunk_bytes=chunk_bytes)
    try:
        return {"us": allreduce_rig.allreduce_bench(list(sizes), "ceiling", warmup, iters, tuple(devices),
                                                    allreduce=params)}
    except _llama.LlamaError as e:
        return {"error": str(e)}


def time_in_child(path: str, extra_env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Times `path` in a child process whose environment adds the path's child_env and extra_env."""
    cmd = [sys.executable, "-m", "pyllama_so.bench.allreduce", "--worker", path,
           "--sizes", ",".join(str(s) for s in args.sizes), "--warmup", str(args.warmup),
           "--iters", str(args.iters), "--devices", f"{args.devices[0]},{args.devices[1]}"]
    env = {**os.environ, **(PATHS[path].child_env or {}), **extra_env}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"error": "child timed out after 300 s"}
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"error": f"child exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cuda_devices() -> list[dict[str, Any]]:
    return [d for d in _llama.devices() if d["backend"] == "CUDA"]


def two_cuda_gpus() -> bool:
    """What the benchmark (and the GPU tests of the AllReduce paths) need: CUDA and two devices."""
    return allreduce_rig.available() and len(cuda_devices()) >= 2


def run(args: argparse.Namespace) -> dict[str, Any]:
    cuda = cuda_devices()  # the C side takes CUDA device indices, so args.devices index this list
    results: dict[str, dict[str, Any]] = {}
    results["ceiling"] = time_ceiling(args.sizes, args.warmup, args.iters, args.devices)
    order = list(args.paths)
    if args.ce_sweep:
        order[1:1] = SWEEP_PATHS
        for name, chunk in CEILING_ROWS.items():
            results[name] = time_ceiling(args.sizes, args.warmup, args.iters, args.devices, chunk)
    for path in order:
        if path == "nccl_nop2p":
            results[path] = time_in_child("nccl", {"NCCL_P2P_DISABLE": "1"}, args)
        elif PATHS[path].child_env is not None:
            results[path] = time_in_child(path, {}, args)
        else:
            results[path] = time_path(path, args.sizes, args.warmup, args.iters, args.devices)

    ceiling = results["ceiling"].get("us")
    for res in results.values():
        us = res.get("us")
        if not us:
            continue
        res["algbw_gbs"] = [s / (t * 1e-6) / 1e9 if t > 0 else None for s, t in zip(args.sizes, us, strict=True)]
        if ceiling:
            res["ratio_to_ceiling"] = _ratios(ceiling, us)
            if "queued_us" in res:
                res["queued_ratio_to_ceiling"] = _ratios(ceiling, res["queued_us"])
    return {
        "benchmark": "allreduce",
        "payload": "bf16 bytes crossing between the GPUs; the reduced F32 tensor is twice as large",
        "sizes": list(args.sizes),
        "warmup": args.warmup,
        "iters": args.iters,
        "devices": [cuda[i] for i in args.devices if i < len(cuda)] or list(args.devices),
        "results": results,
    }


def _ratios(ceiling: Sequence[float], times: Sequence[float | None]) -> list[float | None]:
    """Ceiling time / time per size; None where a time is missing or zero."""
    return [c / t if t else None for c, t in zip(ceiling, times, strict=True)]


def print_table(report: dict[str, Any]) -> None:
    sizes = report["sizes"]
    results = report["results"]
    print("| size | path | time (µs) | algBW (GB/s) | vs ceiling | host µs to issue | GPU µs, queued "
          "| queued vs ceiling |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    none = [None] * len(sizes)
    for k, size in enumerate(sizes):
        for name, res in results.items():
            if "us" not in res:
                continue
            print(f"| {fmt_size(size)} | {name} | {res['us'][k]:.1f} | {_fmt(res['algbw_gbs'][k], '.1f')} | "
                  f"{_fmt(res.get('ratio_to_ceiling', none)[k], '.2f')} | {_fmt(res.get('host_us', none)[k], '.1f')} | "
                  f"{_fmt(res.get('queued_us', none)[k], '.1f')} | "
                  f"{_fmt(res.get('queued_ratio_to_ceiling', none)[k], '.2f')} |")
    for name, res in results.items():
        for key in ("error", "warning"):
            if key in res:
                print(f"{name}: {key}: {res[key]}")


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.bench.allreduce", description=__doc__.split("\n")[0],
                                 epilog=f"exit status: 0 measured, 2 bad arguments, {EXIT_SKIPPED} {SKIPPED}")
    sizes = A.comma_list(parse_size)
    ap.add_argument("--sizes", type=sizes, default=sizes(DEFAULT_SIZES),
                    help=f"payload sizes, comma-separated, K/M suffixes (default {DEFAULT_SIZES})")
    ap.add_argument("--warmup", type=A.non_negative_int, default=5)
    ap.add_argument("--iters", type=A.positive_int, default=50, help="timed reductions per size (default 50)")
    ap.add_argument("--devices", type=A.comma_list(A.non_negative_int), default=[0, 1],
                    help="two CUDA device indices (default 0,1)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT ('-' = stdout)")
    ap.add_argument("--ce-sweep", action="store_true",
                    help="also time the copy engines with fixed chunks of 256 KiB to 4 MiB, and the ceiling "
                         "issued in copies of 256 KiB to 2 MiB")
    ap.add_argument("--paths", type=A.comma_list(str), default=list(ORDER),
                    help=f"paths to time, comma-separated, of {','.join(CHOICES)} (default {','.join(ORDER)})")
    ap.add_argument("--worker", choices=sorted(PATHS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if len(args.devices) != 2 or args.devices[0] == args.devices[1]:
        ap.error("--devices needs two different indices")
    unknown = [p for p in args.paths if p not in CHOICES]
    if unknown or not args.paths:
        ap.error(f"--paths: unknown {','.join(unknown) or '(none given)'}; choose from {','.join(CHOICES)}")

    if args.worker:
        print(json.dumps(time_path(args.worker, args.sizes, args.warmup, args.iters, args.devices)))
        return 0

    if not two_cuda_gpus():
        print(SKIPPED)
        write_json(args.json, {"benchmark": "allreduce", "skipped": SKIPPED})
        return EXIT_SKIPPED

    report = run(args)
    print_table(report)
    write_json(args.json, report)
    return 0


def write_json(dest: str | None, data: dict[str, Any]) -> None:
    """--json: to a file, '-' for stdout, None for nowhere."""
    if dest is None:
        return
    text = json.dumps(data, indent=2)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")

if __name__ == "__main__":
    sys.exit(main())
