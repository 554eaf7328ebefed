"""The HTTP side over an Engine: OpenAI's completion and chat endpoints and /v1/models (chat and models also
under llama-server's aliases /chat/completions and /models), /health, llama-server's /apply-template, the
native and status routes of native.py and status.py, and the API key and CORS middleware.

Handlers tokenize, submit a Job (jobs.py) and turn its events into OpenAI's response objects, streamed as
server-sent events with `stream: true`. Errors have OpenAI's shape on the OpenAI routes and llama-server's
on its native ones (errors.py).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from pyllama_so import __version__, _llama
from pyllama_so._build_info import UPSTREAM_COMMIT
from pyllama_so.llama import max_tokens_limit
from pyllama_so.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from pyllama_so.server import embeddings as embedding_routes
from pyllama_so.server import errors, native, status
from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.cors import cors_options
from pyllama_so.server.engine import SHUTTING_DOWN, Delta, Done, Engine, Event
from pyllama_so.server.errors import ApiError
from pyllama_so.server.jobs import (Run, cancel_all, check_n, collect_all, failure, make_job, merged, request_grammar,
                                    start_runs)
from pyllama_so.server.prompts import checked_ids
from pyllama_so.server.schemas import ChatRequest, ChatTemplateRequest, CompletionRequest, GenerationRequest
from pyllama_so.server.settings import ServerDefaults
from pyllama_so.tool_calls import (ToolCallStream, ToolChat, ToolChoiceError, finish_reason, parse_message, tool_chat,
                                  uses_tools)

log = logging.getLogger("pyllama_so.server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})  # answered without the API key
# llama-server's own routes: their errors have its shape
NATIVE_PATHS = native.PATHS | status.PATHS | {"/apply-template", "/embedding", "/embeddings"}
# OpenAI's system_fingerprint and /props' build_info: this build (the package and its upstream commit)
FINGERPRINT = f"pyllama_so-{__version__}-{UPSTREAM_COMMIT[:9]}"
# a stream outlives the engine's grace period by this much, so that its last chunk and [DONE] get out
STREAM_GRACE_MARGIN_S = 1.5


class ApiKeyMiddleware:
    """401 for a request without the key, given as `Authorization: Bearer <key>` or `X-Api-Key: <key>` (as
    llama-server takes it); pure ASGI, so streams pass untouched."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    def _valid(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key):
            return True
        return hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS and not self._valid(dict(scope["headers"])):
            if scope["path"] in NATIVE_PATHS:
                response = JSONResponse({"error": {"code": 401, "message": "Invalid API Key",
                                                   "type": "authentication_error"}}, status_code=401)
            else:
                response = errors.error_response(401, "invalid API key", code="invalid_api_key")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class JsonBodyMiddleware:
    """llama-server reads every request body as JSON, whatever its Content-Type (`curl -d` sends
    application/x-www-form-urlencoded): a POST without a JSON Content-Type gets one, so FastAPI parses it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            kind = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
            if not (kind == b"application/json" or kind.endswith(b"+json")):
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _usage(dones: Sequence[Done], n: int = 1) -> dict[str, Any]:
    """A request's usage over its choices, n per prompt: each prompt once (as OpenAI counts it, with its first
    choice's cached tokens), the completions summed."""
    firsts = dones[::n]
    prompt = sum(d.usage.prompt_tokens for d in firsts)
    completion = sum(d.usage.completion_tokens for d in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(d.usage.cached_tokens for d in firsts)}}


def _sse(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def create_app(engine: Engine, *, model_id: str, chat: ChatTemplate, api_key: str | None = None,
               model_meta: dict[str, Any] | None = None, shutdown_grace: float = 5.0,
               embeddings: embedding_routes.EmbeddingService | None = None,
               defaults: ServerDefaults = ServerDefaults(), slots_endpoint: bool = True,
               metrics_endpoint: bool = False, cors_origins: str = "*") -> FastAPI:
    """The FastAPI app serving engine's model as model_id. shutdown_grace: the seconds the engine gives
    requests after engine.drain() (streams stay open that long, and a little more for their last chunk);
    embeddings: the --embeddings service; defaults: --temp, --seed, -n; slots_endpoint: /slots and /engine
    (--no-slots turns them off); metrics_endpoint: /metrics (--metrics); cors_origins: --cors-origins."""
    app = FastAPI(title="pyllama_so", summary="OpenAI-compatible server over llama.cpp")
    errors.install(app, NATIVE_PATHS)
    embedding_routes.install(app, embeddings, model_id)
    stream_grace = shutdown_grace + STREAM_GRACE_MARGIN_S
    native.install(app, engine, model_id=model_id, defaults=defaults, stream_grace=stream_grace)
    status.install(app, engine, model_id=model_id, chat=chat, defaults=defaults, build_info=FINGERPRINT,
                   slots_endpoint=slots_endpoint, metrics_endpoint=metrics_endpoint)
    app.add_middleware(JsonBodyMiddleware)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key)
    app.add_middleware(CORSMiddleware, **cors_options(cors_origins))  # outermost: a preflight needs no key
    started = int(time.time())
    model = engine.model

    def token_limit(body: CompletionRequest | ChatRequest) -> int | None:
        """The request's max_tokens, else the server's -n when given, by Llama's rule (0 or less: up to the end
        of the slot's context)."""
        if defaults.n_predict is not None and not {"max_tokens", "max_completion_tokens"} & body.model_fields_set:
            return max_tokens_limit(defaults.n_predict)
        return body.token_limit

    def runs(body: GenerationRequest, prompts: Sequence[list[int]], max_tokens: int | None, cid: str,
             grammar: str | dict[str, Any] | None, prompt_param: str, extra_stops: Sequence[str] = (),
             **job: Any) -> list[Run]:
        """The request's n choices of each prompt, queued: choice c of prompt p at index p * n + c."""
        check_n(engine, body.n)

        def make(prompt: list[int], choice: int) -> Callable[[Callable[[Event], None]], Any]:
            return lambda emit: make_job(engine, body, prompt, emit, max_tokens, cid, grammar, defaults=defaults,
                                         extra_stops=extra_stops, choice=choice, **job)
        return start_runs(engine, [make(p, c) for p in prompts for c in range(body.n)], prompt_param)

    def stream(runs: Sequence[Run], body: GenerationRequest, chunk: Callable[..., dict[str, Any]],
               first: Callable[[int], list[dict[str, Any]]], delta: Callable[[str], Any], last: Callable[[str], Any],
               logprobs: Callable[[Sequence[TokenLogprob]], Any],
               tools: Sequence[ToolCallStream] | None = None) -> EventSourceResponse:
        """SSE: each choice's first chunks, a chunk per Delta, its last chunk with the finish reason and timings
        (choices interleaved as their tokens come, each chunk naming its index), then the usage chunk when
        asked (stream_options.include_usage), [DONE]. A client that leaves cancels the jobs. tools: each
        choice's parse into content and tool calls, which gives its deltas instead of delta and last (a piece
        that makes nothing certain yet gives no chunk; a choice that called a tool ends with "tool_calls" unless
        max_tokens cut it)."""

        want = runs[0].job.logprobs is not None

        async def events() -> AsyncIterator[dict[str, str]]:
            dones: dict[int, Done] = {}
            try:
                for i in range(len(runs)):
                    for c in first(i):
                        yield _sse(c)
                async for i, event in merged(runs):
                    if isinstance(event, Delta):
                        # the parse of the text so far runs off the event loop (and without the GIL)
                        d = delta(event.text) if tools is None else await run_in_threadpool(tools[i].feed, event.text)
                        if d is not None or (want and event.logprobs):  # the piece's logprobs still go out
                            yield _sse(chunk({} if d is None else d, None, lps=want and logprobs(event.logprobs), index=i))
                    elif isinstance(event, Done):
                        dones[i] = event
                        finish = event.finish_reason
                        if tools is None:
                            d = last(event.text)
                        else:
                            d = await run_in_threadpool(tools[i].finish, event.text) or {}
                            finish = finish_reason(tools[i].called, finish)
                        yield _sse(chunk(d, finish, lps=want and logprobs(event.logprobs), index=i,
                                         timings=event.timings.as_dict()))
                    else:
                        e = failure(event)
                        yield _sse(errors.error_body(e.status, e.message, code=e.code))
                if body.include_usage and len(dones) == len(runs):
                    usage = _usage([dones[i] for i in range(len(runs))], body.n)
                    yield _sse({**chunk(delta(""), None), "choices": [], "usage": usage})
                yield {"data": "[DONE]"}
            finally:
                cancel_all(runs)

        # the background task also cancels jobs whose stream never started (a client gone at once);
        # at a shutdown sse-starlette would cancel the stream at once: it waits for the engine instead
        return EventSourceResponse(events(), background=BackgroundTask(cancel_all, runs),
                                   shutdown_grace_period=stream_grace)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> JSONResponse:
        if not engine.running:
            return JSONResponse({"status": "error", "error": str(engine.error or "the engine stopped")},
                                status_code=503)
        if not engine.accepting:
            return JSONResponse({"status": "error", "error": SHUTTING_DOWN}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        # the template itself (a Jinja text, or the name of a llama.cpp built-in) and where it came from
        meta = {"n_ctx_slot": engine.n_ctx_slot, "n_slots": engine.n_slots, "n_vocab": model.n_vocab,
                "chat_template": getattr(chat, "text", None) or getattr(chat, "builtin", chat.name),
                "chat_template_source": chat.name, **(model_meta or {})}
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                            "owned_by": "pyllama_so", "meta": meta}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        prompts = []
        for one in body.prompts:
            if isinstance(one, str):
                if not one:  # it would tokenize to BOS alone
                    raise ApiError(400, "the prompt is empty", param="prompt")
                # special-token text is parsed, as llama-server does
                prompts.append(await run_in_threadpool(lambda t=one: model.tokenize(t, parse_special=True).tolist()))
            else:
                prompts.append(checked_ids(model, one, "prompt"))
        echoes = [model.detokenize_bytes(p).decode("utf-8", "replace") if body.echo else "" for p in prompts]
        grammar = await run_in_threadpool(request_grammar, model, body)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        # echo with logprobs: each prompt token's too, ahead of the generated ones' (llama-cpp-python's format)
        started = runs(body, prompts, token_limit(body), cid, grammar, "prompt",
                       prompt_logprobs=body.logprobs if body.echo else None)

        def choice(text: str, finish: str | None, lps: Any, index: int) -> dict[str, Any]:
            return {"text": text, "index": index, "logprobs": lps or None, "finish_reason": finish}

        def chunk(text: str, finish: str | None, lps: Any = None, index: int = 0, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                    "choices": [choice(text, finish, lps, index)], "system_fingerprint": FINGERPRINT, **extra}

        def echo(i: int) -> str:
            return echoes[i // body.n]

        if body.stream:
            return stream(started, body, chunk, lambda i: [chunk(echo(i), None, index=i)] if body.echo else [],
                          delta=str, last=str, logprobs=completion_logprobs)
        results = await collect_all(started, request)
        if results is None:
            return {}  # the client is gone
        choices = [choice(echo(i) + text, done.finish_reason,
                          completion_logprobs(run.logprobs) if run.job.logprobs is not None else None, i)
                   for i, (run, (text, done)) in enumerate(zip(started, results))]
        dones = [done for _, done in results]
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices,
                "system_fingerprint": FINGERPRINT, "usage": _usage(dones, body.n), "timings": dones[0].timings.as_dict()}

    async def render(body: ChatTemplateRequest) -> str:
        """The chat prompt of a request; 400 naming the template when it fails to render the messages."""
        try:
            return await run_in_threadpool(body.render, chat)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None

    async def with_tools(body: ChatTemplateRequest) -> ToolChat:
        """The prompt, grammar and parser of a chat with tools (llama.cpp's chat layer, as llama-server's
        --jinja): a 400 for a template that is not Jinja, a grammar of the request's own beside them, or
        messages and tools the chat layer refuses. A request that generates gets its grammar checked too."""
        template = getattr(chat, "text", None)
        if template is None:
            raise ApiError(400, f"tools need a Jinja chat template; the server's is {chat.name}", param="tools")
        generates = isinstance(body, GenerationRequest)
        if generates and body.grammar_text() is not None:
            raise ApiError(400, "a grammar, json_schema or response_format cannot go with tools", param="tools")

        def prepare() -> ToolChat:
            tc = tool_chat(model, template, [m.variables() for m in body.messages], body.tools or [], body.tool_choice,
                           parallel_tool_calls=body.parallel_tool_calls, add_generation_prompt=body.add_generation_prompt,
                           template_kwargs=body.chat_template_kwargs, template_name=chat.name)
            if tc.warning:
                log.warning("%s", tc.warning)
            if generates and tc.grammar is not None:
                _llama.check_grammar(model, tc.grammar)  # before it is queued: the engine builds it with the slot's chain
            return tc
        try:
            return await run_in_threadpool(prepare)
        except ToolChoiceError as e:
            raise ApiError(400, str(e), param="tool_choice") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="tools") from None

    @app.post("/apply-template")
    async def apply_template(body: ChatTemplateRequest) -> dict[str, Any]:
        """llama-server's: the prompt the chat template makes of the messages (with tools: the chat layer's, as
        a chat completion would generate from), without generating."""
        if uses_tools(body.tools, body.tool_choice):
            return {"prompt": (await with_tools(body)).prompt}
        return {"prompt": await render(body)}

    @app.post("/v1/chat/completions", response_model=None)
    @app.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> dict[str, Any] | EventSourceResponse:
        tc = await with_tools(body) if uses_tools(body.tools, body.tool_choice) else None
        text = await render(body) if tc is None else tc.prompt
        # a Jinja template writes the BOS itself where it wants one; llama.cpp's built-ins leave it to the tokenizer,
        # and so does the chat layer (it takes the template's BOS off where the vocabulary adds one)
        bos = chat.add_bos if tc is None else True
        prompt = await run_in_threadpool(lambda: model.tokenize(text, add_special=bos, parse_special=True).tolist())
        grammar = await run_in_threadpool(request_grammar, model, body) if tc is None else tc.grammar
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        stops = list(chat.stops) if tc is None else [*chat.stops, *tc.stops]
        started = runs(body, [prompt], token_limit(body), cid, grammar, "messages", stops, special_text=tc is not None)

        def chunk(delta: dict[str, Any], finish: str | None, lps: Any = None, index: int = 0,
                  **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                    "choices": [{"index": index, "delta": delta, "logprobs": lps or None, "finish_reason": finish}],
                    "system_fingerprint": FINGERPRINT, **extra}

        if body.stream:
            return stream(started, body, chunk, lambda i: [chunk({"role": "assistant", "content": ""}, None, index=i)],
                          delta=lambda t: {"content": t}, last=lambda t: {"content": t} if t else {},
                          logprobs=chat_logprobs, tools=None if tc is None else [ToolCallStream(tc.parser) for _ in started])
        results = await collect_all(started, request)
        if results is None:
            return {}
        messages = [{"role": "assistant", "content": content} if tc is None
                    else await run_in_threadpool(parse_message, tc.parser, content) for content, _ in results]
        choices = [{"index": i, "message": message,
                    "logprobs": chat_logprobs(run.logprobs) if run.job.logprobs is not None else None,
                    "finish_reason": finish_reason("tool_calls" in message, done.finish_reason)}
                   for i, (run, message, (_, done)) in enumerate(zip(started, messages, results))]
        dones = [done for _, done in results]
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
                "system_fingerprint": FINGERPRINT, "choices": choices, "usage": _usage(dones, body.n),
                "timings": dones[0].timings.as_dict()}

    return app
