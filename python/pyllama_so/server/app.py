"""The HTTP side: OpenAI's completion and chat endpoints, /v1/models, /health and /slots over an Engine.

Handlers tokenize, submit a Job and turn its events into OpenAI's response objects, streamed as
server-sent events with `stream: true`. The engine's thread hands events to the event loop through an
asyncio queue per request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from pyllama_so.server import errors
from pyllama_so.server import embeddings as embedding_routes
from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.engine import Delta, Done, Engine, EngineStopped, Event, Failed, Job, PromptError, QueueFull
from pyllama_so.server.errors import ApiError
from pyllama_so.server.schemas import ChatRequest, CompletionRequest, GenerationRequest

PUBLIC_PATHS = frozenset({"/health"})  # answered without the API key


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
                 prompt_param: str, job_id: str) -> None:
        loop = asyncio.get_running_loop()
        self.engine = engine
        self.events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # on the engine's thread
            loop.call_soon_threadsafe(self.events.put_nowait, event)

        self.job = Job(prompt, emit, max_tokens=max_tokens, sampling=body.sampling(), seed=body.seed,
                       stop=body.stops(), id=job_id)
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
        parts: list[str] = []
        getter = asyncio.ensure_future(self.events.get())
        try:
            while True:
                finished, _ = await asyncio.wait({getter}, timeout=1.0)
                if not finished:
                    if await request.is_disconnected():
                        return None
                    continue
                event = getter.result()
                if isinstance(event, Delta):
                    parts.append(event.text)
                    getter = asyncio.ensure_future(self.events.get())
                    continue
                self.ended = True
                if isinstance(event, Failed):
                    raise ApiError(500, event.message, code="generation_failed")
                parts.append(event.text)
                return "".join(parts), event
        finally:
            getter.cancel()
            self.cancel()


def _usage(done: Done) -> dict[str, Any]:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _sse(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def create_app(engine: Engine, *, model_id: str, chat: ChatTemplate, api_key: str | None = None,
               model_meta: dict[str, Any] | None = None,
               embeddings: embedding_routes.EmbeddingService | None = None) -> FastAPI:
    """The FastAPI app serving engine's model as model_id (embeddings: the --embeddings service)."""
    app = FastAPI(title="pyllama_so", summary="OpenAI-compatible server over llama.cpp")
    errors.install(app)
    embedding_routes.install(app, embeddings, model_id)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key)
    started = int(time.time())
    model = engine.model
    n_vocab = model.n_vocab

    def stream(run: Run, body: GenerationRequest, chunk: Callable[..., dict[str, Any]], first: list[dict[str, Any]],
               delta: Callable[[str], Any], last: Callable[[str], Any]) -> EventSourceResponse:
        """SSE: the first chunks, a chunk per Delta, the last chunk with the finish reason and timings, the
        usage chunk when asked (stream_options.include_usage), [DONE]. A client that leaves cancels the job."""

        async def events() -> AsyncIterator[dict[str, str]]:
            try:
                for c in first:
                    yield _sse(c)
                async for event in run:
                    if isinstance(event, Delta):
                        yield _sse(chunk(delta(event.text), None))
                    elif isinstance(event, Done):
                        yield _sse(chunk(last(event.text), event.finish_reason, timings=event.timings.as_dict()))
                        if body.include_usage:
                            yield _sse({**chunk(delta(""), None), "choices": [], "usage": _usage(event)})
                    else:
                        yield _sse(errors.error_body(500, event.message, code="generation_failed"))
                yield {"data": "[DONE]"}
            finally:
                run.cancel()

        # the background task also cancels a job whose stream never started (a client gone at once)
        return EventSourceResponse(events(), background=BackgroundTask(run.cancel))

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.running:
            return JSONResponse({"status": "error", "error": str(engine.error or "the engine stopped")},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/slots")
    async def slots() -> dict[str, Any]:
        return engine.snapshot()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        meta = {"n_ctx_slot": engine.n_ctx_slot, "n_slots": len(engine.slots), "n_vocab": n_vocab,
                "chat_template": chat.source, **(model_meta or {})}
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                            "owned_by": "pyllama_so", "meta": meta}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        if isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], str)):
            text = body.prompt if isinstance(body.prompt, str) else str(body.prompt[0])
            prompt = await run_in_threadpool(lambda: model.tokenize(text).tolist())
        else:
            prompt = [int(t) for t in body.prompt]
            bad = [t for t in prompt if not 0 <= t < n_vocab]
            if bad:
                raise ApiError(400, f"token id {bad[0]} out of range [0, {n_vocab})", param="prompt")
        echo = model.detokenize_bytes(prompt).decode("utf-8", "replace") if body.echo else ""
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        run = Run(engine, body, prompt, body.max_tokens, "prompt", cid)

        def chunk(text: str, finish: str | None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}], **extra}

        if body.stream:
            return stream(run, body, chunk, [chunk(echo, None)] if echo else [], delta=str, last=str)
        result = await run.collect(request)
        if result is None:
            return {}  # the client is gone
        text, done = result
        return chunk(echo + text, done.finish_reason, usage=_usage(done), timings=done.timings.as_dict())

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = chat.format(messages)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        prompt = await run_in_threadpool(lambda: model.tokenize(text, parse_special=True).tolist())
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        run = Run(engine, body, prompt, body.token_limit, "messages", cid)

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}

        if body.stream:
            return stream(run, body, chunk, [chunk({"role": "assistant", "content": ""}, None)],
                          delta=lambda t: {"content": t}, last=lambda t: {"content": t} if t else {})
        result = await run.collect(request)
        if result is None:
            return {}
        content, done = result
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                             "finish_reason": done.finish_reason}],
                "usage": _usage(done), "timings": done.timings.as_dict()}

    return app
