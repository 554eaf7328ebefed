"""Load generator for OpenAI-compatible servers: ours (python -m pyllama_so.server) and upstream's llama-server,
started here with the same model and flags, one after the other, or one already running (--url).

    scripts/server-load --server ours,upstream -m model.gguf --concurrency 1,4 --prompt 128 --gen 64 \\
        --json load.json -- -sm none -c 4096 -np 4 -t 2
    scripts/server-load --url http://127.0.0.1:8080 --concurrency 8 --requests 64 --greedy
    scripts/server-load --server ours -m model.gguf --scenario mixed --concurrency 4 --long 4096,16384 \\
        -- -sm tensor -so 1 -c 98304 -np 6

Every request is a streamed (SSE) POST /v1/completions whose prompt is token ids, so that it has exactly
--prompt tokens on both servers: random ids of the vocabulary, distinct per request from the first token on
(no prefix-cache hits; --shared-prefix K gives every prompt the same first K tokens, to measure them). Each
asks for --gen tokens with ignore_eos (both servers take it; --no-ignore-eos leaves it out) and the sampling
of llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), --greedy for temperature 0;
--field NAME=JSON adds any other request field (e.g. --field repeat_penalty=1.1).

Scenarios (--scenario, comma-separated; each runs at every --concurrency):
  load   --requests N (default 4 per stream) through C concurrent streams, each starting the next request as
         soon as its last one ended. Reports output tok/s (completion tokens of all requests over the time from
         the first request sent to the last one done), TTFT (request sent to first text), inter-token latency
         (ITL: time between consecutive text chunks of a stream), requests and errors, and the decode rate
         while all C streams generate (no prompt in the server then: its batched decoding of C sequences).
  mixed  C streams generate (a stream whose request ends starts another) while prompts of --long tokens
         arrive one after another, each with max_tokens 1. Reports prompt t/s (the server's timings of those
         prompts: prompt_n over prompt_ms, summed) and the ITL of the generating streams while the long
         prompts run, next to their ITL before the first long prompt ("alone"). A slot must hold a long
         prompt, and one must be free for it: -np above C, -c at least np times the longest.

Servers: --server ours,upstream starts each in turn on a free port (`python -m pyllama_so.server` and
--server-bin, by default the newest llama-server under build/, from -DPYLLAMA_SO_UPSTREAM_SERVER=ON), with
-m MODEL and the flags after `--`, which both servers must understand (-c -np -b -ub -ngl -sm -fa -t -ctk
-ctv ...); --ours-args / --upstream-args add flags for one of them. One warm-up request precedes each
server's runs (--warmup). A short table goes to stdout; --json FILE gets every number, the commands, the
commit and the hardware. Exit status: 0, 1 when a request failed, 2 when a server did not start or a run
could not be made.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from load_report import commit, hardware, tables  # scripts/load_report.py
from server_process import OURS, ServerProcess  # scripts/server_process.py

REPO = Path(__file__).resolve().parent.parent
# llama.cpp's default sampling (common_params_sampling), which our server's defaults also follow
DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


class LoadError(RuntimeError):
    """A run that cannot be made: the server is unreachable or cannot hold the requests asked for."""


def int_at_least(low: int) -> Callable[[str], int]:
    # an argparse type: a bad number is a usage error, before any server starts
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def int_list(text: str) -> list[int]:
    return [positive_int(t) for t in text.split(",")]


def field_arg(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=JSON, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"the value of {name} is not JSON: {value!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    own, server_flags = argv[:split], argv[split + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [options] [-- SERVER FLAGS]")
    where = ap.add_argument_group("servers")
    where.add_argument("--server", default="ours", help="ours, upstream or both, comma-separated, run in that "
                       "order (default ours)")
    where.add_argument("--url", help="a server already running: no server is started")
    where.add_argument("--name", default="url", help="the name of the --url server in the report (default url)")
    where.add_argument("--server-bin", type=Path, help="llama-server (default: the newest under build/)")
    where.add_argument("-m", "--model", help="GGUF file, given to each server started")
    where.add_argument("--ours-args", default="", help="more flags for our server only (one string)")
    where.add_argument("--upstream-args", default="", help="more flags for llama-server only (one string)")
    load = ap.add_argument_group("load")
    load.add_argument("--scenario", default="load", help="load, mixed or both, comma-separated (default load)")
    load.add_argument("--concurrency", type=int_list, default=[1], help="streams, comma-separated (default 1)")
    load.add_argument("--requests", type=positive_int, help="requests of each load run (default 4 per stream)")
    load.add_argument("--prompt", type=positive_int, default=128, help="prompt tokens (default 128)")
    load.add_argument("--gen", type=positive_int, default=128, help="tokens to generate (default 128)")
    load.add_argument("--shared-prefix", type=non_negative_int, default=0,
                      help="tokens every prompt starts with (default 0: prompts differ from the first token)")
    load.add_argument("--long", type=int_list, default=[4096, 16384],
                      help="mixed scenario: the long prompts' lengths, sent in this order (default 4096,16384)")
    load.add_argument("--alone", type=positive_int, default=16,
                      help="mixed scenario: text chunks each stream receives before the first long prompt "
                      "(default 16)")
    load.add_argument("--warmup", type=non_negative_int, default=1, help="requests before each server's runs "
                      "(default 1)")
    load.add_argument("--timeout", type=float, default=600, help="seconds for a request and for a server's start")
    load.add_argument("--prompt-seed", type=int, default=1, help="of the random prompt tokens (default 1)")
    sampling = ap.add_argument_group("sampling (request fields)")
    sampling.add_argument("--temperature", type=float, default=DEFAULT_SAMPLING["temperature"])
    sampling.add_argument("--top-k", type=int, default=DEFAULT_SAMPLING["top_k"])
    sampling.add_argument("--top-p", type=float, default=DEFAULT_SAMPLING["top_p"])
    sampling.add_argument("--min-p", type=float, default=DEFAULT_SAMPLING["min_p"])
    sampling.add_argument("--greedy", action="store_true", help="temperature 0")
    sampling.add_argument("--seed", type=int, help="request i gets seed SEED + i (default: none sent)")
    sampling.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                          help="leave ignore_eos out: a request may end before --gen tokens")
    sampling.add_argument("--field", type=field_arg, action="append", default=[], metavar="NAME=JSON",
                          help="another field of every request, e.g. repeat_penalty=1.1 (repeatable)")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(own)
    args.server_flags = server_flags
    args.scenarios = [s.strip() for s in args.scenario.split(",")]
    bad = [s for s in args.scenarios if s not in ("load", "mixed")]
    if bad:
        ap.error(f"--scenario: unknown scenario {bad[0]!r} (load, mixed)")
    args.servers = [s.strip() for s in args.server.split(",")]
    bad = [s for s in args.servers if s not in ("ours", "upstream")]
    if bad:
        ap.error(f"--server: unknown server {bad[0]!r} (ours, upstream)")
    if args.url is None and not args.model:
        ap.error("-m/--model is needed to start a server (or --url for one already running)")
    if args.shared_prefix >= args.prompt:
        ap.error(f"--shared-prefix {args.shared_prefix} must be below --prompt {args.prompt}")
    if args.url is None and "upstream" in args.servers:
        args.server_bin = args.server_bin or find_llama_server()
        if args.server_bin is None:
            ap.error("no llama-server under build/: build it (-DPYLLAMA_SO_UPSTREAM_SERVER=ON) or pass --server-bin")
        if not os.access(args.server_bin, os.X_OK):
            ap.error(f"--server-bin {args.server_bin} is not an executable file")
    return args


def find_llama_server() -> Path | None:
    found = [p for p in (REPO / "build").glob("**/upstream-tools/server/llama-server") if os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


# -- numbers --

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks, as numpy's default."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def full_decode_rate(outcomes: list[Outcome], concurrency: int) -> dict[str, Any]:
    """Output tok/s over the times when all `concurrency` streams generate: between one stream's first and last
    text chunk it generates; where all of them do, no prompt is being evaluated, so the rate is the server's
    batched decoding, comparable to decode_batch of that many sequences. Chunks that arrive there (a stream's first
    one excluded) are counted as tokens at the run's tokens per chunk (a piece can hold several tokens)."""
    spans = [(o.chunks[0], o.chunks[-1]) for o in outcomes if len(o.chunks) > 1]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], -e[1]))
    windows, active, since = [], 0, 0.0
    for t, step in edges:
        if active == concurrency and t > since:
            windows.append((since, t))
        active += step
        since = t
    seconds = sum(b - a for a, b in windows)
    chunks = sum(1 for o in outcomes for t in o.chunks[1:] if any(a < t <= b for a, b in windows))
    all_chunks = sum(len(o.chunks) for o in outcomes)
    per_chunk = sum(o.output_tokens for o in outcomes) / all_chunks if all_chunks else 1.0
    tps = round(chunks * per_chunk / seconds, 3) if seconds > 0 and chunks else None
    return {"full_decode_tps": tps, "full_decode_s": round(seconds, 4), "full_decode_chunks": chunks}


def summary_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [1e3 * s for s in seconds]

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)
    return {"n": len(ms), "p50": r(percentile(ms, 50)), "p90": r(percentile(ms, 90)),
            "mean": r(sum(ms) / len(ms)) if ms else None}


# -- prompts and requests --

class Prompts:
    """Token-id prompts, the same for every server: prompt i starts with the shared prefix, then a token that no
    other prompt has at that place (while the vocabulary has enough), then random tokens."""

    def __init__(self, n_vocab: int, shared_prefix: int, seed: int) -> None:
        if n_vocab < 8:
            raise LoadError(f"a vocabulary of {n_vocab} tokens is too small for random prompts")
        self.n_vocab = n_vocab
        self.rng = random.Random(seed)
        self.prefix = [self.rng.randrange(1, n_vocab) for _ in range(shared_prefix)]
        self.firsts = list(range(1, n_vocab))
        self.rng.shuffle(self.firsts)
        self.issued = 0

    def make(self, length: int) -> list[int]:
        first = self.firsts[self.issued % len(self.firsts)]
        self.issued += 1
        rest = length - len(self.prefix) - 1
        return self.prefix + [first] + [self.rng.randrange(1, self.n_vocab) for _ in range(rest)]


@dataclass
class Outcome:
    """One streamed request, times from time.perf_counter()."""

    sent: float
    prompt_tokens: int
    end: float = 0.0
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk with text
    output_tokens: int = 0
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    def gaps(self, start: float = -math.inf, stop: float = math.inf) -> list[float]:
        """Inter-token latencies: the gaps between consecutive text chunks, those ending in [start, stop)."""
        return [b - a for a, b in pairwise(self.chunks) if start <= b < stop]


def request_body(args: argparse.Namespace, prompt: list[int], max_tokens: int, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if args.greedy:
        body["temperature"] = 0.0
    else:
        body.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.seed is not None:
        body["seed"] = args.seed + index
    body.update(dict(args.field))
    return body


CANCELLED = "cancelled"


async def stream_completion(http: httpx.AsyncClient, body: dict[str, Any], out: Outcome | None = None, *,
                            on_chunk: Callable[[], None] | None = None) -> Outcome:
    """POST /v1/completions with stream: true, filling out as the chunks come (so that a request cancelled
    half-way keeps its chunks, with error CANCELLED). A failed request does not raise: Outcome.error says why."""
    out = out or Outcome(sent=0.0, prompt_tokens=0)
    out.sent, out.prompt_tokens = time.perf_counter(), len(body["prompt"])
    usage: dict[str, Any] | None = None
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                out.error = f"HTTP {r.status_code}: {text[:300]}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                obj = json.loads(data)
                if "error" in obj:
                    out.error = f"error event: {json.dumps(obj['error'])[:300]}"
                    return out
                for choice in obj.get("choices") or []:
                    if choice.get("text"):
                        out.chunks.append(now)
                        if on_chunk is not None:
                            on_chunk()
                    if choice.get("finish_reason"):
                        out.finish_reason = choice["finish_reason"]
                usage = obj.get("usage") or usage
                out.timings = obj.get("timings") or out.timings
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    except asyncio.CancelledError:
        out.error = CANCELLED
        raise
    finally:
        out.end = time.perf_counter()
    if usage is not None:
        out.output_tokens = int(usage.get("completion_tokens", 0))
    elif out.timings is not None:
        out.output_tokens = int(out.timings.get("predicted_n", 0))
    else:
        out.output_tokens = len(out.chunks)
    if out.finish_reason is None:
        out.error = "the stream ended without a finish_reason"
    elif body.get("ignore_eos") and out.output_tokens != body["max_tokens"]:
        out.error = f"{out.output_tokens} tokens generated of max_tokens {body['max_tokens']} with ignore_eos"
    return out


def client(url: str, concurrency: int, timeout: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout), limits=limits)


def errors_of(outcomes: list[Outcome]) -> dict[str, Any]:
    failed = [o.error for o in outcomes if o.error]
    return {"errors": len(failed), "error_samples": sorted(set(failed))[:5]}


# -- the scenarios --

async def run_load(url: str, args: argparse.Namespace, prompts: Prompts, concurrency: int) -> dict[str, Any]:
    n = args.requests or 4 * concurrency
    bodies = [request_body(args, prompts.make(args.prompt), args.gen, i) for i in range(n)]
    outcomes: list[Outcome] = []
    async with client(url, concurrency, args.timeout) as http:
        pending = iter(bodies)

        async def stream() -> None:
            for body in pending:  # one iterator shared by the streams: each request is sent once
                outcomes.append(await stream_completion(http, body))

        await asyncio.gather(*(stream() for _ in range(concurrency)))
    ok = [o for o in outcomes if not o.error]
    duration = max(o.end for o in outcomes) - min(o.sent for o in outcomes)
    output_tokens = sum(o.output_tokens for o in ok)
    tpot = [(o.chunks[-1] - o.chunks[0]) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1 and o.chunks]
    return {"scenario": "load", "concurrency": concurrency, "requests": n, "ok": len(ok), **errors_of(outcomes),
            "prompt_tokens": args.prompt, "gen_tokens": args.gen, "output_tokens": output_tokens,
            "duration_s": round(duration, 4), "output_tps": round(output_tokens / duration, 3) if duration else 0.0,
            "ttft_ms": summary_ms([o.ttft for o in ok if o.ttft is not None]),
            "itl_ms": summary_ms([g for o in ok for g in o.gaps()]), "tpot_ms": summary_ms(tpot),
            **full_decode_rate(ok, concurrency),
            "sample_body": {k: v for k, v in bodies[0].items() if k != "prompt"}}


def check_mixed_fits(args: argparse.Namespace, info: dict[str, Any], concurrency: int) -> None:
    """The mixed scenario at this many streams fits the server's slots (where it tells them), else LoadError."""
    n_ctx_slot, n_slots = info.get("n_ctx_slot"), info.get("n_slots")
    if n_ctx_slot is not None and max(args.long) + 1 > n_ctx_slot:
        raise LoadError(f"a slot holds {n_ctx_slot} tokens; the longest --long prompt needs {max(args.long) + 1}")
    if n_slots is not None and n_slots < concurrency + 1:
        raise LoadError(f"{n_slots} slots: {concurrency} streams and a long prompt need {concurrency + 1}")


async def run_mixed(url: str, args: argparse.Namespace, prompts: Prompts, concurrency: int,
                    info: dict[str, Any]) -> dict[str, Any]:
    check_mixed_fits(args, info, concurrency)
    streams: list[Outcome] = []
    received = [0] * concurrency  # text chunks each stream received
    generating = asyncio.Event()  # every stream received text: "alone" starts (the first prefills are over)
    enough = asyncio.Event()  # every stream received --alone chunks
    t_alone = 0.0
    count = iter(range(1, 10**9))  # request indices (for --seed)

    async def stream(k: int) -> None:
        def seen() -> None:
            nonlocal t_alone
            received[k] += 1
            if not generating.is_set() and min(received) >= 1:
                t_alone = time.perf_counter()
                generating.set()
            if min(received) >= args.alone:
                enough.set()

        while True:  # until cancelled: a request that ends is followed by the next
            body = request_body(args, prompts.make(args.prompt), args.gen, next(count))
            streams.append(out := Outcome(sent=0.0, prompt_tokens=0))
            await stream_completion(http, body, out, on_chunk=seen)
            if out.error:  # a stream that fails stops (it is counted), rather than failing again at once
                return

    longs: list[dict[str, Any]] = []
    async with client(url, concurrency + 1, args.timeout) as http:
        tasks = [asyncio.ensure_future(stream(k)) for k in range(concurrency)]
        try:
            waiter = asyncio.ensure_future(enough.wait())
            await asyncio.wait([waiter, *tasks], timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED)
            if not enough.is_set():
                waiter.cancel()
                raise LoadError(f"the {concurrency} streams did not each receive {args.alone} text chunks "
                                f"within {args.timeout} s: {errors_of(streams)['error_samples']}")
            t_long = time.perf_counter()
            for j, n in enumerate(args.long):
                body = request_body(args, prompts.make(n), 1, 10**6 + j)
                body.pop("ignore_eos", None)
                o = await stream_completion(http, body)
                t = o.timings or {}
                longs.append({"tokens": n, "ok": o.error is None, "error": o.error,
                              "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
                              "prompt_tps": round(t["prompt_n"] / t["prompt_ms"] * 1e3, 3)
                              if t.get("prompt_ms") else None,
                              # to the end of its stream: its one token may come without text
                              "latency_ms": round(1e3 * (o.end - o.sent), 3)})
            t_end = time.perf_counter()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.5)  # the server notices the closed streams and frees their slots
    gen_errors = [o.error for o in streams if o.error and o.error != CANCELLED]  # not the ones stopped at the end
    timed = [x for x in longs if x["prompt_ms"]]
    prompt_tps = (sum(x["prompt_n"] for x in timed) / sum(x["prompt_ms"] for x in timed) * 1e3) if timed else None
    return {"scenario": "mixed", "concurrency": concurrency, "prompt_tokens": args.prompt, "gen_tokens": args.gen,
            "long_prompts": longs, "prompt_tps": round(prompt_tps, 3) if prompt_tps else None,
            "itl_ms_alone": summary_ms([g for o in streams for g in o.gaps(t_alone, t_long)]),
            "itl_ms_mixed": summary_ms([g for o in streams for g in o.gaps(t_long, t_end)]),
            "stream_requests": len(streams), "alone_s": round(t_long - t_alone, 4),
            "mixed_s": round(t_end - t_long, 4),
            "errors": len(gen_errors) + sum(not x["ok"] for x in longs),
            "error_samples": sorted({*gen_errors, *(x["error"] for x in longs if x["error"])})[:5]}


# -- servers --

def server_info(url: str) -> dict[str, Any]:
    """What the runs need to know of a server: its vocabulary size, slots and slot context (None if unknown).
    Ours has them in /v1/models' meta; llama-server has n_vocab there and the rest in /props."""
    info: dict[str, Any] = {"n_vocab": None, "n_slots": None, "n_ctx_slot": None}
    with httpx.Client(base_url=url, timeout=30) as http:
        r = http.get("/v1/models")
        if r.status_code != 200:
            raise LoadError(f"GET {url}/v1/models answered {r.status_code}: {r.text[:300]}")
        meta = (r.json().get("data") or [{}])[0].get("meta") or {}
        info.update({k: meta[k] for k in info if k in meta})
        props = http.get("/props")
        if props.status_code == 200:
            p = props.json()
            info["n_slots"] = info["n_slots"] or p.get("total_slots")
            info["n_ctx_slot"] = info["n_ctx_slot"] or (p.get("default_generation_settings") or {}).get("n_ctx")
            info["build"] = p.get("build_info")
    if not info["n_vocab"]:
        raise LoadError(f"{url} does not say its vocabulary size (n_vocab in /v1/models' meta)")
    return info


def start_server(name: str, args: argparse.Namespace) -> ServerProcess:
    flags = ["-m", args.model, *args.server_flags]
    if name == "ours":
        return ServerProcess([*flags, *shlex.split(args.ours_args)], start_timeout=args.timeout, command=OURS)
    return ServerProcess([*flags, *shlex.split(args.upstream_args)], start_timeout=args.timeout,
                         command=[str(args.server_bin)])


def engine_steps(url: str) -> tuple[int, dict[str, float]] | None:
    """Our server's engine steps so far and the time of each phase of a step in all (ms: host, and issue,
    stream, wait where the server reports them), from /engine; None elsewhere."""
    try:
        r = httpx.get(url + "/engine", timeout=10)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict) or "steps" not in body or "step_host_ms" not in body:
        return None
    n = int(body["steps"])
    means = {"host": float(body["step_host_ms"]["mean"]), **body.get("step_phase_ms", {})}
    return n, {k: float(v) * n for k, v in means.items()}


def step_summary(before: tuple[int, dict[str, float]] | None,
                 after: tuple[int, dict[str, float]] | None) -> dict[str, Any] | None:
    """The engine steps of one run and the mean of each phase per step (ms): host (the devices waiting for
    the engine between steps), issue (building the batch, llama_decode's return), stream (the text of the
    step before, while this one runs) and wait (for the devices, then sampling)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    n = after[0] - before[0]
    return {"steps": n, **{f"{k}_ms_mean": round((v - before[1].get(k, 0.0)) / n, 4) for k, v in after[1].items()}}


async def run_server(name: str, url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    info = server_info(url)
    if "mixed" in args.scenarios:  # before any run, rather than after the runs of the smaller counts
        check_mixed_fits(args, info, max(args.concurrency))
    prompts = Prompts(info["n_vocab"], args.shared_prefix, args.prompt_seed)
    if args.warmup:
        async with client(url, 1, args.timeout) as http:
            for i in range(args.warmup):
                body = request_body(args, prompts.make(args.prompt), min(args.gen, 8), -1 - i)
                warm = await stream_completion(http, body)
                if warm.error:
                    raise LoadError(f"the warm-up request failed: {warm.error}")
    # one generator for all the runs of a server, so that no prompt starts like an earlier one; the same
    # seed for every server, so that they get the same prompts
    runs = []
    for c in args.concurrency:
        for scenario in args.scenarios:
            before = engine_steps(url)
            if scenario == "load":
                run = await run_load(url, args, prompts, c)
            else:
                run = await run_mixed(url, args, prompts, c, info)
            steps = step_summary(before, engine_steps(url))
            runs.append({"server": name, **run, **({"engine_steps": steps} if steps else {})})
            print(f"server-load: {name} {scenario} C={c} done", file=sys.stderr, flush=True)
    return runs


def main() -> int:
    args = parse_args()
    report: dict[str, Any] = {
        "tool": "scripts/server-load",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(), "hardware": hardware(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "servers": [], "runs": []}
    status = 0
    targets = [(args.name, args.url)] if args.url else [(name, None) for name in args.servers]
    for name, url in targets:
        server: ServerProcess | None = None
        try:
            if url is None:
                print(f"server-load: starting {name}", file=sys.stderr, flush=True)
                server = start_server(name, args)
                url = server.url
            entry = {"name": name, "url": url, "command": server.command if server else None,
                     "info": server_info(url)}
            report["servers"].append(entry)
            report["runs"] += asyncio.run(run_server(name, url, args))
        except (LoadError, RuntimeError, httpx.HTTPError, OSError) as e:
            log = server.log[-3000:] if server is not None else ""
            print(f"server-load: {name}: {e}" + (f"\nserver log (end):\n{log}" if log else ""), file=sys.stderr)
            status = 2
        finally:
            if server is not None:
                server.stop()  # also on errors and Ctrl-C: no server outlives the script
    if report["runs"]:
        print(tables(report["runs"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if status == 0 and any(r["errors"] for r in report["runs"]):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
