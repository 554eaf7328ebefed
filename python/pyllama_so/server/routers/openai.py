"""OpenAI's completion and chat endpoints: POST /v1/completions and /v1/chat/completions (chat also under
llama-server's alias /chat/completions).

Handlers tokenize, submit a Job (jobs.py) and turn its events into OpenAI's response objects, streamed as
server-sent events with `stream: true`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from pyllama_so.generation.limits import max_tokens_limit
from pyllama_so.generation.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from pyllama_so.server import errors
from pyllama_so.server.chat import render, with_tools
from pyllama_so.server.engine import Delta, Done, Engine, Event
from pyllama_so.server.errors import ApiError
from pyllama_so.server.jobs import (
    Run,
    cancel_all,
    check_n,
    collect_all,
    failure,
    make_job,
    merged,
    request_grammar,
    start_runs,
)
from pyllama_so.server.prompts import checked_ids
from pyllama_so.server.routers.state import ChatDep, EngineDep, SettingsDep
from pyllama_so.server.schemas import ChatRequest, CompletionRequest, GenerationRequest
from pyllama_so.server.settings import FINGERPRINT, ServerDefaults
from pyllama_so.tool_calls import ToolCallStream, finish_reason, parse_message, uses_tools

router = APIRouter()


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


def token_limit(body: CompletionRequest | ChatRequest, defaults: ServerDefaults) -> int | None:
    """The request's max_tokens, else the server's -n when given, by Llama's rule (0 or less: up to the end
    of the slot's context)."""
    if defaults.n_predict is not None and not {"max_tokens", "max_completion_tokens"} & body.model_fields_set:
        return max_tokens_limit(defaults.n_predict)
    return body.token_limit


def start_choices(engine: Engine, defaults: ServerDefaults, body: GenerationRequest, prompts: Sequence[list[int]],
                  max_tokens: int | None, cid: str, grammar: str | dict[str, Any] | None, prompt_param: str,
                  extra_stops: Sequence[str] = (), **job: Any) -> list[Run]:
    """The request's n choices of each prompt, queued: choice c of prompt p at index p * n + c."""
    check_n(engine, body.n)

    def make(prompt: list[int], choice: int) -> Callable[[Callable[[Event], None]], Any]:
        return lambda emit: make_job(engine, body, prompt, emit, max_tokens, cid, grammar, defaults=defaults,
                                     extra_stops=extra_stops, choice=choice, **job)
    return start_runs(engine, [make(p, c) for p in prompts for c in range(body.n)], prompt_param)


def stream_choices(runs: Sequence[Run], body: GenerationRequest, stream_grace: float,
                   chunk: Callable[..., dict[str, Any]], first: Callable[[int], list[dict[str, Any]]],
                   delta: Callable[[str], Any], last: Callable[[str], Any],
                   logprobs: Callable[[Sequence[TokenLogprob]], Any],
                   tools: Sequence[ToolCallStream] | None = None) -> EventSourceResponse:
    """SSE: each choice's first chunks, a chunk per Delta, its last chunk with the finish reason and timings
    (choices interleaved as their tokens come, each chunk naming its index), then the usage chunk when
    asked (stream_options.include_usage), [DONE]. A client that leaves cancels the jobs. tools: each
    choice's parse into content and tool calls, which gives its deltas instead of delta and last (a piece
    that makes nothing certain yet gives no chunk; a choice that called a tool ends with "tool_calls").
    stream_grace: how long the stream outlives a shutdown's start."""

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


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, engine: EngineDep,
                      settings: SettingsDep) -> dict[str, Any] | EventSourceResponse:
    model, model_id = engine.model, settings.model_id
    prompts = []
    for one in body.prompts:
        if isinstance(one, str):
            if not one:  # it would tokenize to BOS alone
                raise ApiError(400, "the prompt is empty", param="prompt")
            # special-token text is parsed, as llama-server does
            prompts.append((await run_in_threadpool(model.tokenize, one, parse_special=True)).tolist())
        else:
            prompts.append(checked_ids(model, one, "prompt"))
    echoes = [model.detokenize_bytes(p).decode("utf-8", "replace") if body.echo else "" for p in prompts]
    grammar = await run_in_threadpool(request_grammar, model, body)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    # echo with logprobs: each prompt token's too, ahead of the generated ones' (llama-cpp-python's format)
    defaults = settings.defaults
    started = start_choices(engine, defaults, body, prompts, token_limit(body, defaults), cid, grammar, "prompt",
                            prompt_logprobs=body.logprobs if body.echo else None)

    def choice(text: str, finish: str | None, lps: Any, index: int) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": lps or None, "finish_reason": finish}

    def chunk(text: str, finish: str | None, lps: Any = None, index: int = 0, **extra: Any) -> dict[str, Any]:
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                "choices": [choice(text, finish, lps, index)], "system_fingerprint": FINGERPRINT, **extra}

    def echo(i: int) -> str:
        return echoes[i // body.n]

    if body.stream:
        return stream_choices(started, body, settings.stream_grace, chunk,
                              lambda i: [chunk(echo(i), None, index=i)] if body.echo else [],
                              delta=str, last=str, logprobs=completion_logprobs)
    results = await collect_all(started, request)
    if results is None:
        return {}  # the client is gone
    choices = [choice(echo(i) + text, done.finish_reason,
                      completion_logprobs(run.logprobs) if run.job.logprobs is not None else None, i)
               for i, (run, (text, done)) in enumerate(zip(started, results, strict=True))]
    dones = [done for _, done in results]
    return {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices,
            "system_fingerprint": FINGERPRINT, "usage": _usage(dones, body.n), "timings": dones[0].timings.as_dict()}


@router.post("/v1/chat/completions", response_model=None)
@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request, engine: EngineDep, chat: ChatDep,
                           settings: SettingsDep) -> dict[str, Any] | EventSourceResponse:
    model, model_id = engine.model, settings.model_id
    tc = await with_tools(model, chat, body) if uses_tools(body.tools, body.tool_choice) else None
    text = await render(chat, body) if tc is None else tc.prompt
    # a Jinja template writes the BOS itself where it wants one; llama.cpp's built-ins leave it to the tokenizer,
    # and so does the chat layer (it takes the template's BOS off where the vocabulary adds one)
    bos = chat.add_bos if tc is None else True
    prompt = await run_in_threadpool(lambda: model.tokenize(text, add_special=bos, parse_special=True).tolist())
    grammar = await run_in_threadpool(request_grammar, model, body) if tc is None else tc.grammar
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    stops = list(chat.stops) if tc is None else [*chat.stops, *tc.stops]
    defaults = settings.defaults
    started = start_choices(engine, defaults, body, [prompt], token_limit(body, defaults), cid, grammar, "messages",
                            stops, special_text=tc is not None)

    def chunk(delta: dict[str, Any], finish: str | None, lps: Any = None, index: int = 0,
              **extra: Any) -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                "choices": [{"index": index, "delta": delta, "logprobs": lps or None, "finish_reason": finish}],
                "system_fingerprint": FINGERPRINT, **extra}

    if body.stream:
        return stream_choices(started, body, settings.stream_grace, chunk,
                              lambda i: [chunk({"role": "assistant", "content": ""}, None, index=i)],
                              delta=lambda t: {"content": t}, last=lambda t: {"content": t} if t else {},
                              logprobs=chat_logprobs,
                              tools=None if tc is None else [ToolCallStream(tc.parser) for _ in started])
    results = await collect_all(started, request)
    if results is None:
        return {}
    messages = [{"role": "assistant", "content": content} if tc is None
                else await run_in_threadpool(parse_message, tc.parser, content) for content, _ in results]
    choices = [{"index": i, "message": message,
                "logprobs": chat_logprobs(run.logprobs) if run.job.logprobs is not None else None,
                "finish_reason": finish_reason("tool_calls" in message, done.finish_reason)}
               for i, (run, message, (_, done)) in enumerate(zip(started, messages, results, strict=True))]
    dones = [done for _, done in results]
    return {"id": cid, "object": "chat.completion", "created": created, "model": model_id,
            "system_fingerprint": FINGERPRINT, "choices": choices, "usage": _usage(dones, body.n),
            "timings": dones[0].timings.as_dict()}
