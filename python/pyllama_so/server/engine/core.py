"""Slots over one llama.cpp context, and the thread that decodes them in shared batches.

One thread owns the Context. Each step is one llama_decode call holding the next token of every
generating slot and pieces of the prompts of prefilling slots: while any slot generates, at most
prefill_chunk prompt tokens (n_ubatch by default: a long prompt delays the running generations by about
one ubatch per token, not by its whole prefill; with split overlap two ubatches, one a lane, so that the lanes
overlap in these steps too), otherwise up to n_batch, whose ubatches split overlap alternates between its
lanes. A slot keeps the tokens of its last request in its part of the KV cache; a request goes to the free
slot holding the longest prefix of its prompt, if at least a tenth of it (or to the one it names, id_slot,
once that is free), and only the rest is evaluated; otherwise, and among equals, to one next to the busy
slots, since a step takes a ubatch per run of consecutive slot ids.

A step is left running on the devices while the thread streams the text of the step before it
(Context.decode_batch_sample_begin/_end): whether a slot goes on is decided from its sampled token
(end of generation, max_tokens, the end of its context) before the next step starts; a stop string,
found in the text afterwards, ends the request at once, and the one token the slot had in the running
step is decoded and dropped. When nothing is to be done on the context between two steps (no request to
admit, none cancelled), one call ends a step and starts the next
(Context.decode_batch_sample_chain), with no Python between them.

Who may touch what (llama-server's split of a task queue from its results):
- The engine thread owns the Context, the Slots and their Samplers and the step counters: only it
  reads or writes them, and it calls into llama.cpp (decode, truncate, sampling) holding no lock.
  While a step runs, it makes no call on the Context and frees no Sampler of that step.
- Other threads (the HTTP side) go through the job queue: submit(), cancel(), drain() and stop()
  change a deque of waiting jobs and a few flags under one lock, which guards nothing else and under
  which no C call runs. Job.cancelled is the one field they write on a job the engine may hold.
- Results go the other way through each Job's emit callback, called on the engine thread.
- snapshot() returns the last EngineSnapshot the engine thread published: an immutable object that
  replaces the previous one whole after each step, so a reader never sees a half-written slot.

Everything here runs without HTTP.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pyllama_so import _llama
from pyllama_so.logprobs import LogprobRows, TokenLogprob, prompt_logprob_rows
from pyllama_so.prefix import common_prefix
from pyllama_so.sampling import SamplingParams
from pyllama_so.textstream import TextStream

log = logging.getLogger("pyllama_so.server")

SHUTTING_DOWN = "the server is shutting down"


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


class PromptError(ValueError):
    """A prompt the engine cannot take: empty, or too long for a slot's context (too_long)."""

    def __init__(self, message: str, *, too_long: bool = False) -> None:
        super().__init__(message)
        self.too_long = too_long


class EngineStopped(RuntimeError):
    """The engine takes no jobs: it is shutting down, stopped, or its thread failed."""


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
        per_prompt = self.prompt_ms / self.prompt_n if self.prompt_n else 0.0
        per_predicted = self.predicted_ms / self.predicted_n if self.predicted_n else 0.0
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
                "prompt_per_token_ms": round(per_prompt, 3), "prompt_per_second": round(self.prompt_per_second, 3),
                "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
                "predicted_per_token_ms": round(per_predicted, 3),
                "predicted_per_second": round(self.predicted_per_second, 3), "queue_ms": round(self.queue_ms, 3)}


@dataclass(frozen=True)
class Delta:
    """Text that became final, with the logprobs of the tokens it starts (when the job asked for them), the
    tokens generated since the previous event, and the slot generating them."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    tokens: tuple[int, ...] = ()
    slot: int = -1


@dataclass(frozen=True)
class Done:
    """The last event of a job that ran: the rest of its text and how it ended."""

    text: str
    # "stop": an end-of-generation token or a stop string; "length": max_tokens, the end of the slot's
    # context, or the end of the shutdown's grace period
    finish_reason: str
    usage: Usage
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] = ()
    tokens: tuple[int, ...] = ()  # generated since the last Delta
    slot: int = -1
    stopping_word: str = ""  # the stop string that ended it, if one did
    n_cached: int = 0  # tokens the slot's cache holds afterwards (prompt and generated)


@dataclass(frozen=True)
class Failed:
    """The last event of a job that could not finish."""

    message: str
    stopped: bool = False  # the engine stopped or is shutting down: the job itself was fine


Event = Delta | Done | Failed


@dataclass(eq=False)
class Job:
    """A tokenized prompt and how to generate after it. emit gets each Event, on the engine thread; it
    must not block."""

    prompt: list[int]
    emit: Callable[[Event], None]
    # None: up to the end of the slot's context; 0: evaluate the prompt into the slot's cache, generate nothing
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop: Sequence[str] = ()
    # GBNF text for the slot's sampler (checked before the job is queued), or a tool call's grammar (tool_calls.py)
    grammar: str | dict[str, Any] | None = None
    logprobs: int | None = None  # the top logprobs of each generated token, or None
    # the top logprobs of each prompt token (echo with logprobs): the whole prompt evaluated, each token scored
    prompt_logprobs: int | None = None
    ignore_eos: bool = False  # end-of-generation tokens are never sampled (llama-server's ignore_eos)
    id_slot: int | None = None  # the slot that must run it (llama-server's id_slot); None: any free slot
    cache_prompt: bool = True  # False: evaluate the whole prompt, whatever the slot holds
    special_text: bool = False  # special tokens' text in the output (a tool-call format's markers may be such)
    settings: Mapping[str, Any] | None = None  # the request's settings as the server shows them; kept only
    id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:12]}")
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by cancel() (any thread), read by the engine thread at each step

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be None or >= 0, got {self.max_tokens}")
        if self.id_slot is not None and self.id_slot < 0:
            raise ValueError(f"id_slot must be None or >= 0, got {self.id_slot}")


class SlotState(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    GENERATE = "generate"


@dataclass(frozen=True)
class SlotView:
    """A slot as /slots shows it, copied by the engine thread."""

    id: int
    state: str
    job: str | None
    n_cached: int
    prompt_tokens: int | None
    prompt_pending: int | None
    generated: int | None
    totals: tuple[tuple[str, int], ...]
    last: Timings | None
    # the job running, else the last one (llama-server's /slots shows both): its prompt tokens taken from the
    # cache and evaluated, its generated tokens, whether its text has a newline
    task: Job | None = field(default=None, compare=False)
    task_cached: int = 0
    task_evaluated: int = 0
    task_generated: int = 0
    has_new_line: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "job": self.job, "n_cached": self.n_cached,
                "prompt_tokens": self.prompt_tokens, "prompt_pending": self.prompt_pending,
                "generated": self.generated, "totals": dict(self.totals),
                "last": self.last.as_dict() if self.last else None}


@dataclass(eq=False)
class Slot:
    """One sequence of the context, and the request it runs. Only the engine thread touches it."""

    id: int
    tokens: list[int] = field(default_factory=list)  # what its part of the KV cache holds
    state: SlotState = SlotState.IDLE
    job: Job | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    next_token: int = -1  # sampled, decoded at the next step
    continues: bool = False  # its last sampled token is decoded next (not an end, not its last)
    n_sampled: int = 0  # tokens of this request sampled so far, end-of-generation ones not counted
    in_step: bool = False  # it has tokens in the step that is running
    text: TextStream | None = None
    logprob_rows: LogprobRows | None = None  # with job.logprobs: each generated token's, until sent
    sent: int = 0  # characters of text emitted
    sampler: _llama.Sampler | None = None  # the request's llama.cpp sampler chain, seeded per request
    cached: int = 0  # prompt tokens reused
    evaluated: int = 0  # prompt tokens of the job evaluated so far
    tokens_sent: int = 0  # generated tokens reported in events
    has_new_line: bool = False  # the job's text so far has a newline
    task: Job | None = None  # the job, or the last one after it ended
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

    def view(self) -> SlotView:
        job = self.job
        return SlotView(
            id=self.id, state=self.state.value, job=job.id if job else None, n_cached=len(self.tokens),
            prompt_tokens=len(job.prompt) if job else None, prompt_pending=len(self.pending) if job else None,
            generated=len(self.text.tokens) if job and self.text else None,
            totals=(("requests", self.n_requests), ("prompt_evaluated", self.n_prompt_evaluated),
                    ("prompt_cached", self.n_prompt_cached), ("generated", self.n_generated)),
            last=self.last_timings, task=self.task, task_cached=self.cached, task_evaluated=self.evaluated,
            task_generated=len(self.text.tokens) if self.text else 0, has_new_line=self.has_new_line)


@dataclass(frozen=True)
class Step:
    """One llama_decode call: (slot id, tokens, kind) per slot, kind "prefill" or "generate"; seconds from
    starting it to its sampled outputs, host_seconds the engine's work between the end of the step before
    and its start (reading the outputs, admitting, building the batch): the time the devices wait for the
    host. seconds is issue_seconds (building the batch and llama_decode's return: graph, scheduling,
    launches), stream_seconds (while it runs: the snapshot and the text of the step before) and
    wait_seconds (for the devices, then sampling its rows). t_start: time.perf_counter() at its start."""

    index: int
    items: tuple[tuple[int, int, str], ...]
    seconds: float
    host_seconds: float = 0.0
    issue_seconds: float = 0.0
    stream_seconds: float = 0.0
    wait_seconds: float = 0.0
    t_start: float = 0.0

    def as_record(self) -> dict[str, Any]:
        """One line of the server's --step-log: the step's slots by kind, its tokens, the runs of consecutive ids its
        slots make (llama.cpp's ubatches: one per run at least) and its phases in ms."""
        gen = [n for _, n, kind in self.items if kind == "generate"]
        prompt = [n for _, n, kind in self.items if kind != "generate"]
        record = {"step": self.index, "t_start_s": round(self.t_start, 6), "generating": len(gen),
                  "prompt_slots": len(prompt), "prompt_tokens": sum(prompt),
                  "slot_runs": id_runs([slot for slot, _, _ in self.items]), "ms": round(1e3 * self.seconds, 4)}
        record.update({f"{k}_ms": round(1e3 * getattr(self, f"{k}_seconds"), 4) for k in STEP_PHASES})
        return record


STEP_PHASES = ("host", "issue", "stream", "wait")  # Step's *_seconds, as /engine's step_phase_ms names them


@dataclass(frozen=True)
class Counters:
    """Totals since the engine started (/metrics names them as llama-server does)."""

    requests: int = 0  # jobs that ended with Done
    prompt_tokens: int = 0  # prompt tokens evaluated, of every job (cancelled ones too)
    prompt_cached: int = 0  # prompt tokens taken from a slot's cache
    prompt_seconds: float = 0.0  # the prompt times of the jobs that ended with Done
    timed_prompt_tokens: int = 0  # the prompt tokens those jobs evaluated
    predicted_tokens: int = 0  # tokens generated by the jobs that ended with Done
    predicted_seconds: float = 0.0
    decodes: int = 0  # llama_decode calls (steps)
    busy_slot_steps: int = 0  # slots holding a job, summed over the steps
    n_tokens_max: int = 0  # the most tokens a slot's cache held after a step


@dataclass(frozen=True)
class EngineSnapshot:
    """What /slots shows: the slots and counters as the engine thread published them after a step, and
    the queue as it was when snapshot() was called."""

    slots: tuple[SlotView, ...]
    n_ctx_slot: int
    n_batch: int
    n_ubatch: int
    steps: int
    steps_by_slots: tuple[tuple[int, int], ...]  # (slots decoded together, steps)
    last_step: Step | None
    step_host_ms_mean: float
    split_overlap: dict[str, Any]  # a fresh dict from the context, never changed after
    step_phase_ms_mean: tuple[tuple[str, float], ...] = ()  # (phase of STEP_PHASES, mean ms per step)
    steps_chained: int = 0  # steps started in the call that ended the step before (no host gap)
    counters: Counters = Counters()
    waiting: int = 0
    queue_size: int = 0
    running: bool = True
    accepting: bool = True
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        step = self.last_step
        return {
            "slots": [s.as_dict() for s in self.slots],
            "n_ctx_slot": self.n_ctx_slot, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "queue": {"waiting": self.waiting, "size": self.queue_size},
            "steps": self.steps, "steps_chained": self.steps_chained,
            "steps_by_slots": {str(k): v for k, v in self.steps_by_slots},
            "last_step": None if step is None else {
                "items": [{"slot": s, "tokens": n, "kind": k} for s, n, k in step.items],
                "ms": round(1e3 * step.seconds, 3), "host_ms": round(1e3 * step.host_seconds, 3),
                **{f"{k}_ms": round(1e3 * getattr(step, f"{k}_seconds"), 3) for k in STEP_PHASES[1:]}},
            "step_host_ms": {"last": None if step is None else round(1e3 * step.host_seconds, 3),
                             "mean": round(self.step_host_ms_mean, 3)},
            "step_phase_ms": {k: round(v, 3) for k, v in self.step_phase_ms_mean},
            "split_overlap": copy.deepcopy(self.split_overlap),
            "running": self.running, "accepting": self.accepting, "error": self.error,
        }


# the share of a prompt a slot's cached prefix must hold to choose the slot over one next to the busy slots, by
# default (Engine's prefix_share; llama-server's --slot-prompt-similarity, 0.1 by default, plays that part against
# its least-recently-used choice)
PREFIX_SHARE = 0.1


def id_runs(ids: Sequence[int]) -> int:
    """How many runs of consecutive numbers the distinct ids make ({0, 1, 2, 5}: 2)."""
    v = sorted(set(ids))
    return sum(1 for a, b in zip([None, *v], v) if a is None or b != a + 1)


class Engine:
    """The slots of ctx (one per sequence, ctx.n_seq_max of them) and the thread that runs them.

    submit() a Job; it waits in a queue of at most queue_size jobs beyond the free slots (QueueFull
    after that) until a slot takes it. cancel() drops it wherever it is; a slot it held keeps what it
    evaluated. drain() starts a shutdown: no new jobs, and those accepted end within a grace period.
    on_step, if given, is called on the engine thread after each step (once the next one runs). The
    module docstring says which thread may touch what.
    """

    def __init__(self, ctx: _llama.Context, *, queue_size: int = 64,
                 on_step: Callable[[Step], None] | None = None, backend_sampling: bool = False,
                 chain_steps: bool = True, prefill_chunk: int | None = None,
                 prefix_share: float = PREFIX_SHARE) -> None:
        # fixed at construction: read from any thread
        self.ctx = ctx
        self.backend_sampling = backend_sampling  # slots' chains in the decode graph (Context.set_backend_sampler)
        self.chain_steps = chain_steps  # a step that needs no admission starts in the call that ends the one before
        self.model = ctx.model
        self.n_batch = ctx.n_batch
        self.n_ubatch = ctx.n_ubatch
        self._split_overlap = ctx.split_overlap_stats()
        # the most prompt tokens of a step while slots generate: by default one ubatch, with split overlap's lanes one
        # a lane (a piece of one ubatch runs on one lane beside the generated tokens' small ubatch, and nothing of the
        # prompt overlaps it: docs/benchmarks.md, "Mixed load")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        default_chunk = ctx.n_ubatch * (2 if self._split_overlap["enabled"] else 1)
        self.prefill_chunk = min(default_chunk if prefill_chunk is None else prefill_chunk, ctx.n_batch)
        if not 0.0 <= prefix_share <= 1.0:
            raise ValueError(f"prefix_share must be in [0, 1], got {prefix_share}")
        self.prefix_share = prefix_share  # 0: a cached prefix never decides the slot
        self.n_ctx_slot = ctx.n_ctx_seq
        self.n_slots = ctx.n_seq_max
        self.queue_size = queue_size
        self.on_step = on_step
        # the engine thread's
        self._slots = [Slot(i) for i in range(self.n_slots)]
        self._steps = 0
        self._chained = 0  # steps started by the call that ended the step before
        self._steps_by_slots: dict[int, int] = {}  # how many steps decoded 1, 2, ... slots together
        self._phase_seconds = dict.fromkeys(STEP_PHASES, 0.0)  # of all steps
        self._last_step: Step | None = None
        self._running: list[tuple[Slot, Job, list[int], bool]] | None = None  # the step on the devices
        self._running_kinds: tuple[tuple[int, int, str], ...] = ()  # its Step.items
        self._running_busy = 0  # slots holding a job when it started
        self._t_step_start = 0.0  # of the running step
        self._t_issued = 0.0  # when its llama_decode returned
        self._issue_seconds = 0.0  # its start to then
        self._t_step_end: float | None = None  # of the last step that ended
        # samplers of released slots that wait for no step to run: their step samples with them when it ends,
        # and one in the graph (backend sampling) leaves it only while the context runs nothing
        self._free_after_step: list[_llama.Sampler] = []
        self._done = Counters()  # the fields counted as jobs end and steps run (the rest comes from the slots)
        # the job queue: these fields only under _lock
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._n_jobs = 0  # accepted and not ended: waiting, or in a slot
        self._accepting = True
        self._deadline: float | None = None  # set by drain(): jobs still running then are ended
        self._stopping = False
        # published by the engine thread, read anywhere
        self.error: BaseException | None = None
        self._snapshot: EngineSnapshot
        self._publish()
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
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def drain(self, grace: float) -> None:
        """Begin a shutdown: submit() refuses new jobs from now on; the accepted ones run for at most grace
        more seconds, after which each one still generating ends as at its max_tokens (Done, "length")
        and each still waiting fails. A later call may shorten the grace (0: end them at the next step)."""
        deadline = time.perf_counter() + grace
        with self._lock:
            if self._accepting:
                log.info("shutting down: %d requests in progress or waiting get up to %g s", self._n_jobs, grace)
            self._accepting = False
            self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._lock.notify_all()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def accepting(self) -> bool:
        return self.running and self._accepting

    def submit(self, job: Job) -> None:
        if not job.prompt:
            raise PromptError("the prompt is empty")
        # a completion needs room for one token after the prompt (llama-server refuses n_tokens >= n_ctx);
        # max_tokens 0 only evaluates the prompt into a slot's cache
        if len(job.prompt) > self.n_ctx_slot - (job.max_tokens != 0):
            raise PromptError(f"the prompt has {len(job.prompt)} tokens but a slot's context holds {self.n_ctx_slot}"
                              + ("" if job.max_tokens == 0 else ", the first generated token included"), too_long=True)
        if job.id_slot is not None and job.id_slot >= self.n_slots:
            raise ValueError(f"id_slot {job.id_slot} out of range: the server has {self.n_slots} slots")
        with self._lock:
            if not self._accepting:
                raise EngineStopped(SHUTTING_DOWN)
            if not self.running:
                raise EngineStopped("the engine is not running" + (f": {self.error}" if self.error else ""))
            if self._n_jobs >= self.n_slots + self.queue_size:
                raise QueueFull(f"all {self.n_slots} slots are busy and {self.queue_size} requests wait")
            self._waiting.append(job)
            self._n_jobs += 1
            self._lock.notify()

    def cancel(self, job: Job) -> None:
        """Drop the job: at once if it still waits, else at the engine's next step."""
        job.cancelled = True
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)
                self._n_jobs -= 1

    def snapshot(self) -> EngineSnapshot:
        """The slots and counters of the last step, and the queue now."""
        snap = self._snapshot  # the engine thread replaces it whole: one read is consistent
        with self._lock:
            waiting, accepting = len(self._waiting), self._accepting
        return replace(snap, waiting=waiting, queue_size=self.queue_size, running=self.running,
                       accepting=accepting and self.running,
                       error=None if self.error is None else str(self.error))

    # -- the engine thread --

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as e:  # a bug here must not leave requests hanging
            log.exception("the engine failed")
            self.error = e
            items, self._running = self._running, None
            if items is not None:  # let the devices finish it before its samplers go
                try:
                    self.ctx.decode_batch_sample_end()
                except Exception:
                    pass
                self._step_ended(items)
        with self._lock:
            self._stopping = True
            waiting = list(self._waiting)
            self._waiting.clear()
        failed = Failed(SHUTTING_DOWN if self.error is None else f"the engine failed: {self.error}", stopped=True)
        for s in self._slots:
            job = s.job
            if job is not None:
                self._release(s)
                self._end(job, failed)
        for job in waiting:
            self._end(job, failed)
        self._publish()

    def _step(self) -> bool:
        """End the running step, take waiting jobs, start the next step, stream the text of the one that
        ended. False when the engine stops."""
        if self._chainable():
            outs, ended = self._chain_step()
            self._step_published(ended)
            self._stream(outs)
            return True
        outs, ended = self._end_step()
        if ended is not None and not outs and not any(s.job is not None for s in self._slots):
            self._step_published(ended)  # before waiting for work: nothing runs meanwhile
            ended = None
        with self._lock:
            idle = False
            while not (self._stopping or self._waiting or outs or any(s.job is not None for s in self._slots)):
                self._lock.wait()
                idle = True
            if idle:  # the devices waited for work, not for the host: the next step's host time starts now
                self._t_step_end = time.perf_counter()
            if self._stopping:
                return False
            taken = self._take_jobs({s.id for s in self._slots if s.job is None})
            deadline = self._deadline
        # from here on without the lock: the slots are this thread's
        now = time.perf_counter()
        self._release_cancelled()
        if deadline is not None and now >= deadline:
            self._stream(outs)
            self._end_grace(now, taken)
            self._step_published(ended)
            return True
        for job in sorted(taken, key=lambda j: j.id_slot is None):  # the jobs for one slot take theirs first
            self._admit(job)
        self._start_step()
        # while the step runs: the snapshot of the one that ended, then its text
        if ended is not None or self._running is None:  # idle: what cancels and admissions changed is in none
            self._step_published(ended)
        self._stream(outs)
        return True

    def _step_published(self, ended: Step | None) -> None:
        """Publish the slots as the step that ended left them (and as admissions since changed them), then
        tell on_step."""
        self._publish()
        if ended is not None and self.on_step is not None:
            self.on_step(ended)

    def _pieces(self, n_generating: int, in_step: Mapping[int, int]) -> list[tuple[Slot, Job, list[int], bool]]:
        """The prompt pieces of the next step, in order of admission: while any slot generates (n_generating),
        at most prefill_chunk tokens, else up to n_batch. in_step: slot id -> its pending tokens already in
        the running step. Each piece is (slot, job, tokens, whether it ends the prompt)."""
        budget = min(self.prefill_chunk, self.n_batch - n_generating) if n_generating else self.n_batch
        pieces = []
        for s in sorted((s for s in self._slots if s.job is not None and s.state is SlotState.PREFILL),
                        key=lambda s: s.t_admitted):
            rest = s.pending[in_step.get(s.id, 0):]
            if not rest:  # its last piece is in the running step
                continue
            if budget <= 0:
                break
            piece = rest[:budget]
            budget -= len(piece)
            pieces.append((s, s.job, piece, len(piece) == len(rest)))
        return pieces

    def _start_step(self) -> None:
        """Start a llama_decode of the next token of every slot that goes on and pieces of the prompts."""
        busy = [s for s in self._slots if s.job is not None]
        generating = [s for s in busy if s.state is SlotState.GENERATE and s.continues]
        items: list[tuple[Slot, Job, list[int], bool]] = [(s, s.job, [s.next_token], True) for s in generating]
        items += self._pieces(len(generating), {})
        if not items:
            return
        # llama.cpp cuts a batch of several sequences (each with its own KV stream) into ubatches of
        # consecutive seq_ids: in seq_id order the generated tokens share one ubatch
        items.sort(key=lambda item: item[0].id)
        t0 = time.perf_counter()
        while True:
            try:
                # every output row is sampled in C by its slot's chain when the step ends
                self.ctx.decode_batch_sample_begin([(s.id, toks, s.sampler if want else None, job.logprobs)
                                                    for s, job, toks, want in items])
                break
            except _llama.ContextFullError as e:  # no room in a cache the slots share (-kvu)
                items = self._make_room(items, e)
                if not items:
                    return
            except (_llama.LlamaError, ValueError) as e:
                self._fail_step(items, e)
                return
        kinds = tuple((s.id, len(toks), s.state.value) for s, _, toks, _ in items)
        self._t_issued = time.perf_counter()
        self._issue_seconds = self._t_issued - t0
        for s, _, _, _ in items:
            s.in_step = True
        self._running, self._running_kinds, self._t_step_start = items, kinds, t0
        self._running_busy = len(busy)

    def _make_room(self, items: list[tuple[Slot, Job, list[int], bool]],
                   error: Exception) -> list[tuple[Slot, Job, list[int], bool]]:
        """The step of items found no room in the KV cache (one cache for all slots: -kvu). Frees or defers one
        thing and returns the items to try again (empty: none left), so that nothing is lost while something
        else can go: first the idle slots' cached prompts; then prompt pieces wait while slots generate (or
        all but the oldest prompt's); then a waiting prompt begun earlier gives its cells back; then a
        generating slot ends with "length" (its text is whole: one without max_tokens, else the newest) and its
        cache goes at the next try; a prompt piece alone that does not fit fails its request."""
        idle = [s for s in self._slots if s.job is None and s.tokens]
        if idle:
            for s in idle:
                self.ctx.truncate(0, s.id)
                s.tokens.clear()
            log.info("the KV cache is full: dropped the cached prompts of idle slots %s", [s.id for s in idle])
            return items
        pieces = [item for item in items if item[0].state is SlotState.PREFILL]
        generating = [item for item in items if item[0].state is SlotState.GENERATE]
        if pieces and generating:
            return generating
        if len(pieces) > 1:
            newest = max(pieces, key=lambda item: item[0].t_admitted)
            return [item for item in items if item is not newest]
        # a prompt begun in an earlier step that now waits holds cells: they go back (it is evaluated again
        # later) before a generating request is cut or the piece that goes on fails
        stepping = {item[0].id for item in items}
        begun = [s for s in self._slots if s.job is not None and s.state is SlotState.PREFILL and s.tokens
                 and s.id not in stepping]
        if begun:
            s = max(begun, key=lambda s: s.t_admitted)
            log.info("%s slot %d: the KV cache is full: its prompt gives back %d cells and waits", s.job.id, s.id,
                     len(s.tokens))
            self.ctx.truncate(0, s.id)
            s.tokens.clear()
            s.pending, s.cached, s.evaluated = list(s.job.prompt), 0, 0
            return items
        if generating:  # a request without max_tokens asked for up to the context's end; else the newest goes
            s = max((item[0] for item in generating), key=lambda s: (s.job.max_tokens is None, s.t_admitted))
            log.info("%s slot %d: the KV cache is full: ends at %d tokens", s.job.id if s.job else "-", s.id,
                     len(s.tokens))
            self._finish(s, "length", time.perf_counter())
            self._publish()
            return [item for item in items if item[0] is not s]
        self._fail_step(items, error)
        return []

    def _chainable(self) -> bool:
        """Whether the running step can end and the next begin in one call (Context.decode_batch_sample_chain):
        nothing to do between them on the context (no admission, cancel, shutdown)."""
        if not self.chain_steps or self._running is None:
            return False
        if any(smp.on_backend for smp in self._free_after_step):  # to be freed between two steps
            return False
        if any(s.job is not None and s.job.cancelled for s in self._slots):
            return False
        with self._lock:
            return not (self._stopping or self._deadline is not None
                        or (self._waiting and any(s.job is None for s in self._slots)))

    def _chain_step(self) -> tuple[list[tuple[Slot, Job, tuple[int, float | None, Any], float]], Step | None]:
        """End the running step and start the next in one call, with no Python in between: each slot that
        sampled goes on unless its token ends it (the C side checks end-of-generation; the limits of _take are
        known before), with the prompt pieces _start_step would add. Returns what _end_step does."""
        items, self._running = self._running, None
        assert items is not None
        follow: list[tuple[Slot, Job]] = []
        in_step: dict[int, int] = {}
        for s, job, toks, want in items:
            if s.job is not job:  # ended while the step ran
                continue
            if s.state is SlotState.PREFILL:
                in_step[s.id] = len(toks)
            # _take's limits for the token being sampled, which the step's tokens precede in the cache
            if want and self._within_limits(job, s.n_sampled + 1, len(s.tokens) + len(toks)):
                follow.append((s, job))
        plan = [(s, job, None, True) for s, job in follow] + self._pieces(len(follow), in_step)
        plan.sort(key=lambda item: item[0].id)  # as _start_step: the generated tokens share one ubatch
        t_wait = time.perf_counter()
        try:
            sampled, started, t1, t_launch, error = self.ctx.decode_batch_sample_chain(
                [(s.id, toks, s.sampler if want else None, job.logprobs, True) for s, job, toks, want in plan])
        except (_llama.LlamaError, ValueError) as e:
            try:  # a plan the context refused leaves the step running
                self.ctx.decode_batch_sample_end()
            except (_llama.LlamaError, ValueError, RuntimeError):
                pass
            self._step_ended(items)
            self._fail_step(items, e)
            return [], None
        t_return = time.perf_counter()
        self._step_ended(items, next_running=bool(started) and error is None)
        outs, ended = self._took(items, sampled, t_wait, t1)
        if isinstance(error, _llama.ContextFullError):  # the next step starts apart, making room (_make_room)
            return outs, ended
        if error is not None:  # the next llama_decode failed (started is empty): its requests end, the engine goes on
            self._fail_step([item for item in plan if item[0].state is SlotState.PREFILL or item[0].continues], error)
            return outs, ended
        by_slot = {s.id: (s, job, want) for s, job, _, want in plan}
        went = [(by_slot[sid][0], by_slot[sid][1], list(toks), by_slot[sid][2]) for sid, toks, _, _ in started]
        if {s.id for s, _, _, _ in went if s.state is SlotState.GENERATE} != \
                {s.id for s, job, _, want in items if want and s.job is job and s.continues}:
            raise RuntimeError("the chained step disagrees with the engine on which slots go on")
        if went:
            for s, _, _, _ in went:
                s.in_step = True
            self._running, self._t_step_start, self._t_issued = went, t_launch, t_return
            self._running_kinds = tuple((s.id, len(toks), s.state.value) for s, _, toks, _ in went)
            self._issue_seconds = t_return - t_launch
            self._running_busy = sum(s.job is not None for s in self._slots)
            self._chained += 1
        return outs, ended

    def _end_step(self) -> tuple[list[tuple[Slot, Job, tuple[int, float | None, Any], float]], Step | None]:
        """Wait for the running step (if any) and take its outputs: the slots' tokens and prompt progress,
        and from each sampled token whether its slot goes on. Returns the outputs whose text is to be
        streamed, (slot, job, (token, logprob, top), time), and the Step that ended, which the caller
        publishes once the next one runs (the devices do not wait for the snapshot)."""
        items, self._running = self._running, None
        if items is None:
            return [], None
        t_wait = time.perf_counter()
        try:
            sampled = self.ctx.decode_batch_sample_end()
        except (_llama.LlamaError, ValueError) as e:
            sampled = None
            error = e
        t1 = time.perf_counter()
        self._step_ended(items)
        if sampled is None:
            self._fail_step(items, error)
            return [], None
        return self._took(items, sampled, t_wait, t1)

    def _took(self, items: list[tuple[Slot, Job, list[int], bool]], sampled: list[Any], t_wait: float,
              t1: float) -> tuple[list[tuple[Slot, Job, tuple[int, float | None, Any], float]], Step]:
        """The outputs of the step of items, which ended at t1 (its wait began at t_wait): see _end_step."""
        self._split_overlap = self.ctx.split_overlap_stats()
        outs = []
        for (s, job, toks, want), out in zip(items, sampled):
            s.tokens.extend(toks)  # in its KV cache, whether or not its job still runs
            if s.job is not job:  # it ended while the step ran (a stop string)
                continue
            if s.state is SlotState.PREFILL:
                del s.pending[:len(toks)]
                s.n_prompt_evaluated += len(toks)
                s.evaluated += len(toks)
                if s.t_prompt_start is None:
                    s.t_prompt_start = self._t_step_start
            if want:
                self._take(s, job, out[0], t1)
                outs.append((s, job, out, t1))
        # the host's gap between the end of the step before and this one's start (0 for the first)
        host = self._t_step_start - self._t_step_end if self._t_step_end is not None else 0.0
        step = Step(self._steps, self._running_kinds, t1 - self._t_step_start, max(host, 0.0),
                    issue_seconds=self._issue_seconds, stream_seconds=t_wait - self._t_issued, wait_seconds=t1 - t_wait,
                    t_start=self._t_step_start)
        self._t_step_end = t1
        self._steps += 1
        self._steps_by_slots[len(items)] = self._steps_by_slots.get(len(items), 0) + 1
        for k in STEP_PHASES:
            self._phase_seconds[k] += getattr(step, f"{k}_seconds")
        self._last_step = step
        self._done = replace(self._done, busy_slot_steps=self._done.busy_slot_steps + self._running_busy,
                             n_tokens_max=max(self._done.n_tokens_max, *(len(s.tokens) for s in self._slots)))
        return outs, step

    def _publish(self) -> None:
        """Replace the snapshot that snapshot() returns (one reference: readers see the old or the new)."""
        self._snapshot = EngineSnapshot(
            slots=tuple(s.view() for s in self._slots), n_ctx_slot=self.n_ctx_slot, n_batch=self.n_batch,
            n_ubatch=self.n_ubatch, steps=self._steps, steps_by_slots=tuple(sorted(self._steps_by_slots.items())),
            last_step=self._last_step,
            step_host_ms_mean=1e3 * self._phase_seconds["host"] / self._steps if self._steps else 0.0,
            split_overlap=self._split_overlap,
            step_phase_ms_mean=tuple((k, 1e3 * v / self._steps if self._steps else 0.0)
                                     for k, v in self._phase_seconds.items()),
            steps_chained=self._chained,
            counters=replace(self._done, decodes=self._steps,
                             prompt_tokens=sum(s.n_prompt_evaluated for s in self._slots),
                             prompt_cached=sum(s.n_prompt_cached for s in self._slots)))

    def _take_jobs(self, free: set[int]) -> list[Job]:
        """Under the lock: the waiting jobs that the free slots take now, in order of arrival. A job for one
        slot (id_slot) whose slot is busy waits without holding back the jobs behind it; the others take
        any free slot (_admit picks it)."""
        taken: list[Job] = []
        n_any = 0  # jobs taken that go to any free slot
        for job in list(self._waiting):
            if len(free) <= n_any:
                break
            if job.id_slot is None:
                n_any += 1
            elif job.id_slot in free:  # len(free) > n_any: the others still find a slot
                free.discard(job.id_slot)
            else:
                continue
            self._waiting.remove(job)
            taken.append(job)
        return taken

    def _admit(self, job: Job) -> None:
        """Give a job taken from the queue the free slot holding the longest prefix of its prompt, where that
        prefix is at least prefix_share of the prompt; among equals, one that leaves the busy slots' ids in the
        fewest runs of consecutive ids (llama.cpp cuts a step into a ubatch per run: a gap costs every step of
        the request a pass over the weights more), then the longest prefix, then the least recently used."""
        if job.cancelled:
            self._end(job, None)
            return
        params = job.sampling if job.seed is None else dataclasses.replace(job.sampling, seed=job.seed)
        if job.ignore_eos:  # as llama-server: a bias of -inf on every end-of-generation token
            bias = {**(params.logit_bias or {}), **{int(t): float("-inf") for t in self._eog_tokens}}
            params = dataclasses.replace(params, logit_bias=bias)
        try:
            sampler = _llama.Sampler(self.model, params, n_ctx=self.n_ctx_slot, grammar=job.grammar)
        except ValueError as e:  # the HTTP side checks first; a job submitted without that check fails alone
            self._end(job, Failed(str(e)))
            return
        free = [s for s in self._slots if s.job is None and (job.id_slot is None or s.id == job.id_slot)]
        busy = [s.id for s in self._slots if s.job is not None]
        prefixes = {s.id: common_prefix(s.tokens, job.prompt) for s in free}

        def choice(s: Slot) -> tuple[int, int, int, float]:
            # a prefix under prefix_share of the prompt saves less than a step of two ubatches costs
            prefix = prefixes[s.id]
            worth = prefix if self.prefix_share > 0 and prefix >= self.prefix_share * len(job.prompt) else 0
            return worth, -id_runs([*busy, s.id]), prefix, -s.last_used

        slot = max(free, key=choice)
        prefix = prefixes[slot.id]
        keep = min(prefix, len(job.prompt) - 1) if job.cache_prompt else 0  # one token gives the logits
        scored: list[TokenLogprob] = []
        if job.prompt_logprobs is not None:
            t_scored = time.perf_counter()
            try:
                scored = self._score_prompt(slot, job)
            except (_llama.LlamaError, ValueError) as e:
                sampler.free()
                self._end(job, Failed(f"the prompt could not be scored: {e}"))
                return
            keep = len(slot.tokens)
        elif keep < len(slot.tokens):
            try:
                self.ctx.truncate(keep, slot.id)
            except _llama.LlamaError:  # memories that cannot drop a suffix (recurrent) start over
                self.ctx.truncate(0, slot.id)
                keep = 0
            del slot.tokens[keep:]
        slot.job, slot.task, slot.state = job, job, SlotState.PREFILL
        slot.pending = list(job.prompt[keep:])
        slot.cached, slot.evaluated, slot.tokens_sent, slot.has_new_line = keep, 0, 0, False
        slot.text = TextStream(functools.partial(self.model.detokenize_bytes, unparse_special=job.special_text),
                               job.stop)
        slot.sent = 0
        slot.logprob_rows = None if job.logprobs is None else LogprobRows(
            self._piece, sum(len(r.text) for r in scored))
        slot.sampler = sampler
        slot.n_sampled, slot.continues = 0, False
        slot.sampler.accept(job.prompt)  # penalties and DRY count the prompt, as Llama does
        if self.backend_sampling and job.logprobs is None:
            self.ctx.set_backend_sampler(slot.id, slot.sampler)  # llama.cpp may keep it on the CPU
        slot.t_admitted, slot.t_prompt_start = time.perf_counter(), None
        slot.n_requests += 1
        slot.n_prompt_cached += keep
        if job.prompt_logprobs is not None:  # evaluated, not reused; its rows ahead of the generated tokens' text
            slot.cached, slot.evaluated, slot.t_prompt_start = 0, keep, t_scored
            slot.n_prompt_cached -= keep
            slot.n_prompt_evaluated += keep
            self._emit(job, Delta("", tuple(scored), slot=slot.id))

    def _piece(self, tok: int) -> str:
        """A token's text in a logprobs row (invalid UTF-8 dropped, as llama-cpp-python does)."""
        return self.model.detokenize_bytes([tok]).decode("utf-8", "ignore")

    def _score_prompt(self, slot: Slot, job: Job) -> list[TokenLogprob]:
        """echo with logprobs: the whole prompt evaluated into the slot from its start, an output at every token,
        each token after the first scored from the row before it (Context.decode_logprobs). The slot then holds
        the prompt but its last token, which the job's first step evaluates again for its logits (a memory
        that cannot drop it starts over, and the step evaluates the whole prompt)."""
        assert job.prompt_logprobs is not None
        self.ctx.truncate(0, slot.id)
        slot.tokens.clear()
        try:
            scored = self.ctx.decode_logprobs(job.prompt, job.prompt_logprobs, seq_id=slot.id)
        except BaseException:
            self.ctx.truncate(0, slot.id)
            raise
        try:
            self.ctx.truncate(len(job.prompt) - 1, slot.id)
            slot.tokens.extend(job.prompt[:-1])
        except _llama.LlamaError:
            self.ctx.truncate(0, slot.id)
        return prompt_logprob_rows(job.prompt, scored, self._piece, self.model.token_bos)

    def _fail_step(self, items: list[tuple[Slot, Job, Any, bool]], error: Exception) -> None:
        """A llama_decode of items failed: end the requests of its slots that still hold them, then publish."""
        for s, job, _, _ in items:
            if s.job is job:
                self._fail(s, f"decode failed: {error}")
        self._publish()

    def _step_ended(self, items: list[tuple[Slot, Job, list[int], bool]], next_running: bool = False) -> None:
        """The step of items is off the devices: its slots are free to change, the samplers of those released
        while it ran are freed (next_running: a chained step runs already)."""
        for s, _, _, _ in items:
            s.in_step = False
        self._free_released(next_running)

    def _free_released(self, running: bool) -> None:
        """Free the released slots' samplers that can go now: all while no step runs, else those outside the
        graph (a chain in it waits: _chainable ends the running step apart for it)."""
        keep = []
        for smp in self._free_after_step:
            if running and smp.on_backend:
                keep.append(smp)
            else:
                smp.free()
        self._free_after_step = keep

    def _take(self, s: Slot, job: Job, tok: int, now: float) -> None:
        """A sampled token of the slot, before its text: whether the slot decodes it in the next step (the
        order of Llama.generate: end-of-generation, then the limits; stop strings come with the text)."""
        if s.state is SlotState.PREFILL:
            s.state, s.t_prompt_end = SlotState.GENERATE, now
        eog = self.model.is_eog(tok)
        s.n_sampled += not eog
        s.continues = not eog and self._within_limits(job, s.n_sampled, len(s.tokens))
        if s.continues:
            s.next_token = tok

    def _within_limits(self, job: Job, n_sampled: int, n_cached: int) -> bool:
        """Whether a slot whose job sampled n_sampled tokens (not counting end-of-generation ones) and whose cache
        holds n_cached decodes its last token: below max_tokens, and room in the slot's context for that token and
        the next one, so that prompt and completion fill the slot at most (llama-server's and llama-cpp-python's
        cap; the last token is sent, not decoded)."""
        return (job.max_tokens is None or n_sampled < job.max_tokens) and n_cached + 1 < self.n_ctx_slot

    def _stream(self, outs: list[tuple[Slot, Job, tuple[int, float | None, Any], float]]) -> None:
        """The text of sampled tokens, in order: emitted as it becomes final; a request ends at an
        end-of-generation token, a stop string, or the limit _take found. A request that ended is in a
        snapshot published here (not only at the end of the next step, which may never come)."""
        n_jobs = sum(s.job is not None for s in self._slots)
        for s, job, (tok, logprob, top), now in outs:
            if s.job is not job:  # cancelled, or ended by the shutdown's grace period
                continue
            assert s.text is not None
            if job.max_tokens == 0:  # the prompt is in the cache: nothing to generate
                self._finish(s, "length", now)
                continue
            eog = self.model.is_eog(tok)
            if s.logprob_rows is not None and not eog:
                s.logprob_rows.add(tok, (logprob, top))
            if eog:
                self._finish(s, "stop", now)
                continue
            s.n_generated += 1
            ready = s.text.push(tok)
            if ready:
                s.sent += len(ready)
                s.has_new_line = s.has_new_line or "\n" in ready
                tokens = tuple(s.text.tokens[s.tokens_sent:])
                s.tokens_sent = len(s.text.tokens)
                self._emit(job, Delta(ready, tuple(s.logprob_rows.take(s.sent)) if s.logprob_rows else (), tokens,
                                      s.id))
            if s.text.stopped:
                self._finish(s, "stop", now)
            elif not s.continues:
                self._finish(s, "length", now)
        if sum(s.job is not None for s in self._slots) != n_jobs:
            self._publish()

    def _finish(self, s: Slot, reason: str, now: float) -> None:
        job = s.job
        assert job is not None and s.text is not None
        if s.state is SlotState.PREFILL:  # the shutdown's grace ended before the prompt did
            s.t_prompt_end = now
        prompt_start = s.t_prompt_start if s.t_prompt_start is not None else s.t_prompt_end
        evaluated = len(job.prompt) - s.cached - len(s.pending)
        timings = Timings(cache_n=s.cached, prompt_n=evaluated, prompt_ms=1e3 * (s.t_prompt_end - prompt_start),
                          predicted_n=len(s.text.tokens), predicted_ms=1e3 * (now - s.t_prompt_end),
                          queue_ms=1e3 * (s.t_admitted - job.submitted))
        usage = Usage(prompt_tokens=len(job.prompt), cached_tokens=s.cached, completion_tokens=len(s.text.tokens))
        tail = s.text.finish()
        s.has_new_line = s.has_new_line or "\n" in tail
        rows = tuple(s.logprob_rows.take(s.sent + len(tail), final=True)) if s.logprob_rows else ()
        tokens = tuple(s.text.tokens[s.tokens_sent:])
        s.tokens_sent = len(s.text.tokens)
        self._release(s)
        s.last_timings = timings
        d = self._done
        self._done = replace(d, requests=d.requests + 1, prompt_seconds=d.prompt_seconds + timings.prompt_ms / 1e3,
                             timed_prompt_tokens=d.timed_prompt_tokens + timings.prompt_n,
                             predicted_tokens=d.predicted_tokens + timings.predicted_n,
                             predicted_seconds=d.predicted_seconds + timings.predicted_ms / 1e3)
        log.info("%s slot %d: prompt %d tokens (%d cached, %d evaluated, %.1f ms, %.1f t/s), generated %d "
                 "(%.1f ms, %.1f t/s), queued %.1f ms, finish %s", job.id, s.id, usage.prompt_tokens,
                 timings.cache_n, timings.prompt_n, timings.prompt_ms, timings.prompt_per_second,
                 timings.predicted_n, timings.predicted_ms, timings.predicted_per_second, timings.queue_ms, reason)
        self._end(job, Done(tail, reason, usage, timings, rows, tokens, s.id, s.text.stop_word, len(s.tokens)))

    def _fail(self, s: Slot, message: str) -> None:
        """The job fails and the slot forgets its cache (a failed decode leaves it unknown)."""
        job = s.job
        self.ctx.truncate(0, s.id)
        s.tokens.clear()
        self._release(s)
        if job is not None:
            log.error("%s slot %d: %s", job.id, s.id, message)
            self._end(job, Failed(message))

    def _end_grace(self, now: float, taken: list[Job]) -> None:
        """The shutdown's grace period is over: running jobs end with what they have, waiting ones (taken:
        those just taken from the queue) fail."""
        with self._lock:
            waiting = taken + list(self._waiting)
            self._waiting.clear()
        running = [s for s in self._slots if s.job is not None]
        if running or waiting:
            log.info("the grace period is over: ending %d requests, failing %d waiting", len(running), len(waiting))
        for s in running:
            self._finish(s, "length", now)
        for job in waiting:
            self._end(job, Failed(SHUTTING_DOWN, stopped=True))

    def _release(self, s: Slot) -> None:
        if s.sampler is not None:
            if s.in_step or (s.sampler.on_backend and self._running is not None):
                self._free_after_step.append(s.sampler)  # see _free_released
            else:
                s.sampler.free()  # out of the graph too
        s.job, s.state, s.pending, s.sampler, s.last_used = None, SlotState.IDLE, [], None, time.perf_counter()

    def _release_cancelled(self) -> None:
        """Free the slots of cancelled jobs; what they evaluated stays cached."""
        for s in self._slots:
            job = s.job
            if job is not None and job.cancelled:
                log.info("%s slot %d: cancelled after %d prompt tokens and %d generated", job.id, s.id,
                         len(job.prompt) - len(s.pending), len(s.text.tokens) if s.text else 0)
                self._release(s)
                self._end(job, None)

    def _end(self, job: Job, event: Done | Failed | None) -> None:
        """The job leaves the engine, with its last event (None: cancelled, nobody listens)."""
        if event is not None:
            self._emit(job, event)
        with self._lock:
            self._n_jobs -= 1

    def _emit(self, job: Job, event: Event) -> None:
        try:
            job.emit(event)
        except Exception:  # the receiver is gone (its event loop closed): nobody waits for the job
            job.cancelled = True
