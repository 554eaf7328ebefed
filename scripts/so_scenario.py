"""Server-like prompts with and without split overlap: a long prompt, its continuation from the cache,
and two prompts on two sequences in one batch, each followed by greedy tokens. Checks that -so 0 and
-so 1 give the same greedy tokens and reports prefill t/s and peak VRAM per GPU for each.

    scripts/so-scenario -m qwen3-8b-q8_0.gguf --prompt 10240 --continuation 2048 --pair 5120 -ub 1024

Each mode runs in its own process (so that peak VRAM is its own). The AllReduce routing comes from the
environment (e.g. NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1). Without a GPU, GGML_CPU_VIRTUAL_DEVICES=2
gives the tensor split two CPU virtual devices. Exit status 1 when the greedy tokens differ.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vram_peak import format_peak, run_sampled  # scripts/vram_peak.py

if TYPE_CHECKING:
    import numpy.typing as npt

T = TypeVar("T")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from pyllama_so import _llama

    model = _llama.Model.load(args.model, n_gpu_layers=-1, split_mode="tensor")
    seq_ctx = args.prompt + args.continuation + 2 * args.gen + 16
    ctx = _llama.Context(model, n_ctx=2 * max(seq_ctx, args.pair + args.gen + 16), n_batch=args.batch,
                         n_ubatch=args.ubatch, n_seq_max=2, flash_attn="on", split_overlap=args.so == 1)
    rng = np.random.default_rng(args.seed)
    vocab = model.n_vocab

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(1, vocab, n)]

    def timed(fn: Callable[[], T]) -> tuple[T, float]:  # (result, seconds), the GPU work included
        t0 = time.perf_counter()
        res = fn()
        ctx.synchronize()
        return res, time.perf_counter() - t0

    def greedy(logits: npt.NDArray[np.float32], seq_id: int) -> list[int]:
        out = []
        for _ in range(args.gen):
            tok = int(np.argmax(logits))
            out.append(tok)
            logits = ctx.decode([tok], seq_id=seq_id)[-1]
        return out

    report: dict[str, Any] = {"so": args.so, "prefill_tps": {}, "tokens": {}}
    prompt, cont = tokens(args.prompt), tokens(args.continuation)
    logits, s = timed(lambda: ctx.decode(prompt)[-1])
    report["prefill_tps"]["prompt"] = args.prompt / s
    report["tokens"]["prompt"] = greedy(logits, 0)
    logits, s = timed(lambda: ctx.decode(cont)[-1])
    report["prefill_tps"]["continuation"] = args.continuation / s
    report["tokens"]["continuation"] = greedy(logits, 0)
    ctx.clear()
    pair = [(0, tokens(args.pair)), (1, tokens(args.pair))]
    logits, s = timed(lambda: ctx.decode_sequences(pair))
    report["prefill_tps"]["pair"] = 2 * args.pair / s
    report["tokens"]["pair"] = [greedy(logits[k], seq) for k, (seq, _) in enumerate(pair)]
    report["split_overlap"] = ctx.split_overlap_stats()
    ctx.free()
    model.free()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompt", type=int, default=10240)
    ap.add_argument("--continuation", type=int, default=2048)
    ap.add_argument("--pair", type=int, default=5120, help="tokens of each of the two prompts in one batch")
    ap.add_argument("--gen", type=int, default=16, help="greedy tokens after each prefill")
    ap.add_argument("-b", "--batch", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write both reports here")
    ap.add_argument("--so", type=int, choices=[0, 1], help=argparse.SUPPRESS)  # the worker's mode
    args = ap.parse_args()
    if args.so is not None:
        print(json.dumps(worker(args)))
        return 0

    reports = []
    for so in (0, 1):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--so", str(so)]
        res, vram = run_sampled(cmd)
        if res.returncode != 0:
            print(f"so-scenario: -so {so} failed:\n{res.stderr[-3000:]}", file=sys.stderr)
            return 2
        report = json.loads(res.stdout.strip().splitlines()[-1])
        report["vram_peak_mib"] = vram
        reports.append(report)
    same = reports[0]["tokens"] == reports[1]["tokens"]
    print("| step | -so 0 prefill t/s | -so 1 prefill t/s | -so 1 / -so 0 |\n|---|---:|---:|---:|")
    for step in reports[0]["prefill_tps"]:
        a, b = reports[0]["prefill_tps"][step], reports[1]["prefill_tps"][step]
        print(f"| {step} | {a:.0f} | {b:.0f} | {b / a:.3f} |")
    for r in reports:
        print(f"-so {r['so']}: peak VRAM {format_peak(r['vram_peak_mib'])}; lanes {r['split_overlap']['ubatches']}")
    print("greedy tokens: " + ("identical" if same else "DIFFERENT"))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
