"""The engine's scheduler with no model loaded: which waiting jobs the free slots take, which slot each job goes
to and how much of its cache it keeps, the prompt pieces of a step beside the generating slots, and what goes when
the KV cache is full. Slots are plain SlotInfo data; jobs are Jobs that nothing runs."""

from __future__ import annotations

from typing import Any

import pytest

from pyllama_so.server.engine import Job, PromptPiece, Scheduler, SlotInfo, SlotState, id_runs
from pyllama_so.server.engine.scheduler import Admission, Eviction, Room

IDLE, PREFILL, GENERATE = SlotState.IDLE, SlotState.PREFILL, SlotState.GENERATE


def job(prompt: list[int], **kw: Any) -> Job:
    return Job(prompt, emit=lambda _: None, **kw)


def idle(i: int, tokens: list[int] | None = None, last_used: float = 0.0) -> SlotInfo:
    return SlotInfo(i, IDLE, tokens or [], last_used=last_used)


def generating(i: int, t: float = 0.0, **kw: Any) -> SlotInfo:
    return SlotInfo(i, GENERATE, [7] * 10, goes_on=True, t_admitted=t, **kw)


def prefilling(i: int, pending: int, t: float = 0.0, tokens: list[int] | None = None) -> SlotInfo:
    return SlotInfo(i, PREFILL, tokens or [], pending=pending, t_admitted=t)


def test_id_runs_counts_runs_of_consecutive_ids() -> None:
    assert [id_runs(ids) for ids in ([], [3], [0, 1, 2, 5], [5, 0, 1, 2, 1], [0, 2, 4])] == [0, 1, 2, 2, 3]


def test_the_free_slots_take_jobs_in_order_and_a_job_for_a_busy_slot_waits_without_holding_back_the_rest() -> None:
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    slots = [generating(0), idle(1), idle(2)]
    a, b, c, d = job([1], id_slot=0), job([2]), job([3], id_slot=2), job([4])
    assert sched.take([a, b, c, d], slots) == [b, c]  # two free slots: b takes any, c its own; a waits for slot 0
    assert sched.take([b, d, c], slots) == [b, d]  # c would leave d no slot
    assert sched.take([a], slots) == []
    assert sched.take([a, b], [generating(0), generating(1), generating(2)]) == []


def test_a_job_goes_to_the_slot_holding_the_longest_share_of_its_prompt() -> None:
    prompt = list(range(1, 41))
    slots = [generating(0), idle(1, prompt[:30] + [99]), idle(2, prompt[:12]), idle(3, [5, 6])]
    plan = Scheduler(n_batch=64, prefill_chunk=16).schedule(slots, [job(prompt)])
    # slot 1 holds 30 of its 40 tokens: it keeps them, drops what follows, and evaluates the 10 left
    assert plan.admit == (Admission(plan.admit[0].job, 1, 30, 30),)
    assert plan.generate == (0,)
    assert plan.pieces == (PromptPiece(1, 0, 10, True),)


def test_a_short_shared_prefix_gives_way_to_a_slot_next_to_the_busy_ones() -> None:
    """Under prefix_share of the prompt, a cached prefix saves less than a second ubatch a step costs: the job goes
    next to the busy slots (fewest runs of consecutive ids); among those, the least recently used."""
    prompt = list(range(1, 101))
    slots = [generating(0), idle(1, [9], last_used=5.0), idle(2, [9], last_used=1.0), idle(3, prompt[:9])]
    sched = Scheduler(n_batch=256, prefill_chunk=32, prefix_share=0.1)
    (a,) = sched.schedule(slots, [job(prompt)]).admit
    assert (a.slot, a.prefix, a.keep) == (1, 0, 0)
    (a,) = sched.schedule(slots, [job(prompt[:80])]).admit  # 9 of 80 is over a tenth: slot 3 keeps them
    assert (a.slot, a.keep) == (3, 9)
    slots = [idle(0, [9], last_used=5.0), idle(1, [9], last_used=1.0)]
    assert sched.schedule(slots, [job(prompt)]).admit[0].slot == 1  # nothing busy: the least recently used
    # prefix_share 0: a prefix never decides, the neighbour of the busy slots does
    slots = [generating(0), idle(1), idle(2, prompt[:50]), idle(3, prompt[:60])]
    (a,) = Scheduler(n_batch=256, prefill_chunk=32, prefix_share=0.0).schedule(slots, [job(prompt)]).admit
    assert (a.slot, a.keep) == (1, 0)


def test_what_an_admitted_job_keeps_of_the_slots_cache() -> None:
    prompt = [1, 2, 3, 4]
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    slots = [idle(0, prompt + [5, 6])]
    assert sched.schedule(slots, [job(prompt)]).admit[0].keep == 3  # the last prompt token gives the logits
    assert sched.schedule(slots, [job(prompt, cache_prompt=False)]).admit[0].keep == 0
    # echo with logprobs: the whole prompt scored from its start, then all but its last token kept
    plan = sched.schedule([idle(0)], [job(prompt, prompt_logprobs=2)])
    assert plan.admit[0].keep == 3 and plan.pieces == (PromptPiece(0, 0, 1, True),)


def test_jobs_for_one_slot_are_placed_first_and_the_others_around_them() -> None:
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    anyone, mine = job([1, 2, 3]), job([4, 5], id_slot=2)
    plan = sched.schedule([idle(0), idle(1), idle(2), idle(3)], [anyone, mine])
    assert [(a.job, a.slot) for a in plan.admit] == [(mine, 2), (anyone, 1)]  # 1 and 3 both sit next to 2
    assert plan.pieces == (PromptPiece(2, 0, 2, True), PromptPiece(1, 0, 3, True))  # in order of admission


def test_a_cancelled_jobs_slot_is_released_and_taken_in_the_same_step() -> None:
    prompt = list(range(1, 21))
    slots = [SlotInfo(0, GENERATE, prompt + [50, 51], goes_on=True, cancelled=True), generating(1)]
    plan = Scheduler(n_batch=64, prefill_chunk=16).schedule(slots, [job(prompt + [60])])
    assert plan.release == (0,)
    assert [(a.slot, a.keep) for a in plan.admit] == [(0, 20)]  # its cache stays for the next job
    assert plan.generate == (1,)
    assert plan.pieces == (PromptPiece(0, 0, 1, True),)


def test_prompt_pieces_fill_n_batch_alone_and_prefill_chunk_beside_generating_slots() -> None:
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    # nothing generates: n_batch, the oldest prompt first
    slots = [prefilling(0, 50, t=2.0), prefilling(1, 40, t=1.0), idle(2)]
    assert sched.schedule(slots).pieces == (PromptPiece(1, 0, 40, True), PromptPiece(0, 0, 24, False))
    # two slots generate: 16 prompt tokens beside them, from the oldest prompt
    slots = [prefilling(0, 50, t=2.0), prefilling(1, 40, t=1.0), generating(2), generating(3)]
    plan = sched.schedule(slots)
    assert plan.generate == (2, 3) and plan.pieces == (PromptPiece(1, 0, 16, False),)
    # a slot whose sampled token ends it does not go on
    slots = [generating(0), SlotInfo(1, GENERATE, [1], goes_on=False)]
    assert sched.schedule(slots).generate == (0,)
    # no more than n_batch with the generated tokens
    tight = Scheduler(n_batch=8, prefill_chunk=8)
    slots = [prefilling(0, 30), *[generating(i) for i in range(1, 7)]]
    assert tight.schedule(slots).pieces == (PromptPiece(0, 0, 2, False),)
    slots = [prefilling(0, 30), *[generating(i) for i in range(1, 9)]]
    assert tight.schedule(slots).pieces == ()


def test_a_chained_step_takes_the_pieces_after_those_in_the_running_step() -> None:
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    slots = [prefilling(0, 16, t=1.0), prefilling(1, 50, t=2.0), generating(2)]
    # slot 0's whole prompt is in the running step: slot 0 goes on with its first token, slot 1's next piece follows
    plan = sched.follow(slots, [0, 2], {0: 16, 1: 16})
    assert plan.generate == (0, 2)
    assert plan.pieces == (PromptPiece(1, 16, 16, False),)
    assert plan.admit == () and plan.release == ()


def test_a_full_kv_cache_frees_idle_caches_then_defers_pieces_then_ends_a_generation() -> None:
    sched = Scheduler(n_batch=64, prefill_chunk=16)
    # idle slots' cached prompts go first; the step tries again whole
    slots = [idle(0, [1, 2]), idle(1), generating(2), prefilling(3, 8)]
    assert sched.make_room(slots, [2, 3]) == Eviction(Room.DROP_IDLE, (0,), (2, 3))
    # then prompt pieces wait while slots generate
    slots = [idle(0), idle(1), generating(2), prefilling(3, 8)]
    assert sched.make_room(slots, [2, 3]) == Eviction(Room.DEFER_PIECES, (3,), (2,))
    # several prompts alone: the newest waits
    slots = [prefilling(0, 8, t=1.0), prefilling(1, 8, t=3.0), prefilling(2, 8, t=2.0)]
    assert sched.make_room(slots, [0, 1, 2]) == Eviction(Room.DEFER_PIECES, (1,), (0, 2))
    # a prompt begun earlier that waits gives its cells back
    slots = [generating(0), prefilling(1, 8, t=1.0, tokens=[1, 2, 3]), prefilling(2, 8, t=2.0)]
    assert sched.make_room(slots, [0]) == Eviction(Room.GIVE_BACK, (1,), (0,))
    # a generating slot ends: one without max_tokens first, else the newest
    slots = [generating(0, t=1.0, unbounded=True), generating(1, t=2.0), generating(2, t=3.0)]
    assert sched.make_room(slots, [0, 1, 2]) == Eviction(Room.END, (0,), (1, 2))
    slots = [generating(0, t=1.0), generating(1, t=3.0), generating(2, t=2.0)]
    assert sched.make_room(slots, [0, 1, 2]) == Eviction(Room.END, (1,), (0, 2))
    # a prompt piece alone that does not fit fails
    assert sched.make_room([prefilling(0, 8)], [0]) == Eviction(Room.FAIL, (0,), ())


def test_the_scheduler_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="prefix_share"):
        Scheduler(n_batch=64, prefill_chunk=16, prefix_share=1.5)
    with pytest.raises(ValueError, match="prefill_chunk"):
        Scheduler(n_batch=64, prefill_chunk=0)
    with pytest.raises(RuntimeError, match="no free slot"):
        Scheduler(n_batch=64, prefill_chunk=16).schedule([generating(0)], [job([1])])
