"""Carrying step plans out on the context: one step on the devices at a time, started with
Context.decode_batch_sample_begin and ended with decode_batch_sample_end, or ended and the next started in one call
(decode_batch_sample_chain) when nothing is to be done on the context between them; every output row is sampled in
C by its slot's chain. What a step sampled is recorded into the slots: their caches, their prompts' progress, and
from each sampled token whether the slot decodes it next (the order of Llama.generate: end of generation, then the
limits; stop strings come with the text, later)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyllama_so import _llama
from pyllama_so.generation import limits
from pyllama_so.server.engine.job import Failed, Job
from pyllama_so.server.engine.job_queue import JobQueue
from pyllama_so.server.engine.results import Results, Sampled
from pyllama_so.server.engine.scheduler import Room, Scheduler, StepPlan
from pyllama_so.server.engine.slot import RetiredSamplers, Slot, SlotState
from pyllama_so.server.engine.stats import Step, StepStats

log = logging.getLogger("pyllama_so.server")


@dataclass(slots=True)
class BatchEntry:
    """A slot's tokens in a step: the token it sampled last (none yet in the plan of a chained step: the step before
    samples it) or a piece of its prompt; sample: the step samples the slot's next token from the entry's last row."""

    slot: Slot
    job: Job
    tokens: list[int]
    sample: bool


@dataclass(frozen=True)
class RunningStep:
    """The step on the devices: its entries, in slot order (their tokens known), as Step.items shows them ((slot id,
    tokens, kind) each, kind the slot's state when it started), when it started and when its llama_decode returned;
    busy: the slots holding a job then."""

    entries: tuple[BatchEntry, ...]
    items: tuple[tuple[int, int, str], ...]
    t_start: float
    t_issued: float
    busy: int

    @classmethod
    def of(cls, entries: Sequence[BatchEntry], t_start: float, t_issued: float, busy: int) -> RunningStep:
        items = tuple((e.slot.id, len(e.tokens), e.slot.state.value) for e in entries)
        return cls(tuple(entries), items, t_start, t_issued, busy)


@dataclass(frozen=True)
class StepOutput:
    """What a step that ended sampled, to be streamed, and the Step it was (None: none ended, or it failed)."""

    sampled: list[Sampled]
    step: Step | None


class Executor:
    """Owns the running step; publish() replaces the engine's snapshot."""

    def __init__(self, ctx: _llama.Context, slots: Sequence[Slot], scheduler: Scheduler, stats: StepStats,
                 retired: RetiredSamplers, queue: JobQueue, results: Results, publish: Callable[[], None]) -> None:
        self._ctx = ctx
        self._model = ctx.model
        self._n_ctx_slot = ctx.n_ctx_seq
        self._slots = slots
        self._scheduler = scheduler
        self._stats = stats
        self._retired = retired
        self._queue = queue
        self._results = results
        self._publish = publish
        self._running: RunningStep | None = None

    @property
    def running(self) -> bool:
        return self._running is not None

    def _set_running(self, step: RunningStep | None) -> None:
        self._running = step
        self._retired.step_running = step is not None

    def chainable(self) -> bool:
        """A step runs, and nothing is to be done on the context before the next: no sampler to take out of the
        graph, no cancelled job to release."""
        if self._running is None or self._retired.in_graph:
            return False
        return not any(s.job is not None and s.job.cancelled for s in self._slots)

    def launch(self, plan: StepPlan) -> None:
        """Start a llama_decode of the plan's generated tokens and prompt pieces (the running step has ended)."""
        busy = sum(s.job is not None for s in self._slots)
        entries = self._entries(plan, chained=False)
        if not entries:
            return
        t0 = time.perf_counter()
        while True:
            try:
                # every output row is sampled in C by its slot's chain when the step ends
                self._ctx.decode_batch_sample_begin([(e.slot.id, e.tokens, e.slot.sampler if e.sample else None,
                                                      e.job.logprobs) for e in entries])
                break
            except _llama.ContextFullError as err:  # no room in a cache the slots share (-kvu)
                entries = self._make_room(entries, err)
                if not entries:
                    return
            except (_llama.LlamaError, ValueError) as err:
                self._fail_step(entries, err)
                return
        t_issued = time.perf_counter()
        for e in entries:
            e.slot.in_step = True
        self._set_running(RunningStep.of(entries, t0, t_issued, busy))

    def collect(self) -> StepOutput:
        """Wait for the running step (if any) and record what it sampled. Its Step is for the caller to publish once
        the next one runs (the devices do not wait for the snapshot)."""
        running = self._running
        self._set_running(None)
        if running is None:
            return StepOutput([], None)
        t_wait = time.perf_counter()
        try:
            sampled = self._ctx.decode_batch_sample_end()
        except (_llama.LlamaError, ValueError) as e:
            sampled = None
            error = e
        t_end = time.perf_counter()
        self._off_devices(running)
        if sampled is None:
            self._fail_step(running.entries, error)
            return StepOutput([], None)
        return self._record(running, sampled, t_wait, t_end)

    def chain(self) -> StepOutput:
        """End the running step and start the next in one call, with no Python in between: each slot that sampled goes
        on unless its token ends it (the C side checks end-of-generation; the limits are known before), with the
        prompt pieces the scheduler adds. Returns what collect() does."""
        running = self._running
        assert running is not None
        self._set_running(None)
        plan = self._follow(running)
        entries = self._entries(plan, chained=True)
        t_wait = time.perf_counter()
        try:
            sampled, started, t_end, t_launch, error = self._ctx.decode_batch_sample_chain(
                [(e.slot.id, e.tokens or None, e.slot.sampler if e.sample else None, e.job.logprobs, True)
                 for e in entries])
        except (_llama.LlamaError, ValueError) as err:
            try:  # a plan the context refused leaves the step running
                self._ctx.decode_batch_sample_end()
            except (_llama.LlamaError, ValueError, RuntimeError):
                pass
            self._off_devices(running)
            self._fail_step(running.entries, err)
            return StepOutput([], None)
        t_return = time.perf_counter()
        self._off_devices(running, next_running=bool(started) and error is None)
        out = self._record(running, sampled, t_wait, t_end)
        if isinstance(error, _llama.ContextFullError):  # the next step starts apart, making room (_make_room)
            return out
        if error is not None:  # the next llama_decode failed (started is empty): its requests end, the engine goes on
            self._fail_step([e for e in entries if e.slot.state is SlotState.PREFILL or e.slot.continues], error)
            return out
        self._chained(running, entries, started, t_launch, t_return)
        return out

    def abandon(self) -> None:
        """The engine failed: let the devices finish the running step (if any) before its samplers go."""
        running = self._running
        self._set_running(None)
        if running is not None:
            try:
                self._ctx.decode_batch_sample_end()
            except Exception:
                pass
            self._off_devices(running)

    def _follow(self, running: RunningStep) -> StepPlan:
        """The plan of the step chained after running: the slots whose sampled token the limits let them decode (the
        token being sampled, which the running step's tokens precede in the cache), and the next prompt pieces."""
        generate: list[int] = []
        in_step: dict[int, int] = {}
        for e in running.entries:
            s, job = e.slot, e.job
            if s.job is not job:  # ended while the step ran
                continue
            if s.state is SlotState.PREFILL:
                in_step[s.id] = len(e.tokens)
            if e.sample and limits.goes_on(s.n_sampled + 1, len(s.tokens) + len(e.tokens), job.max_tokens,
                                           self._n_ctx_slot):
                generate.append(s.id)
        return self._scheduler.follow([s.info() for s in self._slots], generate, in_step)

    def _chained(self, running: RunningStep, entries: Sequence[BatchEntry], started: list[Any], t_launch: float,
                 t_return: float) -> None:
        """The chained step started (started: (slot id, tokens, ...) as the context took them) and runs."""
        by_slot = {e.slot.id: e for e in entries}
        went = [BatchEntry(by_slot[sid].slot, by_slot[sid].job, list(toks), by_slot[sid].sample)
                for sid, toks, _, _ in started]
        if {e.slot.id for e in went if e.slot.state is SlotState.GENERATE} != \
                {e.slot.id for e in running.entries if e.sample and e.slot.job is e.job and e.slot.continues}:
            raise RuntimeError("the chained step disagrees with the engine on which slots go on")
        if went:
            for e in went:
                e.slot.in_step = True
            self._set_running(RunningStep.of(went, t_launch, t_return, sum(s.job is not None for s in self._slots)))
            self._stats.chained += 1

    def _entries(self, plan: StepPlan, *, chained: bool) -> list[BatchEntry]:
        """The plan's entries in slot order: llama.cpp cuts a batch of several sequences (each with its own KV
        stream) into ubatches of consecutive seq_ids, so that the generated tokens share one ubatch."""
        slots = self._slots
        entries = []
        for i in plan.generate:
            s = slots[i]
            assert s.job is not None
            entries.append(BatchEntry(s, s.job, [] if chained else [s.next_token], True))
        for p in plan.pieces:
            s = slots[p.slot]
            assert s.job is not None
            entries.append(BatchEntry(s, s.job, s.pending[p.start:p.start + p.n], p.last))
        entries.sort(key=lambda e: e.slot.id)
        return entries

    def _make_room(self, entries: list[BatchEntry], error: Exception) -> list[BatchEntry]:
        """The step of entries found no room in the KV cache (one cache for all slots: -kvu): the scheduler's
        eviction carried out. Returns the entries to try again (empty: none left)."""
        ev = self._scheduler.make_room([s.info() for s in self._slots], [e.slot.id for e in entries])
        slots = [self._slots[i] for i in ev.slots]
        if ev.room is Room.DROP_IDLE:
            for s in slots:
                self._ctx.truncate(0, s.id)
                s.tokens.clear()
            log.info("the KV cache is full: dropped the cached prompts of idle slots %s", list(ev.slots))
        elif ev.room is Room.GIVE_BACK:
            s = slots[0]
            assert s.job is not None
            log.info("%s slot %d: the KV cache is full: its prompt gives back %d cells and waits", s.job.id, s.id,
                     len(s.tokens))
            self._ctx.truncate(0, s.id)
            s.tokens.clear()
            s.pending, s.cached, s.evaluated = list(s.job.prompt), 0, 0
        elif ev.room is Room.END:
            s = slots[0]
            log.info("%s slot %d: the KV cache is full: ends at %d tokens", s.job.id if s.job else "-", s.id,
                     len(s.tokens))
            self._results.finish(s, "length", time.perf_counter())
            self._publish()
        elif ev.room is Room.FAIL:
            self._fail_step(entries, error)
        retry = set(ev.retry)
        return [e for e in entries if e.slot.id in retry]

    def _fail_step(self, entries: Sequence[BatchEntry], error: Exception) -> None:
        """A llama_decode of entries failed: the requests of its slots that still hold them fail, and each such
        slot forgets its cache (a failed decode leaves it unknown); then publish."""
        for e in entries:
            s, job = e.slot, e.job
            if s.job is not job:
                continue
            self._ctx.truncate(0, s.id)
            s.tokens.clear()
            s.release(self._retired)
            message = f"decode failed: {error}"
            log.error("%s slot %d: %s", job.id, s.id, message)
            self._queue.retire(job, Failed(message))
        self._publish()

    def _off_devices(self, running: RunningStep, next_running: bool = False) -> None:
        """The step is off the devices: its slots are free to change, and the samplers of those released while it ran
        are freed (next_running: a chained step runs already)."""
        for e in running.entries:
            e.slot.in_step = False
        self._retired.free(next_running)

    def _record(self, running: RunningStep, sampled: list[Any], t_wait: float, t_end: float) -> StepOutput:
        """What the running step, which ended at t_end (its wait began at t_wait), left in the slots: their caches,
        their prompts' progress, and the tokens sampled."""
        self._stats.split_overlap = self._ctx.split_overlap_stats()
        outs = []
        for e, out in zip(running.entries, sampled, strict=True):
            s, job = e.slot, e.job
            s.tokens.extend(e.tokens)  # in its KV cache, whether or not its job still runs
            if s.job is not job:  # it ended while the step ran (a stop string)
                continue
            if s.state is SlotState.PREFILL:
                del s.pending[:len(e.tokens)]
                s.n_prompt_evaluated += len(e.tokens)
                s.evaluated += len(e.tokens)
                if s.t_prompt_start is None:
                    s.t_prompt_start = running.t_start
            if e.sample:
                tok, logprob, top = out
                self._decide(s, job, tok, t_end)
                outs.append(Sampled(s, job, tok, logprob, top, t_end))
        step = self._stats.step_ended(running.items, t_start=running.t_start, t_issued=running.t_issued,
                                      t_wait=t_wait, t_end=t_end, busy=running.busy,
                                      n_tokens_max=max(len(s.tokens) for s in self._slots))
        return StepOutput(outs, step)

    def _decide(self, s: Slot, job: Job, tok: int, now: float) -> None:
        """Whether the slot decodes its sampled token in the next step."""
        if s.state is SlotState.PREFILL:
            s.state, s.t_prompt_end = SlotState.GENERATE, now
        eog = self._model.is_eog(tok)
        s.n_sampled += not eog
        s.continues = not eog and limits.goes_on(s.n_sampled, len(s.tokens), job.max_tokens, self._n_ctx_slot)
        if s.continues:
            s.next_token = tok
