"""Split overlap in a server's mixed steps, on CPU virtual devices: one llama_decode holding the next token of
every generating sequence and a piece of a prefilling sequence's prompt. With one KV stream per sequence
llama.cpp cuts such a step into several ubatches (consecutive seq_ids, the same number of tokens each), and
the ubatches of one call alternate between the lanes: the step runs on both lanes, the host does not wait
for one of its ubatches before issuing the next, and the output stays bitwise that of plain tensor split.

The schedule below is a server's (tests drive Context.decode_batch / decode_batch_sample directly, as the
server's engine does): sequences arrive at different steps, prefill in pieces while others generate, then
generate themselves; one step has only prompt pieces and no output, so nothing synchronizes it with the next.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from helpers.split_devices import copy_engine_routing, cuda_device_pair, same_bits, virtual_devices
from pyllama_so import _llama, testing
from pyllama_so.sampling import SamplingParams

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

N_UBATCH = 128
N_BATCH = 256
N_SEQ = 4
N_CTX = 512 * N_SEQ  # a prompt longer than n_batch fits a sequence's share
# dense attention, SWA (gemma3), recurrent conv state + attention (lfm2), recurrent state of linear attention
# + attention (qwen3next, MoE only); the pure recurrent ones (mamba, rwkv) have no tensor split. qwen3's
# fixture aborts on single-token ubatches under the Meta backend with or without split overlap
# (tests/multi_device/test_split_overlap.py: NO_SINGLE_TOKENS).
ARCHS = ("llama", "gemma3", "lfm2", "qwen3next")


@dataclasses.dataclass
class Arrival:
    step: int      # the step at which the request is admitted
    seq: int
    n_prompt: int
    n_gen: int     # tokens it generates after its prompt


# seq 0's prompt is longer than n_batch: its first piece is a step without output (nothing synchronizes it
# with the next step), its rest shares a step with seq 1's prompt; seq 2 prefills in two pieces while 0 and 1
# generate; seq 1 finishes and seq 3 prefills while 0 and 2 generate (a gap in the generating seq_ids: the
# step is three ubatches)
SCHEDULE = (Arrival(0, 0, 300, 12), Arrival(1, 1, 90, 4), Arrival(3, 2, 200, 5), Arrival(7, 3, 150, 3))


@dataclasses.dataclass
class _Slot:
    arrival: Arrival
    pending: list[int]
    generated: int = 0
    next_token: int | None = None


def _prompt(seq: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(100 + seq).integers(1, 127, n)]


def _serve(ctx: _llama.Context, model: _llama.Model, seeded: bool, on_step=None, chunk: int = N_UBATCH) -> list:
    """Run SCHEDULE as the server's engine does: each step one call with one token per generating sequence and
    prompt pieces within the budget (chunk while any sequence generates), items in seq_id order. Greedy:
    the next token is the argmax of the item's logits (returned: the logits of every step); seeded: each
    sequence's own seeded sampler draws in C (returned: the tokens and their log-probabilities)."""
    slots: dict[int, _Slot] = {}
    samplers = {}
    out: list = []
    step = 0
    try:
        while step == 0 or slots:
            for a in SCHEDULE:
                if a.step == step:
                    slots[a.seq] = _Slot(a, _prompt(a.seq, a.n_prompt))
                    if seeded:
                        params = SamplingParams(seed=a.seq + 1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
                        samplers[a.seq] = _llama.Sampler(model, params, n_ctx=N_CTX // N_SEQ)
            generating = [s for s in slots.values() if not s.pending]
            budget = min(chunk, N_BATCH - len(generating)) if generating else N_BATCH
            items = [(s.arrival.seq, [s.next_token], True) for s in generating]
            for s in sorted((s for s in slots.values() if s.pending), key=lambda s: s.arrival.step):
                if budget <= 0:
                    break
                piece = s.pending[:budget]
                budget -= len(piece)
                items.append((s.arrival.seq, piece, len(piece) == len(s.pending)))
            items.sort(key=lambda item: item[0])
            before = ctx.split_overlap_stats()
            if seeded:
                got = ctx.decode_batch_sample([(seq, toks, samplers[seq] if want else None, 2)
                                               for seq, toks, want in items])
                picked = [g[0] if g is not None else None for g in got]
                out.append([g for g in got if g is not None])
            else:
                logits = ctx.decode_batch(items)
                rows = iter(np.argmax(logits, axis=1).tolist())
                picked = [next(rows) if want else None for _, _, want in items]
                out.append(logits)
            if on_step is not None:
                on_step(items, before, ctx.split_overlap_stats())
            for (seq, toks, want), tok in zip(items, picked, strict=True):
                s = slots[seq]
                if s.pending:
                    del s.pending[:len(toks)]
                else:
                    s.generated += 1
                if want:
                    s.next_token = tok
                if not s.pending and s.generated >= s.arrival.n_gen:
                    del slots[seq]
            step += 1
    finally:
        for smp in samplers.values():
            smp.free()
    return out


def _context(model: _llama.Model, split_overlap: bool) -> _llama.Context:
    return _llama.Context(model, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_seq_max=N_SEQ,
                          split_overlap=split_overlap, n_threads=1)


def _run(arch: str, split_overlap: bool, seeded: bool, delays_us: tuple[int, int] = (0, 0), on_step=None,
         devices: list[int] | None = None, chunk: int = N_UBATCH):
    devices = devices or virtual_devices(2)
    model = testing.arch_model(arch, testing.arch_flags(arch)["moe_mandatory"], devices, "tensor")
    ctx = _context(model, split_overlap)
    try:
        for lane, delay in enumerate(delays_us):
            if delay:
                assert testing.delay_lane(ctx, lane, delay) == len(devices)
        return _serve(ctx, model, seeded, on_step, chunk), ctx.split_overlap_stats()
    finally:
        ctx.free()
        model.free()


def _same(a: list, b: list, seeded: bool) -> bool:
    if seeded:  # tokens and log-probabilities (floats from the logits) compared exactly
        return a == b
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))


def _is_mixed(items: list) -> bool:
    """A step with a generated token and a prompt piece of a lane ubatch's size."""
    return any(len(toks) == 1 for _, toks, _ in items) and any(len(toks) >= 64 for _, toks, _ in items)


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_steps_give_the_bits_of_one_lane(arch: str, seeded: bool) -> None:
    off, off_stats = _run(arch, False, seeded)
    assert not off_stats["enabled"]
    on, stats = _run(arch, True, seeded, delays_us=(2000, 0))
    assert stats["enabled"] and min(stats["ubatches"]) >= 5, stats
    assert _same(off, on, seeded)


@pytest.mark.parametrize("delays_us", [(0, 0), (0, 3000)], ids=["no-delay", "lane1-delayed"])
def test_mixed_steps_give_the_bits_of_one_lane_with_either_lane_behind(delays_us: tuple[int, int]) -> None:
    off, _ = _run("llama", False, False)
    on, _ = _run("llama", True, False, delays_us=delays_us)
    assert _same(off, on, False)


def test_every_mixed_step_runs_on_both_lanes() -> None:
    """Each step with generated tokens and a prompt piece puts ubatches on both lanes, in every step (it used
    to be every other one: the prompt ubatch alternated across calls while the tokens stayed on lane 0), and
    the generated tokens keep lane 0 and their reusable graph."""
    steps = []

    def record(items, before, after):
        steps.append((items, [b - a for a, b in zip(before["ubatches"], after["ubatches"], strict=True)],
                      [b - a for a, b in zip(before["graph_builds"], after["graph_builds"], strict=True)]))

    _run("llama", True, False, on_step=record)
    mixed = [(n, builds) for items, n, builds in steps if _is_mixed(items)]
    assert len(mixed) >= 3, steps
    assert all(n[0] >= 1 and n[1] >= 1 for n, _ in mixed), mixed
    # two mixed steps in a row with the same sequences generating reuse lane 0's graph of their tokens
    assert any(builds[0] == 0 for _, builds in mixed[1:]), mixed


def test_a_prompt_piece_of_two_ubatches_gives_each_lane_one() -> None:
    """With pieces of two ubatches while sequences generate (the server's default under split overlap), a mixed
    step is the generated tokens' ubatch and two prompt ubatches, alternating: each lane gets a prompt ubatch,
    whose AllReduces overlap the other's compute (with a piece of one ubatch, one lane only computes the prompt).
    The logits stay bitwise those of -so 0 with the same pieces."""
    steps = []

    def record(items, before, after):
        steps.append((items, [b - a for a, b in zip(before["ubatches"], after["ubatches"], strict=True)]))

    off, _ = _run("llama", False, False, chunk=2 * N_UBATCH)
    on, _ = _run("llama", True, False, delays_us=(2000, 0), on_step=record, chunk=2 * N_UBATCH)
    assert _same(off, on, False)
    wide = [n for items, n in steps
            if any(len(toks) == 1 for _, toks, _ in items) and any(len(toks) > N_UBATCH for _, toks, _ in items)]
    assert len(wide) >= 2, steps
    # seq 2's first piece while 0 and 1 generate: the tokens' ubatch (with the piece's first token), then the rest
    # of the piece in two, on lanes a, b, a; later steps have a gap in the generating ids, one ubatch more
    assert sum(wide[0]) == 3 and min(wide[0]) == 1, wide
    assert all(sum(n) >= 3 and min(n) >= 1 for n in wide), wide


def test_the_engine_takes_one_ubatch_a_lane_while_slots_generate_by_default() -> None:
    """Engine's prefill_chunk, when not given, is n_ubatch without lanes and one ubatch a lane with them (at most
    n_batch); a given one is kept."""
    from pyllama_so.server.engine import Engine

    model = testing.arch_model("llama", False, virtual_devices(2), "tensor")
    try:
        for split_overlap, want in ((False, N_UBATCH), (True, min(2 * N_UBATCH, N_BATCH))):
            ctx = _context(model, split_overlap)
            try:
                assert ctx.split_overlap_stats()["enabled"] == split_overlap
                assert Engine(ctx).prefill_chunk == want
                assert Engine(ctx, prefill_chunk=40).prefill_chunk == 40
                assert Engine(ctx, prefill_chunk=10 * N_BATCH).prefill_chunk == N_BATCH
            finally:
                ctx.free()
        ctx = _llama.Context(model, n_ctx=N_CTX, n_batch=N_UBATCH, n_ubatch=N_UBATCH, n_seq_max=N_SEQ,
                             split_overlap=True, n_threads=1)
        try:
            assert Engine(ctx).prefill_chunk == N_UBATCH  # -b = -ub: no room for two
        finally:
            ctx.free()
    finally:
        model.free()


def test_a_mixed_step_does_not_wait_on_the_host_for_its_first_ubatch() -> None:
    """With lane 0 slow, a mixed step's llama_decode returns once both ubatches are issued: the prompt
    piece's ubatch is not held back on the host until the generated tokens' ubatch has run (as when both
    took one lane: the scheduler synchronizes a lane before it copies a ubatch's inputs). Measured against
    the same step's lane 0, not a fixed time: the call returns with most of lane 0's delayed work still to
    run (a host wait would leave only lane 1's quick ubatch for synchronize())."""
    delay_us = 150_000  # per subgraph on lane 0's devices: a host wait for one ubatch takes several of them
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    ctx = _context(model, True)
    try:
        ctx.decode_batch([(0, _prompt(0, 20), True), (1, _prompt(1, 20), True)])
        assert testing.delay_lane(ctx, 0, delay_us) == 2
        host_s, sync_s, lanes = [], [], []
        for k in range(3):
            items = [(0, [5 + k], False), (1, [6 + k], False), (2, _prompt(2, 300)[100 * k:100 * (k + 1)], False)]
            before = ctx.split_overlap_stats()["ubatches"]
            t0 = time.perf_counter()
            ctx.decode_batch(items)  # no output asked: nothing here waits for the devices
            host_s.append(time.perf_counter() - t0)
            ctx.synchronize()
            sync_s.append(time.perf_counter() - t0 - host_s[-1])
            lanes.append([b - a for a, b in zip(before, ctx.split_overlap_stats()["ubatches"], strict=True)])
    finally:
        ctx.free()
        model.free()
    assert all(h < s for h, s in zip(host_s, sync_s, strict=True)), (host_s, sync_s, lanes)
    assert lanes == [[1, 1]] * 3


_NOWAIT = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}  # this module's folder, and tests/ for the helpers it imports
    import test_split_overlap_mixed as t
    ref, _ = t._run("llama", False, False)
    got, _ = t._run("llama", True, False, delays_us=(20000, 0))
    print("SAME" if t._same(ref, got, False) else "DIFFERENT")
""")


def test_mixed_steps_need_the_cross_lane_waits() -> None:
    """Without the cross-lane waits (the test-only GGML_META_LANES_TEST=nowait) and lane 0 slow, the prompt
    piece's ubatch reads the KV cache before the generated tokens' ubatch has written it (its first prompt
    token is in that ubatch): the schedule above catches it."""
    env = dict(os.environ, GGML_META_LANES_TEST="nowait")
    here = os.path.dirname(os.path.abspath(__file__))
    code = _NOWAIT.format(paths=[here, os.path.dirname(here)])
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "GGML_META_LANES_TEST=nowait" in res.stderr
    assert res.stdout.strip().splitlines()[-1] == "DIFFERENT"


@pytest.mark.gpu
@pytest.mark.parametrize("copy_engines", [False, True], ids=["upstream-allreduce", "copy-engines"])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "lfm2", "qwen3next"])
def test_gpu_mixed_steps_give_the_bits_of_one_lane(arch: str, copy_engines: bool) -> None:
    """The same schedule on two CUDA devices (two GPUs, or GGML_CUDA_DEVICES=2 on one): bitwise -so 0's
    logits, both lanes used."""
    devices = cuda_device_pair()
    with copy_engine_routing(copy_engines):
        off, _ = _run(arch, False, False, devices=devices)
        on, stats = _run(arch, True, False, devices=devices)
    assert stats["enabled"] and min(stats["ubatches"]) >= 5, stats
    assert _same(off, on, False)


def _engine_tokens(arch: str, split_overlap: bool, chain: bool, delays_us: tuple[int, int] = (0, 0)) -> dict:
    """SCHEDULE's requests through the server's Engine (every step begun and ended apart, or chained in C),
    each arrival submitted from on_step so that the steps it lands in are the same in every run: each
    request's generated tokens and how it finished."""
    import threading

    from pyllama_so.server.engine import Delta, Done, Engine, Job

    model = testing.arch_model(arch, testing.arch_flags(arch)["moe_mandatory"], virtual_devices(2), "tensor")
    ctx = _context(model, split_overlap)
    got: dict[int, list] = {a.seq: [] for a in SCHEDULE}
    ended = threading.Semaphore(0)

    def job(a: Arrival) -> Job:
        def emit(ev: object) -> None:
            if isinstance(ev, (Delta, Done)):
                got[a.seq] += list(ev.tokens)
            if isinstance(ev, Done):
                got[a.seq].append(ev.finish_reason)
            if not isinstance(ev, Delta):
                ended.release()
        sampling = (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) if a.seq % 2
                    else SamplingParams(temperature=0.0))
        return Job(_prompt(a.seq, a.n_prompt), emit, max_tokens=a.n_gen, sampling=sampling, seed=a.seq + 1)

    def on_step(step: object) -> None:
        for a in SCHEDULE:
            if a.step and a.step == step.index + 1:  # type: ignore[attr-defined]
                engine.submit(job(a))

    # the same pieces with and without lanes (the default differs), so that the schedules are the same
    engine = Engine(ctx, on_step=on_step, chain_steps=chain, prefill_chunk=N_UBATCH)
    try:
        for lane, delay in enumerate(delays_us):
            if delay:
                assert testing.delay_lane(ctx, lane, delay) == 2
        engine.start()
        engine.submit(job(SCHEDULE[0]))
        for _ in SCHEDULE:
            assert ended.acquire(timeout=120)
        chained = engine.snapshot().steps_chained
    finally:
        engine.stop()
        lanes = ctx.split_overlap_stats()["ubatches"]
        ctx.free()
        model.free()
    assert (chained > 0) == chain
    assert (min(lanes) > 0) == split_overlap, lanes  # with -so 1 both lanes ran ubatches
    return got


@pytest.mark.parametrize("arch", ARCHS)
def test_chained_engine_steps_equal_separate_ones_under_split_overlap(arch: str) -> None:
    """The engine's chained steps (decode_batch_sample_chain) over two CPU virtual devices with -so 1 and a slow
    lane 0 give every request the tokens of steps begun and ended apart with -so 0, greedy and seeded."""
    want = _engine_tokens(arch, False, False)
    assert all(toks[-1] == "length" and len(toks) == a.n_gen + 1
               for a, toks in zip(SCHEDULE, want.values(), strict=True))
    assert _engine_tokens(arch, True, True, (3000, 0)) == want
    assert _engine_tokens(arch, True, False, (3000, 0)) == want
