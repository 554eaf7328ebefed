"""What the engine runs and what it answers: a Job, the events it emits (Delta, Done, Failed) and the
errors submit() raises."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyllama_so.generation.logprobs import TokenLogprob
from pyllama_so.sampling import SamplingParams

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


def emit(job: Job, event: Event) -> None:
    """Hand the job's receiver an event (on the engine thread)."""
    try:
        job.emit(event)
    except Exception:  # the receiver is gone (its event loop closed): nobody waits for the job
        job.cancelled = True
