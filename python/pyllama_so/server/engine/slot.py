"""A slot: one sequence of the context and the request it runs; what /slots shows of it (SlotView), and what
the scheduler reads of it (SlotInfo)."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyllama_so import _llama
from pyllama_so.generation.logprobs import LogprobRows
from pyllama_so.generation.text import TextStream
from pyllama_so.server.engine.job import Job, Timings


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

    def info(self) -> SlotInfo:
        """The slot as the scheduler reads it."""
        job = self.job
        return SlotInfo(self.id, self.state, self.tokens, len(self.pending),
                        self.state is SlotState.GENERATE and self.continues, self.t_admitted, self.last_used,
                        job is not None and job.cancelled, job is not None and job.max_tokens is None)

    def release(self, retired: RetiredSamplers) -> None:
        """Let go of the job; the cache keeps what it evaluated, the sampler goes now or when no step needs it."""
        if self.sampler is not None:
            retired.add(self.sampler, self.in_step)
        self.job, self.state, self.pending, self.sampler = None, SlotState.IDLE, [], None
        self.last_used = time.perf_counter()


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """What the scheduler reads of a slot: plain data, built by the engine thread for one plan."""

    id: int
    state: SlotState = SlotState.IDLE
    tokens: Sequence[int] = ()  # what its cache holds (the slot's own list: read while the plan is made)
    pending: int = 0  # prompt tokens still to evaluate
    goes_on: bool = False  # it generates, and decodes its last sampled token next
    t_admitted: float = 0.0
    last_used: float = 0.0
    cancelled: bool = False  # its job was cancelled: the slot is released before new jobs are placed
    unbounded: bool = False  # its job has no max_tokens: it asked for up to the end of the context

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE


class RetiredSamplers:
    """The samplers of released slots that a step still needs: the step a slot is in samples with its chain when it
    ends, and a chain in the decode graph (backend sampling) leaves it only while the context runs nothing."""

    def __init__(self) -> None:
        self._waiting: list[_llama.Sampler] = []
        self.step_running = False  # kept by the executor: a step is on the devices

    def add(self, sampler: _llama.Sampler, in_step: bool) -> None:
        """A released slot's sampler: freed now (out of the graph too) unless a step still needs it."""
        if in_step or (sampler.on_backend and self.step_running):
            self._waiting.append(sampler)
        else:
            sampler.free()

    def free(self, step_running: bool) -> None:
        """Free those that can go now: all while no step runs, else those outside the graph (one in it waits: a step
        ends apart from the next for it, see in_graph)."""
        keep = []
        for smp in self._waiting:
            if step_running and smp.on_backend:
                keep.append(smp)
            else:
                smp.free()
        self._waiting = keep

    @property
    def in_graph(self) -> bool:
        """One waits to leave the decode graph: the next step may not start in the call that ends this one."""
        return any(smp.on_backend for smp in self._waiting)
