"""Server scenario with and without split overlap: `python -m pyllama_so.server -sm tensor --parallel 2` with
-so 0, then with -so 1, each sent the same greedy requests to /v1/completions (token-id prompts):

  1. prompt        a prompt of --prompt tokens;
  2. continuation  that prompt plus --continuation more, evaluated from the slot's cache (checked: cache_n);
  3. pair          two prompts of --pair tokens arriving together (the second is sent as soon as the
                   server has taken the first, so that the same one goes first in both modes);
  4. long          a prompt of --long tokens (0 skips it).

Each asks for --gen tokens at temperature 0. Checks that -so 0 and -so 1 give the same completions and
reports prefill t/s per step and peak VRAM per GPU per mode:

    NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1 scripts/server-scenario -m qwen3-8b-q8_0.gguf --json OUT.json

Prefill t/s is the server's timings.prompt_n / prompt_ms; for the pair, both prompts' evaluated tokens over
the time from sending the first to the end of the later prefill (its response's arrival less its
timings.predicted_ms), as one prompt is evaluated while the other generates. Each mode is its own server
process (so that peak VRAM is its own), with -c the largest step (plus --gen) times --parallel, since each
slot gets -c / --parallel. The AllReduce routing comes from the environment, which the server inherits;
without a GPU, GGML_CPU_VIRTUAL_DEVICES=2 gives the tensor split two CPU virtual devices and there is no
VRAM data. Exit status 1 when the completions differ, 2 when a run fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from server_load import int_at_least  # scripts/server_load.py: the argparse type of a bounded integer
from server_process import ServerProcess  # scripts/server_process.py
from vram_peak import VramSampler, format_peak  # scripts/vram_peak.py

ENV_NOTED = ("GGML_CUDA_AR_CE", "NCCL_P2P_DISABLE", "GGML_CUDA_DEVICES", "CUDA_VISIBLE_DEVICES",
             "GGML_CPU_VIRTUAL_DEVICES", "GGML_META_LANES_THREADS")


class ScenarioError(RuntimeError):
    """A run that cannot be compared: a failed request, or a cache that was not reused."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompt", type=int_at_least(1), default=10240)
    ap.add_argument("--continuation", type=int_at_least(1), default=2048)
    ap.add_argument("--pair", type=int_at_least(1), default=5120, help="tokens of each of the two prompts")
    ap.add_argument("--long", type=int_at_least(0), default=65536, help="0 skips the long prompt")
    ap.add_argument("--gen", type=int_at_least(1), default=16, help="max_tokens of each request")
    ap.add_argument("-np", "--parallel", type=int_at_least(2), default=2, help="slots (the pair needs two)")
    ap.add_argument("-b", "--batch", type=int_at_least(1), default=2048)
    # explicit for both modes: the server's default ubatch differs between -so 0 and -so 1
    ap.add_argument("-ub", "--ubatch", type=int_at_least(1), default=1024)
    ap.add_argument("-fa", "--flash-attn", default="on")
    ap.add_argument("-t", "--threads", type=int_at_least(1), help="CPU threads of the server")
    ap.add_argument("--seed", type=int, default=1, help="of the random prompt tokens")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per request and for the server's start")
    ap.add_argument("--json", type=Path, help="write everything here")
    args = ap.parse_args(argv)
    if args.ubatch > args.batch:
        ap.error(f"-ub {args.ubatch} is larger than -b {args.batch}")
    return args


def slot_ctx(args: argparse.Namespace) -> int:
    """Tokens one slot must hold: the largest prompt and its --gen tokens, rounded up to 256 as the server does."""
    need = max(args.prompt + args.continuation, args.pair, args.long) + args.gen
    return -(-need // 256) * 256


def prompts(args: argparse.Namespace, n_vocab: int) -> dict[str, list[int]]:
    """Random token ids, the same in both modes. Fresh prompts start with distinct tokens, so that only the
    continuation finds its prefix in a slot's cache."""
    rng = random.Random(args.seed)
    firsts = rng.sample(range(1, n_vocab), 4)

    def fresh(k: int, n: int) -> list[int]:
        return [firsts[k]] + [rng.randrange(1, n_vocab) for _ in range(n - 1)]

    base = fresh(0, args.prompt)
    out = {"prompt": base, "continuation": base + [rng.randrange(1, n_vocab) for _ in range(args.continuation)],
           "pair_a": fresh(1, args.pair), "pair_b": fresh(2, args.pair)}
    if args.long:
        out["long"] = fresh(3, args.long)
    return out


def complete(http: httpx.Client, tokens: list[int], gen: int) -> dict[str, Any]:
    """One greedy /v1/completions request: its answer, with the client's send and arrival times added."""
    t0 = time.perf_counter()
    r = http.post("/v1/completions", json={"prompt": tokens, "max_tokens": gen, "temperature": 0})
    t1 = time.perf_counter()
    if r.status_code != 200:
        raise ScenarioError(f"/v1/completions answered {r.status_code}: {r.text[:500]}")
    body = r.json()
    return {"text": body["choices"][0]["text"], "finish_reason": body["choices"][0]["finish_reason"],
            "usage": body["usage"], "timings": body["timings"], "sent": t0, "arrived": t1}


def prefill_tps(res: dict[str, Any]) -> float:
    t = res["timings"]
    return 1e3 * t["prompt_n"] / t["prompt_ms"] if t["prompt_ms"] > 0 else 0.0


def expect_cache(step: str, res: dict[str, Any], at_least: int, at_most: int | None = None) -> None:
    """The reuse that the step is about (at_least), or that a fresh prompt found nothing (at_most)."""
    cached, cache_n = res["usage"]["prompt_tokens_details"]["cached_tokens"], res["timings"]["cache_n"]
    if cached != cache_n or cached < at_least or (at_most is not None and cached > at_most):
        raise ScenarioError(f"{step}: cached_tokens {cached}, cache_n {cache_n}; expected "
                            + (f"{at_least}..{at_most}" if at_most is not None else f">= {at_least}"))


def connect(server: ServerProcess, args: argparse.Namespace) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=args.timeout)


def run_steps(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    with connect(server, args) as http:
        meta = http.get("/v1/models").json()["data"][0]["meta"]
        if meta["n_ctx_slot"] < slot_ctx(args):
            raise ScenarioError(f"a slot holds {meta['n_ctx_slot']} tokens, the steps need {slot_ctx(args)}")
        p = prompts(args, meta["n_vocab"])
        steps: dict[str, Any] = {}

        res = complete(http, p["prompt"], args.gen)
        expect_cache("prompt", res, 0, 0)
        steps["prompt"] = {"tps": prefill_tps(res), "outputs": [res]}

        res = complete(http, p["continuation"], args.gen)
        expect_cache("continuation", res, args.prompt)  # the slot held the first prompt
        steps["continuation"] = {"tps": prefill_tps(res), "outputs": [res]}

        both_before = http.get("/engine").json()["steps_by_slots"].get("2", 0)
        with ThreadPoolExecutor(2) as pool, connect(server, args) as http_a, connect(server, args) as http_b:
            http_b.get("/health")  # connected beforehand: the second arrives within milliseconds
            first = pool.submit(complete, http_a, p["pair_a"], args.gen)
            # the second goes once a slot holds the first (or the first is done): a fixed order in both modes
            while not first.done() and not any(s["job"] for s in http.get("/engine").json()["slots"]):
                time.sleep(0.001)
            second = pool.submit(complete, http_b, p["pair_b"], args.gen)
            pair = [first.result(), second.result()]
        for res in pair:
            expect_cache("pair", res, 0, 0)
        start = pair[0]["sent"]
        end = max(r["arrived"] - r["timings"]["predicted_ms"] / 1e3 for r in pair)
        steps["pair"] = {"tps": sum(r["timings"]["prompt_n"] for r in pair) / (end - start), "outputs": pair,
                         "tps_each": [prefill_tps(r) for r in pair],
                         "steps_with_both": http.get("/engine").json()["steps_by_slots"].get("2", 0) - both_before}

        if args.long:
            res = complete(http, p["long"], args.gen)
            expect_cache("long", res, 0, 0)
            steps["long"] = {"tps": prefill_tps(res), "outputs": [res]}
        slots = http.get("/engine").json()
    return {"n_ctx_slot": meta["n_ctx_slot"], "steps": steps, "split_overlap": slots["split_overlap"],
            "engine_steps": slots["steps"], "steps_by_slots": slots["steps_by_slots"]}


def run_mode(args: argparse.Namespace, so: int) -> dict[str, Any]:
    cmd = ["-m", args.model, "-sm", "tensor", "-so", str(so), "--parallel", str(args.parallel),
           "-c", str(slot_ctx(args) * args.parallel), "-b", str(args.batch), "-ub", str(args.ubatch),
           "-fa", args.flash_attn, *(["-t", str(args.threads)] if args.threads else [])]
    sampler = VramSampler()  # before the server starts: its model load counts
    server: ServerProcess | None = None
    try:
        server = ServerProcess(cmd, start_timeout=args.timeout)
        report = {"so": so, "server_args": cmd, **run_steps(server, args)}
    except (ScenarioError, httpx.HTTPError, RuntimeError) as e:
        log = server.log if server is not None else ""
        raise ScenarioError(f"-so {so}: {e}" + (f"\nserver log (end):\n{log[-3000:]}" if log else "")) from None
    finally:
        if server is not None:
            server.stop()  # also on errors and Ctrl-C: no server outlives the script
        vram = sampler.stop()
    report["vram_peak_mib"] = vram
    return report


def outputs(report: dict[str, Any], step: str) -> list[tuple[str, str, int]]:
    return [(r["text"], r["finish_reason"], r["usage"]["completion_tokens"]) for r in report["steps"][step]["outputs"]]


def main() -> int:
    args = parse_args()
    reports = []
    for so in (0, 1):
        try:
            reports.append(run_mode(args, so))
        except ScenarioError as e:
            print(f"server-scenario: {e}", file=sys.stderr)
            return 2
    names = {"prompt": f"{args.prompt}-token prompt", "continuation": f"continuation, {args.continuation} tokens",
             "pair": f"two {args.pair}-token prompts together", "long": f"{args.long}-token prompt"}
    differ = [step for step in reports[0]["steps"] if outputs(reports[0], step) != outputs(reports[1], step)]
    print("| step | -so 0 prefill t/s | -so 1 prefill t/s | -so 1 / -so 0 |\n|---|---:|---:|---:|")
    for step in reports[0]["steps"]:
        a, b = reports[0]["steps"][step]["tps"], reports[1]["steps"][step]["tps"]
        print(f"| {names[step]} | {a:.0f} | {b:.0f} | {b / a:.3f} |")
    for r in reports:
        vram = format_peak(r["vram_peak_mib"]) or "no VRAM data"
        print(f"-so {r['so']}: peak {vram}; lanes {r['split_overlap'].get('ubatches')}; "
              f"pair shared {r['steps']['pair']['steps_with_both']} steps")
    print("completions: " + ("identical" if not differ else "DIFFERENT in " + ", ".join(differ)))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
        args.json.write_text(json.dumps({
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "commit": commit,
            "env": {k: os.environ[k] for k in ENV_NOTED if k in os.environ}, "identical": not differ,
            "differ": differ, "modes": reports}, indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
