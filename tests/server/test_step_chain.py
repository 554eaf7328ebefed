"""A server step that ends and starts the next in one call (Context.decode_batch_sample_chain, used by the
engine whenever nothing is to be done between two steps): the same tokens as ending and beginning them
apart, the C side's choice of which sequences go on, and the plans it refuses without losing the step."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.engine import Delta, Done, Engine, Event, Failed, Job

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture()
def ctx(tiny_model: Path) -> Any:
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=3 * 256, n_batch=64, n_ubatch=16, n_seq_max=3, n_threads=2)
    yield ctx
    ctx.free()
    model.free()


def _prompt(seed: int, n: int) -> list[int]:
    return [1] + np.random.default_rng(seed).integers(3, 500, n - 1).tolist()


def _run_apart(ctx: Any, samplers: list[Any], prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Each sequence's prompt, then `steps` tokens each, with begin/end: the reference."""
    got: list[list[int]] = [[] for _ in prompts]
    items = [(i, p, samplers[i], None) for i, p in enumerate(prompts)]
    for _ in range(steps):
        ctx.decode_batch_sample_begin(items)
        outs = ctx.decode_batch_sample_end()
        for i, o in enumerate(outs):
            got[i].append(o[0])
        items = [(i, [got[i][-1]], samplers[i], None) for i in range(len(prompts))]
    return got


def test_chained_steps_sample_what_separate_steps_do(tiny_model: Path, ctx: Any) -> None:
    model = ctx.model
    prompts = [_prompt(1, 12), _prompt(2, 60)]  # 72 tokens: the first row is sampled in the first of two calls
    params = [GREEDY, SamplingParams(temperature=0.9, top_k=50, seed=7)]
    ref_samplers = [_llama.Sampler(model, p) for p in params]
    want = _run_apart(ctx, ref_samplers, prompts, 10)
    for i in range(2):
        ctx.truncate(0, i)
    samplers = [_llama.Sampler(model, p) for p in params]
    ctx.decode_batch_sample_begin([(i, p, samplers[i], None) for i, p in enumerate(prompts)])
    got: list[list[int]] = [[], []]
    for _ in range(9):
        outs, started, t_sampled, t_launched, error = ctx.decode_batch_sample_chain(
            [(i, None, samplers[i], None, True) for i in range(2)])
        assert error is None and t_launched >= t_sampled
        for i, o in enumerate(outs):
            got[i].append(o[0])
        # the next step holds each sequence's token just sampled
        assert [(s, toks) for s, toks, _, _ in started] == [(i, [got[i][-1]]) for i in range(2)]
    for i, o in enumerate(ctx.decode_batch_sample_end()):
        got[i].append(o[0])
    assert got == want
    for smp in ref_samplers + samplers:
        smp.free()


def test_a_chain_starts_only_what_goes_on(ctx: Any) -> None:
    """A sequence whose token is end-of-generation, or whose go_on is false, is left out of the next step; a
    prompt piece goes in whatever; with nothing to start, no step runs afterwards."""
    model = ctx.model
    eog = next(t for t in range(model.n_vocab) if model.is_eog(t))
    ends = _llama.Sampler(model, SamplingParams(temperature=0.0, logit_bias={eog: 100.0}))
    goes = _llama.Sampler(model, GREEDY)
    ctx.decode_batch_sample_begin([(0, _prompt(3, 8), ends, None), (1, _prompt(4, 8), goes, None)])
    outs, started, *_, error = ctx.decode_batch_sample_chain(
        [(0, None, ends, None, True), (1, None, goes, None, True), (2, _prompt(5, 20), None, None, True)])
    assert error is None and outs[0][0] == eog
    assert [(s, len(t)) for s, t, _, _ in started] == [(1, 1), (2, 20)]
    outs, started, *_ = ctx.decode_batch_sample_chain([(1, None, goes, None, False)])
    assert outs[0] is not None and outs[1] is None and started == []
    with pytest.raises(RuntimeError, match="no step"):
        ctx.decode_batch_sample_end()
    ends.free()
    goes.free()


def test_a_refused_plan_leaves_the_step_running(ctx: Any) -> None:
    model = ctx.model
    smp = _llama.Sampler(model, GREEDY)
    ctx.decode_batch_sample_begin([(0, _prompt(6, 8), smp, None), (1, _prompt(7, 8), None, None)])
    with pytest.raises(ValueError, match="no sampled output"):
        ctx.decode_batch_sample_chain([(1, None, smp, None, True)])  # sequence 1 had no output
    with pytest.raises(ValueError, match="n_batch"):
        ctx.decode_batch_sample_chain([(2, list(range(3, 70)), None, None, True)])
    with pytest.raises(ValueError, match="distinct"):
        ctx.decode_batch_sample_chain([(0, None, smp, None, True), (0, [5], None, None, True)])
    outs = ctx.decode_batch_sample_end()  # still there
    assert outs[0] is not None and outs[1] is None
    smp.free()


def test_a_chain_gives_the_logprobs_of_the_step_that_ends(ctx: Any) -> None:
    """The logprobs a step asks for are computed before the next decode: those of Context.logprobs on the same
    row, and the chained step's own outputs then carry theirs."""
    model = ctx.model
    prompt = _prompt(8, 16)
    ref = _llama.Sampler(model, GREEDY)
    ctx.decode_batch_sample_begin([(0, prompt, ref, 4)])
    want = ctx.decode_batch_sample_end()[0]
    assert want[1] == pytest.approx(ctx.logprobs(want[0], 4)[0], abs=1e-6)
    ctx.decode_batch_sample_begin([(0, [want[0]], ref, 4)])
    want_next = ctx.decode_batch_sample_end()[0]
    ctx.truncate(0, 0)
    smp = _llama.Sampler(model, GREEDY)
    ctx.decode_batch_sample_begin([(0, prompt, smp, 4)])
    outs, started, *_ = ctx.decode_batch_sample_chain([(0, None, smp, 4, True)])
    assert outs[0] == want and started[0][:2] == (0, [want[0]])
    assert ctx.decode_batch_sample_end()[0] == want_next
    ref.free()
    smp.free()


def _serve(ctx: Any, chain: bool, jobs: list[dict[str, Any]]) -> tuple[dict[str, list[Event]], int]:
    """Run jobs (Job fields; "after": how many events of job 0 before it is submitted) on an engine."""
    events: dict[str, list[Event]] = {}
    done = threading.Semaphore(0)
    engine: Engine

    def sink(name: str, k: int) -> Any:
        def emit(ev: Event) -> None:
            events.setdefault(name, []).append(ev)
            if name == "0":
                for j, spec in enumerate(jobs):
                    if spec.get("after") == len(events["0"]):
                        engine.submit(Job(**{f: v for f, v in spec.items() if f != "after"}, emit=sink(str(j), j)))
            if not isinstance(ev, Delta):
                done.release()
        return emit

    engine = Engine(ctx, chain_steps=chain)
    engine.start()
    try:
        for j, spec in enumerate(jobs):
            if "after" not in spec:
                engine.submit(Job(**spec, emit=sink(str(j), j)))
        for _ in jobs:
            assert done.acquire(timeout=60)
        chained = engine.snapshot().steps_chained
    finally:
        engine.stop()
    for i in range(ctx.n_seq_max):
        ctx.truncate(0, i)
    return events, chained


def _texts(events: dict[str, list[Event]]) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    out = {}
    for name, evs in events.items():
        last = evs[-1]
        assert not isinstance(last, Failed), last
        assert isinstance(last, Done)
        tokens = tuple(t for e in evs if isinstance(e, (Delta, Done)) for t in e.tokens)
        out[name] = ("".join(e.text for e in evs if isinstance(e, (Delta, Done))), last.finish_reason, tokens)
    return out


def test_the_engine_gives_the_same_answers_chained_or_not(ctx: Any) -> None:
    """Greedy and seeded jobs, a stop string, max_tokens, end of generation, logprobs, and prompts arriving
    while others generate: every event's text and tokens equal with and without chained steps."""
    model = ctx.model
    eog = next(t for t in range(model.n_vocab) if model.is_eog(t))
    jobs: list[dict[str, Any]] = [
        {"prompt": _prompt(10, 20), "max_tokens": 40, "sampling": GREEDY},
        {"prompt": _prompt(11, 50), "max_tokens": 25, "sampling": SamplingParams(temperature=0.8), "seed": 5},
        {"prompt": _prompt(12, 70), "max_tokens": 12, "sampling": SamplingParams(temperature=1.0), "seed": 9,
         "after": 3},
        {"prompt": _prompt(13, 30), "max_tokens": 30, "sampling": GREEDY, "logprobs": 2, "after": 8},
        {"prompt": _prompt(14, 10), "max_tokens": 30, "after": 12,
         "sampling": SamplingParams(temperature=0.0, logit_bias={eog: 30.0})},
    ]
    apart, n_apart = _serve(ctx, False, jobs)
    want = _texts(apart)
    stop = want["1"][0][12:14]  # a stop string job 1 meets: it ends there, chained or not
    jobs[1]["stop"] = [stop]
    apart, _ = _serve(ctx, False, jobs)
    chained, n_chained = _serve(ctx, True, jobs)
    assert _texts(chained) == _texts(apart)
    assert n_apart == 0 and n_chained >= 30  # most steps: all but those that admit a job, logprobs or not
    assert _texts(apart)["1"][1] == "stop"
    assert [r for _, r, _ in _texts(apart).values()] == ["length", "stop", "length", "length", "stop"]
