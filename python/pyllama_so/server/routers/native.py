"""llama-server's native generation, tokenizer and template endpoints on the engine (tools/server/README.md of
the pinned tree): POST /completion (and /completions), /infill, /tokenize, /detokenize and /apply-template.

A /completion request becomes a Job through the same make_job and Run as /v1/completions (jobs.py), with
llama-server's fields: prompt as a text, token ids or both mixed (texts tokenized with special tokens
parsed, BOS before a leading text), n_predict, n_probs, cache_prompt, id_slot, logit_bias in its forms.
The answer is llama-server's object (content, stop, stop_type, stopping_word, tokens_predicted,
tokens_evaluated, tokens_cached, generation_settings, timings, completion_probabilities, ...); streamed,
one `data: {...}` event per piece of text (content, tokens, stop: false), then the final object with stop:
true and empty content, and no [DONE]. /apply-template answers the prompt a chat completion would generate
from.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from pyllama_so import _llama
from pyllama_so.generation.logprobs import TokenLogprob
from pyllama_so.server import errors
from pyllama_so.server.chat import render, with_tools
from pyllama_so.server.engine import Delta, Done, Engine
from pyllama_so.server.errors import ApiError
from pyllama_so.server.infill import Chunk, infill_tokens, missing_fim_tokens
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
from pyllama_so.server.native_schemas import (
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
    bias_value,
)
from pyllama_so.server.prompts import checked_ids, mixed_tokens, nonempty
from pyllama_so.server.routers.state import ChatDep, EngineDep, SettingsDep
from pyllama_so.server.schemas import ChatTemplateRequest
from pyllama_so.server.settings import ServerSettings
from pyllama_so.tool_calls import uses_tools

PATHS = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/apply-template"})

router = APIRouter()


def resolve_logit_bias(model: _llama.Model, value: list[Any] | dict[str, Any] | None) -> dict[int, float] | None:
    """llama-server's logit_bias forms to {token id: bias}: [[token, bias], ...] or {token: bias}, a token an
    id (a decimal key in the object form) or a text whose every token gets the bias, a bias a number or false
    (-inf). A malformed entry is a 400 (llama-server skips it); ids are checked with the sampling parameters
    (make_job)."""
    if value is None:
        return None

    def tokens(token: Any) -> list[int]:
        if isinstance(token, int) and not isinstance(token, bool):
            return [token]
        if isinstance(token, str):
            if token.strip().lstrip("-").isdigit():
                return [int(token)]
            return model.tokenize(token, add_special=False, parse_special=False).tolist()
        raise ValueError(f"logit_bias: a token must be an id or a text, not {token!r}")

    pairs = value.items() if isinstance(value, dict) else value
    out: dict[int, float] = {}
    try:
        for pair in pairs:
            if not isinstance(value, dict) and not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"logit_bias: each entry must be a [token, bias] pair, not {pair!r}")
            token, bias = pair
            for t in tokens(token):
                out[t] = bias_value(bias)
    except ValueError as e:
        raise ApiError(400, str(e), param="logit_bias") from None
    return out


def probabilities(model: _llama.Model, rows: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """completion_probabilities: each token's id, text (its piece, an incomplete UTF-8 end dropped), bytes and
    logprob, and its top_logprobs alike; the logprobs are log-softmax of the raw logits (no sampler applied)."""
    def entry(token: int, logprob: float | None) -> dict[str, Any]:
        piece = model.token_to_piece(token, special=True)
        return {"id": token, "token": piece.decode("utf-8", "ignore"), "bytes": list(piece), "logprob": logprob}
    return [{**entry(r.token, r.logprob),
             "top_logprobs": [entry(t, lp) for t, (_, lp) in zip(r.top_tokens, r.top, strict=True)]}
            for r in rows]


def pick(out: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """llama-server's response_fields: "a/b" picks out["a"]["b"], named "a/b"; a missing one is left out."""
    picked: dict[str, Any] = {}
    for path in paths:
        node: Any = out
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            picked[path] = node
    return picked


def _sse(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False)}


async def complete(body: NativeCompletionRequest, request: Request, prompts: list[list[int]], engine: Engine,
                   settings: ServerSettings) -> Any:
    """The answer to a /completion or /infill request of prompts: llama-server's object for each choice of each
    prompt (an array of them for several), or their stream."""
    model, defaults = engine.model, settings.defaults
    grammar = await run_in_threadpool(request_grammar, model, body)
    logit_bias = await run_in_threadpool(resolve_logit_bias, model, body.logit_bias)
    if body.id_slot < -1 or body.id_slot >= engine.n_slots:
        raise ApiError(400, f"id_slot must be -1 (any slot) or in [0, {engine.n_slots}), got {body.id_slot}",
                       param="id_slot")
    n_predict = body.n_predict_given
    if n_predict is None or n_predict == -1:  # llama-server: -1 takes the server's -n
        n_predict = -1 if defaults.n_predict is None else defaults.n_predict
    cid = f"cmpl-{uuid.uuid4().hex}"

    n_choices = body.n_choices
    check_n(engine, n_choices)
    if n_choices * len(prompts) > 1 and body.id_slot != -1:
        raise ApiError(400, "several completions need a slot each: leave id_slot out", param="id_slot")

    def make(prompt: list[int], choice: int) -> Any:
        return lambda emit: make_job(engine, body, prompt, emit, None if n_predict == -1 else n_predict, cid,
                                     grammar, defaults=defaults, logit_bias=logit_bias, choice=choice,
                                     id_slot=None if body.id_slot == -1 else body.id_slot,
                                     cache_prompt=body.cache_prompt)

    runs = start_runs(engine, [make(p, c) for p in prompts for c in range(n_choices)], "prompt")
    prompt_texts = [model.detokenize_bytes(p, unparse_special=True).decode("utf-8", "replace") for p in prompts]
    want_probs = runs[0].job.logprobs is not None

    def final(i: int, text: str, done: Done, tokens: list[int], rows: Sequence[TokenLogprob]) -> dict[str, Any]:
        u = done.usage
        limited = done.finish_reason == "length"
        out: dict[str, Any] = {
            "index": i, "content": text, "tokens": tokens, "id_slot": done.slot, "stop": True,
            "model": settings.model_id, "tokens_predicted": u.completion_tokens, "tokens_evaluated": u.prompt_tokens,
            "generation_settings": runs[i].job.settings, "prompt": prompt_texts[i // n_choices],
            "has_new_line": "\n" in text,
            # the slot's context ended the generation (not n_predict)
            "truncated": limited and (n_predict == -1 or u.completion_tokens < n_predict),
            "stop_type": "limit" if limited else "word" if done.stopping_word else "eos",
            "stopping_word": done.stopping_word, "tokens_cached": done.n_cached,
            "timings": done.timings.as_dict()}
        if want_probs and not body.stream:
            out["completion_probabilities"] = probabilities(model, rows)
        return out if body.response_fields is None else pick(out, body.response_fields)

    if not body.stream:
        results = await collect_all(runs, request)
        if results is None:
            return {}  # the client is gone
        outs = [final(i, text, done, run.tokens if body.return_tokens else [], run.logprobs)
                for i, (run, (text, done)) in enumerate(zip(runs, results, strict=True))]
        return outs[0] if len(outs) == 1 else outs  # llama-server: an array of results for several
    return stream(runs, model, prompts, n_choices, final, settings.stream_grace)


def stream(runs: Sequence[Run], model: _llama.Model, prompts: Sequence[list[int]], n_choices: int,
           final: Callable[[int, str, Done, list[int], Sequence[TokenLogprob]], dict[str, Any]],
           stream_grace: float) -> EventSourceResponse:
    """llama-server's stream of the runs (n_choices of each prompt): a partial object per piece, each choice's
    final one (from final) at its end; stream_grace: how long the stream outlives a shutdown's start."""
    want_probs = runs[0].job.logprobs is not None

    async def events() -> AsyncIterator[dict[str, str]]:
        predicted = [0] * len(runs)

        def partial(i: int, event: Delta | Done) -> dict[str, Any]:
            predicted[i] += len(event.tokens)
            chunk: dict[str, Any] = {"index": i, "content": event.text, "tokens": list(event.tokens),
                                     "stop": False, "id_slot": event.slot, "tokens_predicted": predicted[i],
                                     "tokens_evaluated": len(prompts[i // n_choices])}
            if want_probs and event.logprobs:
                chunk["completion_probabilities"] = probabilities(model, event.logprobs)
            return chunk

        try:
            async for i, event in merged(runs):
                if isinstance(event, Delta):
                    yield _sse(partial(i, event))
                elif isinstance(event, Done):
                    if event.text or event.tokens:  # the text held back until the end
                        yield _sse(partial(i, event))
                    yield _sse(final(i, "", event, [], ()))
                else:
                    e = failure(event)
                    yield _sse(errors.native_error_body(e.status, e.message, e.code))
        finally:
            cancel_all(runs)

    return EventSourceResponse(events(), background=BackgroundTask(cancel_all, runs), sep="\n",
                               shutdown_grace_period=stream_grace)


async def completion(body: NativeCompletionRequest, request: Request, engine: EngineDep, settings: SettingsDep) -> Any:
    model = engine.model
    prompts = [nonempty(await run_in_threadpool(mixed_tokens, model, one, add_special=True, parse_special=True,
                                                param="prompt"), "prompt") for one in body.prompts]
    return await complete(body, request, prompts, engine, settings)


router.post("/completion", response_model=None)(completion)
router.post("/completions", response_model=None)(completion)


@router.post("/infill", response_model=None)
async def infill(body: InfillRequest, request: Request, engine: EngineDep, settings: SettingsDep) -> Any:
    model, defaults = engine.model, settings.defaults
    missing = missing_fim_tokens(model)
    if missing:  # llama-server's answer (the body's fields were checked before)
        raise ApiError(501, "Infill is not supported by this model: " + " ".join(missing), code="not_supported")

    def tokens() -> list[int]:
        def part(value: str | list[int | str], param: str) -> list[int]:
            return mixed_tokens(model, value, add_special=False, parse_special=False, param=param)
        n_predict = -1 if defaults.n_predict is None else defaults.n_predict
        return infill_tokens(model, part(body.input_prefix, "input_prefix"), part(body.input_suffix, "input_suffix"),
                             model.tokenize(body.prompt, add_special=False, parse_special=True).tolist(),
                             [Chunk(c.text, c.filename) for c in body.input_extra], n_batch=engine.n_batch,
                             n_ctx=engine.n_ctx_slot, n_predict=n_predict)

    return await complete(body, request, [await run_in_threadpool(tokens)], engine, settings)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    model = engine.model
    if body.content is None:
        return {"tokens": []}
    ids = await run_in_threadpool(mixed_tokens, model, body.content, add_special=body.add_special,
                                  parse_special=body.parse_special, param="content")
    if not body.with_pieces:
        return {"tokens": ids}

    def piece(token: int) -> str | list[int]:  # a piece that is not valid UTF-8 as its bytes
        raw = model.token_to_piece(token, special=True)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)
    return {"tokens": [{"id": t, "piece": piece(t)} for t in ids]}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, engine: EngineDep) -> dict[str, str]:
    model = engine.model
    ids = checked_ids(model, body.tokens, "tokens")
    # each token's piece with special tokens rendered, joined (llama-server's tokens_to_str)
    text = await run_in_threadpool(lambda: model.detokenize_pieces(ids, special=True))
    return {"content": text.decode("utf-8", "replace")}


@router.post("/apply-template")
async def apply_template(body: ChatTemplateRequest, engine: EngineDep, chat: ChatDep) -> dict[str, Any]:
    """llama-server's: the prompt the chat template makes of the messages (with tools: the chat layer's, as
    a chat completion would generate from), without generating."""
    if uses_tools(body.tools, body.tool_choice):
        return {"prompt": (await with_tools(engine.model, chat, body)).prompt}
    return {"prompt": await render(chat, body)}
