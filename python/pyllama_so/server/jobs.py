"""A request's engine Job, submitted from the event loop, and its events: what the OpenAI endpoints and
llama-server's native ones share.

make_job() checks a request's sampling fields and builds its Job; Run submits it and hands the engine
thread's events to the event loop through an asyncio queue. A client that goes away cancels its job: a
stream when sse-starlette sees the disconnect, a non-streamed request when the poll of
Request.is_disconnected() does (every DISCONNECT_POLL_S seconds).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from fastapi import Request

from pyllama_so import _llama
from pyllama_so.generation.logprobs import TokenLogprob
from pyllama_so.grammar import GrammarError, GrammarSpec
from pyllama_so.server.engine import Delta, Done, Engine, EngineStopped, Event, Failed, Job, PromptError, QueueFull
from pyllama_so.server.errors import CONTEXT_EXCEEDED, ApiError
from pyllama_so.server.schemas import GenerationRequest
from pyllama_so.server.settings import ServerDefaults, generation_settings

DISCONNECT_POLL_S = 0.25


def check_n(engine: Engine, n: int) -> None:
    """A request's n: 400 beyond the slots, where its choices could not all run together."""
    if not 1 <= n <= engine.n_slots:
        raise ApiError(400, f"n must be in [1, {engine.n_slots}] (the server's slots), got {n}", param="n")


def cancel_all(runs: Sequence[Run]) -> None:
    for run in runs:
        run.cancel()


def start_runs(engine: Engine, makes: Sequence[Callable[[Callable[[Event], None]], Job]],
               prompt_param: str) -> list[Run]:
    """A request's choices, a Run of each make: all queued, or none (a failed submit cancels those before it)."""
    runs: list[Run] = []
    try:
        for make in makes:
            runs.append(Run(engine, make, prompt_param))
    except BaseException:
        cancel_all(runs)
        raise
    return runs


async def collect_all(runs: Sequence[Run], request: Request) -> list[tuple[str, Done]] | None:
    """Every run's text and Done, or None when the client left (all cancelled)."""
    try:
        results = await asyncio.gather(*(run.collect(request) for run in runs))
    finally:
        cancel_all(runs)
    done = [r for r in results if r is not None]
    return done if len(done) == len(results) else None


async def merged(runs: Sequence[Run]) -> AsyncIterator[tuple[int, Event]]:
    """The events of several runs as they come, each with the index of its run, until every run has ended."""
    queue: asyncio.Queue[tuple[int, Event | None]] = asyncio.Queue()

    async def pump(i: int, run: Run) -> None:
        async for event in run:
            await queue.put((i, event))
        await queue.put((i, None))

    pumps = [asyncio.ensure_future(pump(i, run)) for i, run in enumerate(runs)]
    try:
        left = len(runs)
        while left:
            i, event = await queue.get()
            if event is None:
                left -= 1
            else:
                yield i, event
    finally:
        for p in pumps:
            p.cancel()


class Run:
    """A job submitted from the event loop; its events arrive through an asyncio queue. make(emit) builds
    the Job (its checks raise ApiError before anything is queued); prompt_param names the request field
    of the prompt in a 400."""

    def __init__(self, engine: Engine, make: Callable[[Callable[[Event], None]], Job], prompt_param: str) -> None:
        loop = asyncio.get_running_loop()
        self.engine = engine
        self.events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # on the engine's thread
            loop.call_soon_threadsafe(self.events.put_nowait, event)

        self.job = make(emit)
        self.ended = False
        prompt = self.job.prompt
        try:
            engine.submit(self.job)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry later", code="queue_full") from None
        except EngineStopped as e:
            raise ApiError(503, str(e), code="unavailable") from None
        except PromptError as e:
            raise ApiError(400, str(e), param=prompt_param, code=CONTEXT_EXCEEDED if e.too_long else None,
                           details={"n_prompt_tokens": len(prompt), "n_ctx": engine.n_ctx_slot} if e.too_long
                           else None) from None

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self.ended:
            event = await self.events.get()
            self.ended = not isinstance(event, Delta)
            yield event

    def cancel(self) -> None:
        """Free the job's slot or queue place (a client left); nothing once it ended."""
        if not self.ended:
            self.engine.cancel(self.job)

    async def collect(self, request: Request) -> tuple[str, Done] | None:
        """All the text and the Done event; None when the client disconnects first (the job is cancelled).
        Afterwards logprobs holds every token's logprobs and tokens every generated token, in order."""
        result = asyncio.ensure_future(self._gather())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
            return result.result() if result.done() else None
        finally:
            result.cancel()
            gone.cancel()
            self.cancel()

    async def _gather(self) -> tuple[str, Done]:
        parts: list[str] = []
        self.logprobs: list[TokenLogprob] = []  # every Delta's and the Done's, in order
        self.tokens: list[int] = []
        async for event in self:
            if isinstance(event, Failed):
                raise failure(event)
            parts.append(event.text)
            self.logprobs += event.logprobs
            self.tokens += event.tokens
            if isinstance(event, Done):
                return "".join(parts), event
        raise AssertionError("a job's events end with Done or Failed")


def make_job(engine: Engine, body: GenerationRequest, prompt: list[int], emit: Callable[[Event], None],
             max_tokens: int | None, job_id: str, grammar: GrammarSpec | None, *,
             defaults: ServerDefaults = ServerDefaults(), extra_stops: Sequence[str] = (),
             logit_bias: Mapping[int, float] | None = None, choice: int = 0, **job: Any) -> Job:
    """The request's Job, its sampling parameters checked here, before it is queued: a value out of range
    (or a logit_bias id outside the vocabulary) is a 400 naming the field. grammar: request_grammar's;
    defaults: the server's, for the fields the request leaves out; logit_bias: instead of the request's
    own (a native request's, resolved to token ids); choice: the index of one of the request's n choices, whose
    seed, where one is given, is the request's plus choice; job: more Job fields (id_slot, cache_prompt, ...).
    The Job's settings are llama-server's generation settings of the request, whatever its route (/slots
    shows them)."""
    try:
        sampling = body.sampling(defaults.sampling(), logit_bias)
        if choice and sampling.seed is not None and sampling.seed != -1:
            sampling = dataclasses.replace(sampling, seed=(sampling.seed + choice) % 2**32)
        n_logprobs = _llama.check_logprobs(body.n_logprobs, body.logprobs_param)
        sampling = sampling.checked(engine.model.n_vocab)  # logit_bias ids, with no chain built: the engine builds it
    except ValueError as e:
        message = str(e)
        param = next((f for f in type(body).model_fields if message.startswith(f)), None)
        raise ApiError(400, message, param=param) from None
    stops = body.stops() + [s for s in extra_stops if s not in body.stops()]  # the chat template's turn end
    ignore_eos = ignore_eos_of(body, defaults)
    settings = generation_settings(sampling, n_predict=-1 if max_tokens is None else max_tokens, stop=stops,
                                   stream=body.stream, n_probs=n_logprobs or 0, ignore_eos=ignore_eos,
                                   grammar=grammar, backend_sampling=engine.backend_sampling)
    return Job(prompt, emit, max_tokens=max_tokens, sampling=sampling, seed=sampling.seed, stop=stops,
               grammar=grammar, logprobs=n_logprobs, ignore_eos=ignore_eos, id=job_id, settings=settings, **job)


def ignore_eos_of(body: GenerationRequest, defaults: ServerDefaults) -> bool:
    """The request's ignore_eos, or the server's --ignore-eos where it leaves the field out."""
    return body.ignore_eos if "ignore_eos" in body.model_fields_set else defaults.ignore_eos


def failure(event: Failed) -> ApiError:
    if event.stopped:
        return ApiError(503, event.message, code="unavailable")
    return ApiError(500, event.message, code="generation_failed")


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (Starlette sees the disconnect only when asked)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


def request_grammar(model: _llama.Model, body: GenerationRequest) -> GrammarSpec | None:
    """The request's grammar (grammar, json_schema or response_format), converted and parsed for model's
    vocabulary: a bad one is a 400 with llama.cpp's message before any job is queued."""
    try:
        text = body.grammar_text()
        if text is not None:
            _llama.check_grammar(model, text)
    except GrammarError as e:
        raise ApiError(400, str(e), param=e.param) from None
    except ValueError as e:
        raise ApiError(400, str(e), param=body.grammar_param) from None
    return text
