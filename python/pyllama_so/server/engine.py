"""Slots over one llama.cpp context, and the thread that decodes them in shared batches.

One thread owns the Context. Each step is one llama_decode call holding the next token of every
generating slot and pieces of the prompts of prefilling slots: while any slot generates, at most
n_ubatch prompt tokens (so a long prompt delays the running generations by about one ubatch per
token, not by its whole prefill), otherwise up to n_batch, whose ubatches split overlap alternates
between its lanes. A slot keeps the tokens of its last request in its part of the KV cache; a request
goes to the free slot holding the longest prefix of its prompt, and only the rest is evaluated.

Everything here runs without HTTP: a Job says what to generate and gets its Events through a callback,
called on the engine thread.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams, sample
from pyllama_so.textstream import TextStream

log = logging.getLogger("pyllama_so.server")


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


class PromptError(ValueError):
    """A prompt the engine cannot take: empty, or longer than a slot's context."""


class EngineStopped(RuntimeError):
    """The engine is not running (stopped, or its thread failed)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, reused from the slot's cache
    completion_tokens: int


@dataclass(frozen=True)
class Timings:
    """One request's times, with llama-server's names where it has them."""

    cache_n: int  # prompt tokens reused from the cache
    prompt_n: int  # prompt tokens evaluated
    prompt_ms: float  # from the first step with a piece of the prompt to the end of the last one
    predicted_n: int  # generated tokens
    predicted_ms: float  # from the end of the prompt to the last generated token
    queue_ms: float  # from submit() to a slot

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
                "prompt_per_second": round(self.prompt_per_second, 3), "predicted_n": self.predicted_n,
                "predicted_ms": round(self.predicted_ms, 3),
                "predicted_per_second": round(self.predicted_per_second, 3), "queue_ms": round(self.queue_ms, 3)}


@dataclass(frozen=True)
class Delta:
    """Text that became final."""

    text: str


@dataclass(frozen=True)
class Done:
    """The last event of a job that ran: the rest of its text and how it ended."""

    text: str
    finish_reason: str  # "stop" (end-of-generation token or stop string) or "length"
    usage: Usage
    timings: Timings


@dataclass(frozen=True)
class Failed:
    """The last event of a job that could not finish."""

    message: str


Event = Delta | Done | Failed


@dataclass(eq=False)
class Job:
    """A tokenized prompt and how to generate after it. emit gets each Event, on the engine thread; it
    must not block."""

    prompt: list[int]
    emit: Callable[[Event], None]
    max_tokens: int | None = None  # None: up to the end of the slot's context
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False  # end-of-generation tokens are never sampled (llama-server's ignore_eos)
    id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:12]}")
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False


class SlotState(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    GENERATE = "generate"


@dataclass(eq=False)
class Slot:
    """One sequence of the context. tokens is what its part of the KV cache holds."""

    id: int
    tokens: list[int] = field(default_factory=list)
    state: SlotState = SlotState.IDLE
    job: Job | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    next_token: int = -1  # sampled and sent, decoded at the next step
    text: TextStream | None = None
    rng: np.random.Generator | None = None
    cached: int = 0  # prompt tokens reused
    t_admitted: float = 0.0
    t_prompt_start: float | None = None
    t_prompt_end: float = 0.0
    last_used: float = 0.0
    # since the engine started
    n_requests: int = 0
    n_prompt_evaluated: int = 0
    n_prompt_cached: int = 0
    n_generated: int = 0
    last_timings: Timings | None = None

    def view(self) -> dict[str, Any]:
        job = self.job
        return {
            "id": self.id, "state": self.state.value, "job": job.id if job else None, "n_cached": len(self.tokens),
            "prompt_tokens": len(job.prompt) if job else None,
            "prompt_pending": len(self.pending) if job else None,
            "generated": len(self.text.tokens) if job and self.text else None,
            "totals": {"requests": self.n_requests, "prompt_evaluated": self.n_prompt_evaluated,
                       "prompt_cached": self.n_prompt_cached, "generated": self.n_generated},
            "last": self.last_timings.as_dict() if self.last_timings else None,
        }


@dataclass(frozen=True)
class Step:
    """What one llama_decode call held: (slot id, tokens, kind) per slot, kind "prefill" or "generate"."""

    index: int
    items: tuple[tuple[int, int, str], ...]
    seconds: float


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens a and b share from the start (numpy: prompts may have 100k tokens)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


class Engine:
    """The slots of ctx (one per sequence, ctx.n_seq_max of them) and the thread that runs them.

    submit() a Job; it waits in a queue of at most queue_size jobs beyond the free slots (QueueFull
    after that) until a slot takes it. cancel() drops it wherever it is; a slot it held keeps what it
    evaluated. on_step, if given, is called on the engine thread after each step.
    """

    def __init__(self, ctx: _llama.Context, *, queue_size: int = 64,
                 on_step: Callable[[Step], None] | None = None) -> None:
        self.ctx = ctx
        self.model = ctx.model
        self.n_batch = ctx.n_batch
        self.n_ubatch = ctx.n_ubatch
        self.n_ctx_slot = ctx.n_ctx_seq
        self.slots = [Slot(i) for i in range(ctx.n_seq_max)]
        self.queue_size = queue_size
        self.on_step = on_step
        self.error: BaseException | None = None
        self.steps = 0
        self.steps_by_slots: dict[int, int] = {}  # how many steps decoded 1, 2, ... slots together
        self.last_step: Step | None = None
        self.split_overlap = ctx.split_overlap_stats()
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pyllama_so-engine", daemon=True)

    @functools.cached_property
    def _eog_tokens(self) -> np.ndarray:
        """The vocabulary's end-of-generation tokens, found once, when a job first ignores them."""
        return np.array([t for t in range(self.model.n_vocab) if self.model.is_eog(t)], dtype=np.int64)

    # -- the HTTP side's calls (any thread) --

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the step in progress, fail every job left, and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, job: Job) -> None:
        if not job.prompt:
            raise PromptError("the prompt is empty")
        if len(job.prompt) > self.n_ctx_slot:
            raise PromptError(f"the prompt has {len(job.prompt)} tokens but a slot's context holds "
                              f"{self.n_ctx_slot}")
        with self._cond:
            if not self.running:
                raise EngineStopped("the engine is not running" + (f": {self.error}" if self.error else ""))
            free = sum(s.job is None for s in self.slots)
            if len(self._waiting) >= free + self.queue_size:
                raise QueueFull(f"all {len(self.slots)} slots are busy and {self.queue_size} requests wait")
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            if job in self._waiting:
                self._waiting.remove(job)
            self._cond.notify()

    def snapshot(self) -> dict[str, Any]:
        """The slots, the queue and the counters, for /slots."""
        with self._cond:
            step = self.last_step
            return {
                "slots": [s.view() for s in self.slots],
                "n_ctx_slot": self.n_ctx_slot, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
                "queue": {"waiting": len(self._waiting), "size": self.queue_size},
                "steps": self.steps,
                "steps_by_slots": {str(k): v for k, v in sorted(self.steps_by_slots.items())},
                "last_step": None if step is None else {
                    "items": [{"slot": s, "tokens": n, "kind": k} for s, n, k in step.items],
                    "ms": round(1e3 * step.seconds, 3)},
                "split_overlap": self.split_overlap,
                "running": self.running, "error": None if self.error is None else str(self.error),
            }

    # -- the engine thread --

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as e:  # a bug here must not leave requests hanging
            log.exception("the engine failed")
            self.error = e
        with self._cond:
            self._stopping = True
            jobs = [s.job for s in self.slots if s.job is not None] + list(self._waiting)
            self._waiting.clear()
            for s in self.slots:
                s.job, s.state = None, SlotState.IDLE
        for job in jobs:
            self._emit(job, Failed("the server is shutting down" if self.error is None else
                                   f"the engine failed: {self.error}"))

    def _step(self) -> bool:
        """Admit waiting jobs, decode one batch, sample. False when the engine stops."""
        with self._cond:
            self._release_cancelled()
            self._admit()
            while not self._stopping and all(s.job is None for s in self.slots):
                self._cond.wait()
                self._release_cancelled()
                self._admit()
            if self._stopping:
                return False
            busy = [s for s in self.slots if s.job is not None]
        generating = [s for s in busy if s.state is SlotState.GENERATE]
        prefilling = sorted((s for s in busy if s.state is SlotState.PREFILL), key=lambda s: s.t_admitted)
        budget = min(self.n_ubatch, self.n_batch - len(generating)) if generating else self.n_batch
        items: list[tuple[Slot, list[int], bool]] = [(s, [s.next_token], True) for s in generating]
        for s in prefilling:
            if budget <= 0:
                break
            piece = s.pending[:budget]
            budget -= len(piece)
            items.append((s, piece, len(piece) == len(s.pending)))
        # llama.cpp cuts a batch of several sequences (each with its own KV stream) into ubatches of
        # consecutive seq_ids: in seq_id order the generated tokens share one ubatch
        items.sort(key=lambda item: item[0].id)
        t0 = time.perf_counter()
        try:
            logits = self.ctx.decode_batch([(s.id, toks, want) for s, toks, want in items])
        except (_llama.LlamaError, ValueError) as e:
            for s, _, _ in items:
                self._fail(s, f"decode failed: {e}")
            return True
        t1 = time.perf_counter()
        self.split_overlap = self.ctx.split_overlap_stats()
        step = Step(self.steps, tuple((s.id, len(toks), s.state.value) for s, toks, _ in items), t1 - t0)
        row = 0
        for s, toks, want in items:
            s.tokens.extend(toks)
            if s.state is SlotState.PREFILL:
                del s.pending[:len(toks)]
                s.n_prompt_evaluated += len(toks)
                if s.t_prompt_start is None:
                    s.t_prompt_start = t0
            if want:
                self._advance(s, logits[row], t1)
                row += 1
        with self._cond:
            self.steps += 1
            self.steps_by_slots[len(items)] = self.steps_by_slots.get(len(items), 0) + 1
            self.last_step = step
        if self.on_step is not None:
            self.on_step(step)
        return True

    def _admit(self) -> None:
        """Move waiting jobs into free slots (lock held): each to the free slot holding the longest prefix
        of its prompt, the least recently used among equals."""
        while self._waiting:
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            job = self._waiting.popleft()
            prefix, _, slot = max(((common_prefix(s.tokens, job.prompt), -s.last_used, s) for s in free),
                                  key=lambda c: c[:2])
            self._start(slot, job, prefix)

    def _start(self, slot: Slot, job: Job, prefix: int) -> None:
        """Give the slot the job; prefix: the tokens its cache shares with the prompt."""
        keep = min(prefix, len(job.prompt) - 1)  # one token gives the logits
        if keep < len(slot.tokens):
            try:
                self.ctx.truncate(keep, slot.id)
            except _llama.LlamaError:  # memories that cannot drop a suffix (recurrent) start over
                self.ctx.truncate(0, slot.id)
                keep = 0
            del slot.tokens[keep:]
        slot.job, slot.state = job, SlotState.PREFILL
        slot.pending = list(job.prompt[keep:])
        slot.cached = keep
        slot.text = TextStream(self.model.detokenize_bytes, job.stop)
        slot.rng = np.random.default_rng(job.seed)
        slot.t_admitted, slot.t_prompt_start = time.perf_counter(), None
        slot.n_requests += 1
        slot.n_prompt_cached += keep

    def _advance(self, s: Slot, logits: np.ndarray, now: float) -> None:
        """The slot's logits after a step: the prompt ended, or the last generated token was decoded."""
        job = s.job
        assert job is not None and s.text is not None and s.rng is not None
        if s.state is SlotState.PREFILL:
            s.state, s.t_prompt_end = SlotState.GENERATE, now
            if job.max_tokens == 0:
                self._finish(s, "length", now)
                return
        if job.ignore_eos:
            logits[self._eog_tokens] = -np.inf
        # the order of Llama.generate and create_completion: end-of-generation, text, stop strings, limits
        tok = sample(logits, job.sampling, s.rng)
        if self.model.is_eog(tok):
            self._finish(s, "stop", now)
            return
        s.n_generated += 1
        ready = s.text.push(tok)
        if ready:
            self._emit(job, Delta(ready))
        if s.text.stopped:
            self._finish(s, "stop", now)
        elif (job.max_tokens is not None and len(s.text.tokens) >= job.max_tokens) or len(s.tokens) >= self.n_ctx_slot:
            self._finish(s, "length", now)
        else:
            s.next_token = tok

    def _finish(self, s: Slot, reason: str, now: float) -> None:
        job = s.job
        assert job is not None and s.text is not None
        prompt_start = s.t_prompt_start if s.t_prompt_start is not None else s.t_prompt_end
        timings = Timings(cache_n=s.cached, prompt_n=len(job.prompt) - s.cached,
                          prompt_ms=1e3 * (s.t_prompt_end - prompt_start), predicted_n=len(s.text.tokens),
                          predicted_ms=1e3 * (now - s.t_prompt_end), queue_ms=1e3 * (s.t_admitted - job.submitted))
        usage = Usage(prompt_tokens=len(job.prompt), cached_tokens=s.cached, completion_tokens=len(s.text.tokens))
        tail = s.text.finish()
        self._release(s)
        s.last_timings = timings
        log.info("%s slot %d: prompt %d tokens (%d cached, %d evaluated, %.1f ms, %.1f t/s), generated %d "
                 "(%.1f ms, %.1f t/s), queued %.1f ms, finish %s", job.id, s.id, usage.prompt_tokens,
                 timings.cache_n, timings.prompt_n, timings.prompt_ms, timings.prompt_per_second,
                 timings.predicted_n, timings.predicted_ms, timings.predicted_per_second, timings.queue_ms, reason)
        self._emit(job, Done(tail, reason, usage, timings))

    def _fail(self, s: Slot, message: str) -> None:
        """The job fails and the slot forgets its cache (a failed decode leaves it unknown)."""
        job = s.job
        self.ctx.truncate(0, s.id)
        s.tokens.clear()
        self._release(s)
        if job is not None:
            log.error("%s slot %d: %s", job.id, s.id, message)
            self._emit(job, Failed(message))

    def _release(self, s: Slot) -> None:
        with self._cond:
            s.job, s.state, s.pending, s.last_used = None, SlotState.IDLE, [], time.perf_counter()
            self._cond.notify_all()

    def _release_cancelled(self) -> None:
        """Free the slots of cancelled jobs (lock held); what they evaluated stays cached."""
        for s in self.slots:
            job = s.job
            if job is not None and job.cancelled:
                log.info("%s slot %d: cancelled after %d prompt tokens and %d generated", job.id, s.id,
                         len(job.prompt) - len(s.pending), len(s.text.tokens) if s.text else 0)
                self._release(s)  # the condition's lock is re-entrant

    def _emit(self, job: Job, event: Event) -> None:
        try:
            job.emit(event)
        except Exception:  # the receiver is gone (its event loop closed): nobody waits for the job
            job.cancelled = True
