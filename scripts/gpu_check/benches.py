"""The benchmark stages: arbench, tpbench, sobench, so2bench, decode, generation, bench. Each bench process
writes JSON lines, tagged with the tool (and configuration) that made them."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from .context import NO_PEER_ACCESS, Context
from .options import env_words
from .registry import stage
from .runner import NULL, Cmd, env_text, tee, to


def tag(**fields: Any) -> str:
    """Fields put first into each JSON line of a bench: '"tool": "ours", '."""
    return "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in fields.items())


def best_ce_variant(report: Path) -> str:
    """The copy-engine variant (ce, ce_*) of an AllReduce sweep (stage arbench's JSON) with the least time at
    8 and 16 MiB; ce when there is no sweep to choose from."""
    try:
        rep = json.loads(report.read_text())
        sizes = rep.get("sizes", [])
        at = [sizes.index(s) for s in (8 << 20, 16 << 20) if s in sizes]
        times = {name: sum(r["us"][i] for i in at) for name, r in rep.get("results", {}).items()
                 if (name == "ce" or name.startswith("ce_")) and "us" in r}
    except (OSError, ValueError, AttributeError, TypeError, KeyError, IndexError):
        return "ce"
    return min(times, key=times.__getitem__) if times and at else "ce"


@stage("arbench")
def arbench(cx: Context) -> None:
    """pyllama_so.bench.allreduce with --ar-args (default: the copy-engine sweep) on two GPUs, else two CUDA
    devices of GPU 0: OUT/allreduce.json. Its skip status (3: no CUDA build or fewer than two CUDA devices) is
    no failure."""
    run = cx.run
    devices = cx.two_devices()
    run.log(f"AllReduce benchmark ({env_text(devices) or 'two GPUs'}): {' '.join(cx.opts.ar_args)}")
    log = cx.logs / "allreduce.log"
    rc = run.run(cx.py_cuda("-m", "pyllama_so.bench.allreduce", *cx.opts.ar_args, "--json",
                            str(cx.out / "allreduce.json"), env=devices, out=tee(log), err=None))
    if rc == 3:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        run.log(f"allreduce bench {lines[-1] if lines else ''}")
    else:
        run.check("allreduce bench", rc)
    print(f"allreduce bench: rc={rc}", flush=True)


@stage("tpbench")
def tpbench(cx: Context) -> None:
    """Tensor split without peer access, emulated (NCCL_P2P_DISABLE=1): NCCL through host memory against our
    copy engines forced (GGML_CUDA_AR_CE=1), one bench process per run of --tp-runs (nccl, ce, ce_c<K>k: fixed
    K KiB chunks, ce_best: stage arbench's best copy-engine variant at 8 and 16 MiB) on the F16 model of
    --model, peak VRAM of each: OUT/tpbench.jsonl."""
    run, opts = cx.run, cx.opts
    run.log("tensor-split bench: NCCL_P2P_DISABLE=1 baseline vs copy engines (GGML_CUDA_AR_CE=1)")
    jsonl = cx.out / "tpbench.jsonl"
    run.truncate(jsonl)
    runs = opts.tp_runs
    if "ce_best" in runs:
        best = best_ce_variant(cx.out / "allreduce.json")
        run.log(f"best copy-engine variant of the sweep: {best} (ce without a sweep to choose from)")
        runs = [best if r == "ce_best" else r for r in runs]
    model = cx.model()
    for name in runs:
        chunk = re.fullmatch(r"ce_c([0-9]+)k", name)
        env = {"NCCL_P2P_DISABLE": "1", "GGML_CUDA_AR_CE": "0" if name == "nccl" else "1",
               "GGML_CUDA_AR_CE_CHUNK_BYTES": str(int(chunk[1]) * 1024) if chunk else ""}
        csv = cx.logs / f"vram-{name}.csv"
        sampler = cx.vram_start(csv)
        rc = run.run(cx.py_cuda(*cx.bench(model, "-sm", "tensor", "-fa", "1", "-b", "2048", "-ub", opts.tp_ubatch,
                                          "-p", "2048", "-n", "32", "-r", str(opts.reps), *cx.warmup()),
                                env=env, out=to(jsonl, append=True), err=to(cx.logs / "tpbench.err", append=True),
                                tag=tag(tool=name)))
        run.check(f"tpbench {name}", rc)
        cx.vram_peak(sampler, csv, name, cx.logs / "vram.txt")


def so_runs(opts: argparse.Namespace) -> list[tuple[str, str]]:
    """Stage sobench's runs as (-so value, or layer, or cut; ubatch)."""
    runs = [("0", ub) for ub in opts.so_ub0]
    for ub in opts.so_ub1:
        runs.append(("1", ub))
        if ub in opts.so_ub1_cut:  # the same -so 1 with llama.cpp's cut of a batch, next to the lanes' equal ubatches
            runs.append(("cut", ub))
    return runs + [("layer", ub) for ub in opts.so_ubl]  # the layer split, what -so 1 is to beat


@stage("sobench")
def sobench(cx: Context) -> None:
    """Split overlap on two CUDA devices of GPU 0 (GGML_CUDA_DEVICES=2, the proxy of two GPUs), copy engines
    forced for every reduction size: -so 0 (--so-ub0) against -so 1 (--so-ub1; those of --so-ub1-cut also with
    llama.cpp's cut of a batch into ubatches, tool so1-cut) and -sm layer (--so-ubl) by ubatch, on the model of
    --so-model, one process per run, peak VRAM of each: OUT/sobench.jsonl, OUT/sobench-vram.txt."""
    run, opts = cx.run, cx.opts
    model = cx.so_model()
    run.log(f"split-overlap bench (GGML_CUDA_DEVICES=2 on GPU 0, GGML_CUDA_AR_CE=1): {model}")
    jsonl = cx.out / "sobench.jsonl"
    run.truncate(jsonl)
    for so, ub in so_runs(opts):
        split, tool, equal = {"layer": (["-sm", "layer"], "layer", "1"),
                              "cut": (["-sm", "tensor", "-so", "1"], "so1-cut", "0")}.get(
                                  so, (["-sm", "tensor", "-so", so], f"so{so}", "1"))
        csv = cx.logs / f"vram-so{so}-ub{ub}.csv"
        sampler = cx.vram_start(csv)
        env = {"LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES": equal, "CUDA_VISIBLE_DEVICES": "0", "GGML_CUDA_DEVICES": "2",
               "GGML_CUDA_AR_CE": "1"}
        rc = run.run(cx.py_cuda(*cx.bench(model, *split, "-fa", "1", "-b", "2048", "-ub", ub, "-p", "2048", "-n", "32",
                                          "-r", str(opts.reps), *cx.warmup()),
                                env=env, out=to(jsonl, append=True), err=to(cx.logs / "sobench.err", append=True),
                                tag=tag(tool=tool)))
        run.check(f"sobench {tool} -ub {ub}", rc)
        cx.vram_peak(sampler, csv, f"so{so} ub{ub}", cx.logs / "vram.txt", cx.out / "sobench-vram.txt")


@stage("so2bench")
def so2bench(cx: Context) -> None:
    """The model of --so-model on two GPUs without peer access (NCCL_P2P_DISABLE=1, copy engines forced), one
    process per flag set of --so2-configs: OUT/so2bench.jsonl. Skipped with fewer than two GPUs."""
    run, opts = cx.run, cx.opts
    if cx.n_gpus < 2:
        run.log(f"so2bench skipped: {cx.n_gpus} GPU(s)")
        return
    model = cx.so_model()
    run.log(f"split overlap on two GPUs, no peer access emulated (NCCL_P2P_DISABLE=1, GGML_CUDA_AR_CE=1): {model}")
    jsonl = cx.out / "so2bench.jsonl"
    run.truncate(jsonl)
    for cfg in opts.so2_configs:
        rc = run.run(cx.py_cuda(*cx.bench(model, *cfg.split(), "-fa", "1", "-b", "2048", "-p", "2048", "-n", "32",
                                          "-r", str(opts.reps), *cx.warmup()),
                                env=NO_PEER_ACCESS, out=to(jsonl, append=True),
                                err=to(cx.logs / "so2bench.err", append=True), tag=tag(tool=cfg)))
        run.check(f"so2bench {cfg}", rc)


@stage("decode", default=False)
def decode(cx: Context) -> None:
    """Decoding (tg) under tensor split without peer access (NCCL_P2P_DISABLE=1, copy engines forced; a
    token's reductions are below their threshold and take the low-latency path, GGML_CUDA_AR_LL_MAX_BYTES=0
    the internal pipeline) on two GPUs, else two CUDA devices of GPU 0: every configuration of
    --decode-configs on every shape of --decode-models (Q8_0), interleaved over --decode-rounds rounds:
    OUT/decode.jsonl."""
    run, opts = cx.run, cx.opts
    devices = cx.two_devices()
    run.log(f"decode bench ({env_text(devices) or 'two GPUs'}, NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1): "
            f"{' '.join(opts.decode_models)}")
    jsonl = cx.out / "decode.jsonl"
    run.truncate(jsonl)
    for shape in opts.decode_models:
        model = cx.synth(shape, "q8_0", out=NULL)
        for round_ in range(1, opts.decode_rounds + 1):
            for cfg in opts.decode_configs:
                env, args = env_words(cfg)
                rc = run.run(cx.py_cuda(*cx.bench(model, *args, "-fa", "1", "-p", "0", "-n", str(opts.decode_tokens),
                                                  "-r", str(opts.reps), *cx.warmup()),
                                        env={**devices, **NO_PEER_ACCESS, **env}, out=to(jsonl, append=True),
                                        err=to(cx.logs / "decode.err", append=True),
                                        tag=tag(tool=cfg, shape=shape, round=round_)))
                run.check(f"decode {shape} {cfg}", rc)


@stage("generation")
def generation(cx: Context) -> None:
    """scripts/generation-bench on GPU 0 (-sm none, the model of --so-model): generation from Python
    (create_completion, default sampling and greedy) at the context's own decode rate, raw batched decode
    against rows sampled in C and backend sampling: OUT/generation.json, .md."""
    run, opts = cx.run, cx.opts
    model = cx.so_model()
    run.log(f"generation bench (-sm none, GPU 0): {model}")
    rc = run.run(cx.py_cuda(cx.script("generation-bench"), "-m", str(model), "-sm", "none", "-ngl", "-1", "-fa", "on",
                            "-p", "512", "-n", "128", "-r", str(opts.gen_reps), "--streams", opts.gen_streams,
                            *opts.gen_args, "--json", str(cx.out / "generation.json"),
                            env={"CUDA_VISIBLE_DEVICES": "0"}, out=tee(cx.out / "generation.md"),
                            err=to(cx.logs / "generation.err")))
    run.check("generation bench", rc)
    run.show_tail(cx.logs / "generation.err", 3)


@stage("bench")
def bench(cx: Context) -> None:
    """pyllama_so.bench against upstream's llama-bench (built by stage build when this stage runs), the same
    F16 model (--model) and flags, per flag set of --bench-configs, in the order upstream, ours, ours, upstream
    so that drift over time cancels in the means: OUT/bench.jsonl."""
    run, opts = cx.run, cx.opts
    upstream = cx.built("llama-bench", stage="bench")
    run.log(f"bench: ours and upstream llama-bench ({upstream or 'not found: ours only'}), same model and flags, "
            "alternating")
    jsonl = cx.out / "bench.jsonl"
    run.truncate(jsonl)
    model = cx.model()
    flags = ["-fa", "1", "-p", "512", "-n", "128", "-r", str(opts.reps)]
    err = to(cx.logs / "bench.err", append=True)
    for cfg in opts.bench_configs:
        for tool in ("upstream", "ours", "ours", "upstream"):
            if tool == "ours":
                rc = run.run(cx.py_cuda(*cx.bench(model, *cfg.split(), *flags, *cx.warmup()),
                                        out=to(jsonl, append=True), err=err, tag=tag(tool="ours")))
                run.check(f"pyllama_so.bench {cfg}", rc)
            elif upstream is not None:
                rc = run.run(Cmd([str(upstream), "-m", str(model), *cfg.split(), *flags, "-o", "jsonl"],
                                 out=to(jsonl, append=True), err=err, tag=tag(tool="upstream")))
                run.check(f"llama-bench {cfg}", rc)
