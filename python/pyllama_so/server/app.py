"""The HTTP side: OpenAI's completion and chat endpoints, /v1/models, /health, /slots and llama-server's
/apply-template over an Engine.

Handlers tokenize, submit a Job and turn its events into OpenAI's response objects, streamed as
server-sent events with `stream: true`. The engine's thread hands events to the event loop through an
asyncio queue per request. A client that goes away cancels its job: a stream when sse-starlette sees the
disconnect, a non-streamed request when the poll of Request.is_disconnected() does (every
DISCONNECT_POLL_S seconds).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from pyllama_so import __version__, _llama
from pyllama_so._build_info import UPSTREAM_COMMIT
from pyllama_so.grammar import GrammarError
from pyllama_so.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from pyllama_so.server import errors
from pyllama_so.server import embeddings as embedding_routes
from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.engine import (SHUTTING_DOWN, Delta, Done, Engine, EngineStopped, Event, Failed, Job,
                                      PromptError, QueueFull)
from pyllama_so.server.errors import ApiError
from pyllama_so.server.schemas import ChatRequest, ChatTemplateRequest, CompletionRequest, GenerationRequest

PUBLIC_PATHS = frozenset({"/health"})  # answered without the API key
# OpenAI's system_fingerprint: this build (the package and the upstream commit it is built on)
FINGERPRINT = f"pyllama_so-{__version__}-{UPSTREAM_COMMIT[:9]}"
DISCONNECT_POLL_S = 0.25
# a stream outlives the engine's grace period by this much, so that its last chunk and [DONE] get out
STREAM_GRACE_MARGIN_S = 1.5


class ApiKeyMiddleware:
    """401 for a request without `Authorization: Bearer <key>` (pure ASGI, so streams pass untouched)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                response = errors.error_response(401, "invalid API key", code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Run:
    """A job submitted from the event loop; its events arrive through an asyncio queue."""

    def __init__(self, engine: Engine, body: GenerationRequest, prompt: list[int], max_tokens: int | None,
                 prompt_param: str, job_id: str, grammar: str | None = None, extra_stops: Sequence[str] = ()) -> None:
        loop = asyncio.get_running_loop()
        self.engine = engine
        self.events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # on the engine's thread
            loop.call_soon_threadsafe(self.events.put_nowait, event)

        self.job = _job(engine, body, prompt, emit, max_tokens, job_id, grammar, extra_stops)
        self.ended = False
        try:
            engine.submit(self.job)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry later", code="queue_full") from None
        except EngineStopped as e:
            raise ApiError(503, str(e), code="unavailable") from None
        except PromptError as e:
            too_long = len(prompt) > engine.n_ctx_slot
            raise ApiError(400, str(e), param=prompt_param,
                           code="context_length_exceeded" if too_long else None) from None

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
        """All the text and the Done event; None when the client disconnects first (the job is cancelled)."""
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
        async for event in self:
            if isinstance(event, Delta):
                parts.append(event.text)
                self.logprobs += event.logprobs
            elif isinstance(event, Failed):
                raise _failure(event)
            else:
                parts.append(event.text)
                self.logprobs += event.logprobs
                return "".join(parts), event
        raise AssertionError("a job's events end with Done or Failed")


def _job(engine: Engine, body: GenerationRequest, prompt: list[int], emit: Callable[[Event], None],
         max_tokens: int | None, job_id: str, grammar: str | None, extra_stops: Sequence[str] = ()) -> Job:
    """The request's Job, its sampling parameters checked here, before it is queued: a value out of range
    (or a logit_bias id outside the vocabulary) is a 400 naming the field. grammar: request_grammar's."""
    try:
        sampling = body.sampling()
        n_logprobs = _llama.check_logprobs(body.n_logprobs, "top_logprobs" if isinstance(getattr(body, "logprobs", None), bool)
                                           else "logprobs")
        _llama.Sampler(engine.model, sampling, n_ctx=engine.n_ctx_slot).free()  # logit_bias ids
    except ValueError as e:
        message = str(e)
        param = next((f for f in type(body).model_fields if message.startswith(f)), None)
        raise ApiError(400, message, param=param) from None
    stops = body.stops() + [s for s in extra_stops if s not in body.stops()]  # the chat template's turn end
    return Job(prompt, emit, max_tokens=max_tokens, sampling=sampling, seed=body.seed, stop=stops,
               grammar=grammar, logprobs=n_logprobs, ignore_eos=body.ignore_eos, id=job_id)


def _failure(event: Failed) -> ApiError:
    if event.stopped:
        return ApiError(503, event.message, code="unavailable")
    return ApiError(500, event.message, code="generation_failed")


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (Starlette sees the disconnect only when asked)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


def request_grammar(model: _llama.Model, body: GenerationRequest) -> str | None:
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


def _usage(done: Done) -> dict[str, Any]:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _sse(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def create_app(engine: Engine, *, model_id: str, chat: ChatTemplate, api_key: str | None = None,
               model_meta: dict[str, Any] | None = None, shutdown_grace: float = 5.0,
               embeddings: embedding_routes.EmbeddingService | None = None) -> FastAPI:
    """The FastAPI app serving engine's model as model_id. shutdown_grace: the seconds the engine gives
    requests after engine.drain() (streams stay open that long, and a little more for their last chunk);
    embeddings: the --embeddings service."""
    app = FastAPI(title="pyllama_so", summary="OpenAI-compatible server over llama.cpp")
    errors.install(app)
    embedding_routes.install(app, embeddings, model_id)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key)
    started = int(time.time())
    model = engine.model
    n_vocab = model.n_vocab

    def stream(run: Run, body: GenerationRequest, chunk: Callable[..., dict[str, Any]], first: list[dict[str, Any]],
               delta: Callable[[str], Any], last: Callable[[str], Any],
               logprobs: Callable[[Sequence[TokenLogprob]], Any]) -> EventSourceResponse:
        """SSE: the first chunks, a chunk per Delta, the last chunk with the finish reason and timings, the
        usage chunk when asked (stream_options.include_usage), [DONE]. A client that leaves cancels the job."""

        want = run.job.logprobs is not None

        async def events() -> AsyncIterator[dict[str, str]]:
            try:
                for c in first:
                    yield _sse(c)
                async for event in run:
                    if isinstance(event, Delta):
                        yield _sse(chunk(delta(event.text), None, lps=want and logprobs(event.logprobs)))
                    elif isinstance(event, Done):
                        yield _sse(chunk(last(event.text), event.finish_reason, lps=want and logprobs(event.logprobs),
                                         timings=event.timings.as_dict()))
                        if body.include_usage:
                            yield _sse({**chunk(delta(""), None), "choices": [], "usage": _usage(event)})
                    else:
                        e = _failure(event)
                        yield _sse(errors.error_body(e.status, e.message, code=e.code))
                yield {"data": "[DONE]"}
            finally:
                run.cancel()

        # the background task also cancels a job whose stream never started (a client gone at once);
        # at a shutdown sse-starlette would cancel the stream at once: it waits for the engine instead
        return EventSourceResponse(events(), background=BackgroundTask(run.cancel),
                                   shutdown_grace_period=shutdown_grace + STREAM_GRACE_MARGIN_S)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.running:
            return JSONResponse({"status": "error", "error": str(engine.error or "the engine stopped")},
                                status_code=503)
        if not engine.accepting:
            return JSONResponse({"status": "error", "error": SHUTTING_DOWN}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/slots")
    async def slots() -> dict[str, Any]:
        return engine.snapshot().as_dict()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        # the template itself (a Jinja text, or the name of a llama.cpp built-in) and where it came from
        meta = {"n_ctx_slot": engine.n_ctx_slot, "n_slots": engine.n_slots, "n_vocab": n_vocab,
                "chat_template": getattr(chat, "text", None) or getattr(chat, "builtin", chat.name),
                "chat_template_source": chat.name, **(model_meta or {})}
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                            "owned_by": "pyllama_so", "meta": meta}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        if isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], str)):
            text = body.prompt if isinstance(body.prompt, str) else str(body.prompt[0])
            if not text:  # it would tokenize to BOS alone
                raise ApiError(400, "the prompt is empty", param="prompt")
            prompt = await run_in_threadpool(lambda: model.tokenize(text).tolist())
        else:
            prompt = [int(t) for t in body.prompt]
            bad = [t for t in prompt if not 0 <= t < n_vocab]
            if bad:
                raise ApiError(400, f"token id {bad[0]} out of range [0, {n_vocab})", param="prompt")
        echo = model.detokenize_bytes(prompt).decode("utf-8", "replace") if body.echo else ""
        grammar = await run_in_threadpool(request_grammar, model, body)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        run = Run(engine, body, prompt, body.token_limit, "prompt", cid, grammar)

        def chunk(text: str, finish: str | None, lps: Any = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                    "choices": [{"text": text, "index": 0, "logprobs": lps or None, "finish_reason": finish}],
                    "system_fingerprint": FINGERPRINT, **extra}

        if body.stream:
            return stream(run, body, chunk, [chunk(echo, None)] if echo else [], delta=str, last=str,
                          logprobs=completion_logprobs)
        result = await run.collect(request)
        if result is None:
            return {}  # the client is gone
        text, done = result
        lps = completion_logprobs(run.logprobs) if run.job.logprobs is not None else None
        return chunk(echo + text, done.finish_reason, lps, usage=_usage(done), timings=done.timings.as_dict())

    async def render(body: ChatTemplateRequest) -> str:
        """The chat prompt of a request; 400 naming the template when it fails to render the messages."""
        try:
            return await run_in_threadpool(body.render, chat)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None

    @app.post("/apply-template")
    async def apply_template(body: ChatTemplateRequest) -> dict[str, Any]:
        """llama-server's: the prompt the chat template makes of the messages, without generating."""
        return {"prompt": await render(body)}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        text = await render(body)
        # a Jinja template writes the BOS itself where it wants one; llama.cpp's built-ins leave it to the tokenizer
        prompt = await run_in_threadpool(
            lambda: model.tokenize(text, add_special=chat.add_bos, parse_special=True).tolist())
        grammar = await run_in_threadpool(request_grammar, model, body)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        run = Run(engine, body, prompt, body.token_limit, "messages", cid, grammar, extra_stops=chat.stops)

        def chunk(delta: dict[str, Any], finish: str | None, lps: Any = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                    "choices": [{"index": 0, "delta": delta, "logprobs": lps or None, "finish_reason": finish}],
                    "system_fingerprint": FINGERPRINT, **extra}

        if body.stream:
            return stream(run, body, chunk, [chunk({"role": "assistant", "content": ""}, None)],
                          delta=lambda t: {"content": t}, last=lambda t: {"content": t} if t else {},
                          logprobs=chat_logprobs)
        result = await run.collect(request)
        if result is None:
            return {}
        content, done = result
        lps = chat_logprobs(run.logprobs) if run.job.logprobs is not None else None
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": lps,
                             "finish_reason": done.finish_reason}],
                "usage": _usage(done), "timings": done.timings.as_dict()}

    return app
