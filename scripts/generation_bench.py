"""Generation from Python against the context's own decode rate, side by side in one process:

  completion   Llama.create_completion of -n tokens after a -p token prompt, greedy and with llama.cpp's
               default sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), interleaved -r times;
               reported: t/s of each and default / greedy (the native sampler's cost per token);
  decode       for each stream count S of --streams: S sequences of -p prompt tokens, then -n steps of one
               token per sequence through Context.decode_batch with no output (the raw batched decode rate),
               with an output row per sequence, computed and copied to the host but not read (the raw rate
               with outputs: what a server step, which needs every row, cannot beat), through
               decode_batch_sample with one greedy chain per sequence (what an output row costs: the output
               layer, the copy to the host, one pass over the row), with one default-sampling chain per
               sequence (the server's step: every row sampled in C), the same chains given every row whole
               (no candidate prefilter: Sampler(prefilter=False)), and the same with the chains in the graph
               (backend sampling, where llama.cpp takes them);
               --sampling-threads N,M,... repeats the sampled mode with that many threads sampling a step's
               rows;
  rows         ms per row of one sampler on random rows of the vocabulary's size (one thread), llama.cpp's
               default chain and a greedy one, with the candidate prefilter and given every row whole
               (--no-completion leaves this and completion out; --modes picks decode modes);
  workload     for each S: --requests prompts of -p tokens, S at a time, -n tokens each with default sampling,
               straight on a context shaped like the server's (--slots sequences of --slot-ctx tokens): each
               wave prefills its S prompts together (n_batch tokens per llama_decode, the first token sampled
               at each prompt's end), then samples -n - 1 more steps of S tokens. Its t/s (generated tokens
               over the whole time, prefill included) is what a server running the same load through this
               context could reach with no host work: scripts/server-load's output tok/s is measured against it.

    scripts/generation-bench -m qwen3-8b-q8_0.gguf -sm none -ngl -1 --streams 1,8,32 --json out.json

Model flags are the bench's (one value each). Prints a markdown table; --json writes every number.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_so import Llama, _llama, args as A, config, synth
from pyllama_so.sampling import SamplingParams

DEFAULT_SAMPLING = SamplingParams()  # llama.cpp's and llama-cpp-python's defaults


def completion_rates(llm: Llama, prompt: list[int], n_gen: int, reps: int) -> dict[str, Any]:
    """t/s of create_completion greedy and with default sampling, ignoring EOS (a random model may end
    early): logit_bias bans the end-of-generation token so every run makes n_gen tokens."""
    ban = {llm.token_eos(): float("-inf")}
    rates: dict[str, list[float]] = {"greedy": [], "default": []}
    for rep in range(reps + 1):  # the first round warms up
        for name, temp in (("greedy", 0.0), ("default", 0.8)):
            llm.reset()
            t0 = time.perf_counter()
            out = llm.create_completion(prompt, max_tokens=n_gen, temperature=temp, seed=rep, logit_bias=ban)
            dt = time.perf_counter() - t0
            assert isinstance(out, dict)  # not streamed
            made = out["usage"]["completion_tokens"]
            if rep:
                rates[name].append(made / dt)
    res: dict[str, Any] = {k: {"mean": statistics.fmean(v), "samples": v} for k, v in rates.items()}
    res["ratio_default_over_greedy"] = res["default"]["mean"] / res["greedy"]["mean"]
    return res


def sampled_tokens(got: list[tuple[int, float | None, list[tuple[int, float]] | None] | None]) -> list[int]:
    """The token of each item of a decode_batch_sample call whose items all have a sampler."""
    toks = [g[0] for g in got if g is not None]
    assert len(toks) == len(got), "an item without a sampler"
    return toks


def steps_rate(model: _llama.Model, ctx: _llama.Context, prompts: list[list[int]], n_gen: int,
               mode: str) -> tuple[float, bool, list[int]]:
    """t/s of n_gen steps of one token per prompt's sequence, after the prompts: "raw" (decode_batch, no
    output), "outputs" (decode_batch with an output row per sequence, none read), "greedy"
    (decode_batch_sample, one greedy chain per sequence: the cost of an output row, its copy to the host and a
    pass over it), "sampled" (one default-sampling chain per sequence), "whole" (the
    same chains given every row whole: Sampler(prefilter=False)) or "backend" (the default chains in the
    graph). Also whether every chain ran in the graph (backend mode), and the rows the candidate prefilter
    picked out and gave whole (Sampler.prefilter_rows, summed)."""
    ctx.clear()
    ctx.decode_batch([(s, p, False) for s, p in enumerate(prompts)])
    params = replace(DEFAULT_SAMPLING, temperature=0.0) if mode == "greedy" else DEFAULT_SAMPLING
    samplers = [] if mode in ("raw", "outputs") else [
        _llama.Sampler(model, replace(params, seed=s), n_ctx=ctx.n_ctx_seq, prefilter=mode != "whole")
        for s in range(len(prompts))]
    on_backend = [ctx.set_backend_sampler(s, smp) for s, smp in enumerate(samplers)] if mode == "backend" else []
    toks = [int(p[-1]) for p in prompts]
    ctx.synchronize()
    t0 = time.perf_counter()
    for _ in range(n_gen):
        if mode in ("raw", "outputs"):
            ctx.decode_batch([(s, [t], mode == "outputs") for s, t in enumerate(toks)])
        else:
            items = [(s, [t], smp, None) for s, (t, smp) in enumerate(zip(toks, samplers, strict=True))]
            got = ctx.decode_batch_sample(items)
            toks = sampled_tokens(got)
    ctx.synchronize()
    dt = time.perf_counter() - t0
    rows = [sum(smp.prefilter_rows[0] for smp in samplers), sum(smp.prefilter_rows[1] for smp in samplers)]
    for smp in samplers:
        smp.free()
    return len(prompts) * n_gen / dt, bool(on_backend) and all(on_backend), rows


DECODE_MODES = ("raw", "outputs", "greedy", "sampled", "whole", "backend")


def decode_rates(model: _llama.Model, ctx: _llama.Context, n_streams: int, n_prompt: int, n_gen: int,
                 reps: int, modes: list[str]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"streams": n_streams}
    for mode in modes:
        samples, in_graph, rows = [], False, [0, 0]
        for rep in range(reps + 1):  # the first round warms up
            prompts = [rng.integers(0, model.n_vocab, n_prompt).tolist() for _ in range(n_streams)]
            rate, in_graph, rows = steps_rate(model, ctx, prompts, n_gen, mode)
            if rep:
                samples.append(rate)
        out[mode] = {"mean": statistics.fmean(samples), "samples": samples}
        if mode in ("greedy", "sampled"):  # of the last round: a share of whole rows says ties in the logits
            out[mode]["prefilter_rows"] = {"picked": rows[0], "whole": rows[1]}
        if mode == "backend":
            out["backend"]["in_graph"] = in_graph
    for name, num, den in (("outputs_over_raw", "outputs", "raw"), ("sampled_over_raw", "sampled", "raw"),
                           ("sampled_over_outputs", "sampled", "outputs"), ("greedy_over_raw", "greedy", "raw"),
                           ("sampled_over_whole", "sampled", "whole"), ("backend_over_sampled", "backend", "sampled")):
        if num in out and den in out:
            out[f"ratio_{name}"] = out[num]["mean"] / out[den]["mean"]
    return out


def row_costs(model: _llama.Model, n_rows: int = 64, reps: int = 5) -> dict[str, float]:
    """ms per row of Sampler.sample_logits on random rows of the vocabulary's size, one thread: llama.cpp's
    default chain and a greedy one, each with the candidate prefilter and with every row whole."""
    rng = np.random.default_rng(4)
    rows = [(rng.standard_normal(model.n_vocab) * sd).astype(np.float32)
            for sd in (0.5, 2.0) for _ in range(n_rows // 2)]
    out: dict[str, float] = {}
    for name, params in (("default", DEFAULT_SAMPLING), ("greedy", replace(DEFAULT_SAMPLING, temperature=0.0))):
        for prefilter in (True, False):
            smp = _llama.Sampler(model, replace(params, seed=1), prefilter=prefilter)
            try:
                for row in rows[:4]:
                    smp.sample_logits(row)
                t0 = time.perf_counter()
                for _ in range(reps):
                    for row in rows:
                        smp.sample_logits(row)
                ms = (time.perf_counter() - t0) * 1e3 / (reps * len(rows))
                out[f"{name}_{'prefilter' if prefilter else 'whole'}"] = ms
            finally:
                smp.free()
    return out


def thread_rates(model: _llama.Model, ctx: _llama.Context, n_streams: int, n_prompt: int, n_gen: int, reps: int,
                 threads: list[int]) -> dict[str, Any]:
    """The sampled mode at each count of sampling threads, interleaved."""
    rng = np.random.default_rng(0)
    default = ctx.sampling_threads
    samples: dict[int, list[float]] = {t: [] for t in threads}
    try:
        for rep in range(reps + 1):
            prompts = [rng.integers(0, model.n_vocab, n_prompt).tolist() for _ in range(n_streams)]
            for t in threads:
                ctx.sampling_threads = t
                rate, _, _ = steps_rate(model, ctx, prompts, n_gen, "sampled")
                if rep:
                    samples[t].append(rate)
    finally:
        ctx.sampling_threads = default
    return {str(t): {"mean": statistics.fmean(v), "samples": v} for t, v in samples.items()}


def workload_rate(model: _llama.Model, ctx: _llama.Context, n_streams: int, n_requests: int, n_prompt: int,
                  n_gen: int, reps: int) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    samples = []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        made = 0
        for first in range(0, n_requests, n_streams):
            wave = range(min(n_streams, n_requests - first))
            ctx.clear()
            samplers = [_llama.Sampler(model, replace(DEFAULT_SAMPLING, seed=first + s), n_ctx=ctx.n_ctx_seq)
                        for s in wave]
            prompts = [rng.integers(0, model.n_vocab, n_prompt).tolist() for _ in wave]
            items = [(s, p, smp, None) for s, (p, smp) in enumerate(zip(prompts, samplers, strict=True))]
            got = ctx.decode_batch_sample(items)
            toks = sampled_tokens(got)
            for _ in range(n_gen - 1):
                items = [(s, [t], smp, None) for s, (t, smp) in enumerate(zip(toks, samplers, strict=True))]
                got = ctx.decode_batch_sample(items)
                toks = sampled_tokens(got)
            made += len(wave) * n_gen
            for smp in samplers:
                smp.free()
        ctx.synchronize()
        if rep:
            samples.append(made / (time.perf_counter() - t0))
    return {"streams": n_streams, "requests": n_requests, "mean": statistics.fmean(samples), "samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    A.add_model_args(ap, synthetic_shapes=list(synth.SHAPES))
    ap.add_argument("-p", "--n-prompt", type=A.positive_int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("-n", "--n-gen", type=A.positive_int, default=128, help="generated tokens (default 128)")
    ap.add_argument("-r", "--repetitions", type=A.positive_int, default=3, help="timed repetitions (default 3)")
    ap.add_argument("--streams", type=A.comma_list(A.positive_int), default=[1, 8, 32],
                    help="sequences decoded together (default 1,8,32)")
    ap.add_argument("--sampling-threads", type=A.comma_list(A.positive_int), default=[],
                    help="also run the sampled mode with these counts of sampling threads")
    ap.add_argument("--requests", type=A.non_negative_int, default=32,
                    help="requests of the workload measure (default 32; 0 leaves it out)")
    ap.add_argument("--slots", type=A.positive_int, default=0,
                    help="the workload context's sequences, as the server's -np (default: the most --streams)")
    ap.add_argument("--slot-ctx", type=A.positive_int, default=0,
                    help="the workload context's tokens per sequence, as the server's -c / -np "
                         "(default: -p + -n rounded up to 256)")
    ap.add_argument("--modes", type=A.comma_list(str), default=list(DECODE_MODES),
                    help=f"the decode modes to run (default {','.join(DECODE_MODES)}), e.g. raw,greedy under a tracer")
    ap.add_argument("--no-completion", action="store_true",
                    help="leave out create_completion and the one-thread row costs")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    unknown = sorted(set(a.modes) - set(DECODE_MODES))
    if unknown or not a.modes:
        ap.error(f"--modes: expected some of {','.join(DECODE_MODES)}, got {','.join(a.modes)}")
    if a.sampling_threads and "sampled" not in a.modes:
        ap.error("--sampling-threads repeats the sampled mode: add it to --modes")
    path = a.model[0] if isinstance(a.model, list) else a.model
    path = Path(path) if path else synth.cached_model(a.synthetic, "f16")
    results: dict[str, Any] = {"model": str(path), "n_prompt": a.n_prompt, "n_gen": a.n_gen}
    try:
        model_params, context_params = A.tool_config(a, n_ctx=-(-(a.n_prompt + a.n_gen) // 256) * 256)
    except ValueError as e:
        A.exit_on_flag_error(ap, e)
        ap.error(str(e))
    common = dict(n_gpu_layers=a.n_gpu_layers, split_mode=a.split_mode, tensor_split=a.tensor_split,
                  attn_split=a.attn_split, main_gpu=a.main_gpu, flash_attn=a.flash_attn, n_threads=a.threads,
                  split_overlap=a.split_overlap, n_batch=a.batch_size, n_ubatch=a.ubatch_size, type_k=a.cache_type_k,
                  type_v=a.cache_type_v, rpc_servers=a.rpc)
    if not a.no_completion:
        with Llama(path, n_ctx=context_params.n_ctx, **common) as llm:
            prompt = np.random.default_rng(1).integers(0, llm.n_vocab(), a.n_prompt).tolist()
            results["completion"] = completion_rates(llm, prompt, a.n_gen, a.repetitions)
    decode = []
    model = config.load_model(path, model_params)
    try:
        if not a.no_completion:
            results["row_ms"] = row_costs(model)
        for s in a.streams:
            # s sequences of one slot's context each; the batch holds at least one token of each
            n_batch = max(context_params.n_batch, s)
            ctx = config.create_context(model, dataclasses.replace(
                context_params, n_ctx=s * context_params.n_ctx, n_batch=n_batch, n_seq_max=s,
                n_ubatch=a.ubatch_size or 512))
            try:
                decode.append(decode_rates(model, ctx, s, a.n_prompt, a.n_gen, a.repetitions, a.modes))
                decode[-1]["sampling_threads_default"] = ctx.sampling_threads
                if a.sampling_threads:
                    decode[-1]["sampled_by_threads"] = thread_rates(model, ctx, s, a.n_prompt, a.n_gen, a.repetitions,
                                                                    a.sampling_threads)
            finally:
                ctx.free()
        if a.requests:
            slots = a.slots or max(a.streams)
            slot_ctx = a.slot_ctx or -(-(a.n_prompt + a.n_gen) // 256) * 256
            ctx = config.create_context(model, dataclasses.replace(
                context_params, n_ctx=slots * slot_ctx, n_seq_max=slots, n_ubatch=a.ubatch_size or 512))
            try:
                results["workload"] = [workload_rate(model, ctx, s, a.requests, a.n_prompt, a.n_gen, a.repetitions)
                                       for s in a.streams if s <= slots]
                results["workload_context"] = {"slots": slots, "slot_ctx": slot_ctx, "n_batch": ctx.n_batch,
                                               "n_ubatch": ctx.n_ubatch}
            finally:
                ctx.free()
    finally:
        model.free()
    results["decode"] = decode
    if "completion" in results:
        c = results["completion"]
        print(f"| create_completion, {a.n_gen} tokens | greedy t/s | default sampling t/s | default / greedy |")
        print("|---|---:|---:|---:|")
        print(f"| {path.name} | {c['greedy']['mean']:.1f} | {c['default']['mean']:.1f} "
              f"| {c['ratio_default_over_greedy']:.3f} |")
        print()
    labels = {"raw": "raw decode t/s", "outputs": "raw with outputs t/s", "greedy": "greedy rows t/s",
              "sampled": "sampled in C t/s", "whole": "whole rows t/s", "backend": "backend sampling t/s"}
    ratios = [("outputs_over_raw", "outputs / raw"), ("greedy_over_raw", "greedy / raw"),
              ("sampled_over_raw", "sampled / raw"), ("sampled_over_outputs", "sampled / outputs"),
              ("sampled_over_whole", "prefilter / whole"), ("backend_over_sampled", "backend / CPU")]
    cols = [(m, labels[m]) for m in a.modes]
    cols += [(key, title) for key, title in ratios if f"ratio_{key}" in decode[0]]
    print("| streams | " + " | ".join(title for _, title in cols) + (" | in graph |" if "backend" in a.modes else " |"))
    print("|---:|" + "---:|" * len(cols) + ("---|" if "backend" in a.modes else ""))
    for d in decode:
        cells = [f"{d[key]['mean']:.1f}" if key in d else f"{d[f'ratio_{key}']:.3f}" for key, _ in cols]
        tail = f" | {d['backend']['in_graph']} |" if "backend" in a.modes else " |"
        print(f"| {d['streams']} | " + " | ".join(cells) + tail)
    for d in decode:
        for mode in ("greedy", "sampled"):
            if mode in d and sum(d[mode]["prefilter_rows"].values()):
                r = d[mode]["prefilter_rows"]
                print(f"prefilter, {d['streams']} streams, {mode}: {r['picked']} rows picked, {r['whole']} whole")
    if "row_ms" in results:
        print()
        print("| a row of the vocabulary, one thread | prefilter ms | whole row ms | whole / prefilter |")
        print("|---|---:|---:|---:|")
        for name in ("default", "greedy"):
            pre, whole = results["row_ms"][f"{name}_prefilter"], results["row_ms"][f"{name}_whole"]
            print(f"| {name} chain | {pre:.4f} | {whole:.4f} | {whole / pre:.2f} |")
    if any(d.get("sampled_by_threads") for d in decode):
        print()
        print("| sampled in C, by sampling threads | t/s |")
        print("|---|---:|")
    for d in decode:
        for t, r in d.get("sampled_by_threads", {}).items():
            print(f"| {d['streams']} streams, {t} sampling threads | {r['mean']:.1f} |")
    if results.get("workload"):
        print()
        print(f"| workload: {a.requests} requests, {a.n_prompt} + {a.n_gen} tokens | t/s, prefill included |")
        print("|---:|---:|")
        for w in results["workload"]:
            print(f"| {w['streams']} streams | {w['mean']:.1f} |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
