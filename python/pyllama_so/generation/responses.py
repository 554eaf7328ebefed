"""OpenAI's completion and chat objects in llama-cpp-python's shapes, as Llama returns them.

A completion is `text_completion` chunks (CompletionShape.chunk), merged into one response when not streamed.
Llama.create_chat_completion renders the messages with the chat template, runs create_completion on the
prompt's tokens and turns what comes back into `chat.completion` (or a stream of
`chat.completion.chunk`) objects: the id is the completion's prefixed with "chat" ("chatcmpl-..."), the
text is the assistant's message, and a stream starts with a chunk that carries the role only and ends
with one that carries the finish reason and an empty delta.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyllama_so.tool_calls import finish_reason


@dataclass(frozen=True)
class CompletionShape:
    """The `text_completion` objects of one completion: its id, creation time and model name."""

    model: str
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4()}")
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, text: str, finish: str | None, lps: dict[str, list[Any]] | None = None,
              **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}], **extra}


def merged_completion(chunks: Iterable[Mapping[str, Any]], model: str, logprobs: bool) -> dict[str, Any]:
    """A completion's chunks as the one response of a call without stream: the texts and logprobs joined, the
    last finish reason and usage (logprobs: the call asked for them, so an empty list is still a list)."""
    text, finish, cid, created, lps = "", None, "", 0, None
    usage: dict[str, Any] = {}
    for chunk in chunks:
        cid, created = chunk["id"], chunk["created"]
        choice = chunk["choices"][0]
        text += choice["text"]
        finish = choice["finish_reason"] or finish
        usage = chunk.get("usage", usage)
        if choice["logprobs"] is not None:
            lps = {k: (lps[k] if lps else []) + v for k, v in choice["logprobs"].items()}
    if logprobs and lps is None:
        lps = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}], "usage": usage}


def embedding_response(embeds: Sequence[Any], total: int, model: str) -> dict[str, Any]:
    """OpenAI's embedding response as llama-cpp-python builds it: a vector (or a list per token) per input, and
    total, the tokens embedded, as the usage."""
    return {"object": "list",
            "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
            "model": model, "usage": {"prompt_tokens": total, "total_tokens": total}}


def openai_chat_types() -> tuple[type, type]:
    """The openai package's ChatCompletion and ChatCompletionChunk (ImportError without it)."""
    try:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
    except ImportError:
        raise ImportError("create_chat_completion_openai_v1 needs the openai package: pip install openai") from None
    return ChatCompletion, ChatCompletionChunk


def as_openai(out: Any, types: tuple[type, type], stream: bool) -> Any:
    """A chat completion (a stream of chunks with stream) as the openai package's objects."""
    completion_type, chunk_type = types
    if stream:
        return (chunk_type(**chunk) for chunk in out)
    return completion_type(**out)


def chat_logprobs(logprobs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A completion's logprobs ({"tokens", "token_logprobs", "top_logprobs": [{token: logprob}]}) in the chat
    shape ({"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
    "refusal"})."""
    if logprobs is None:
        return None
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs["tokens"])
    content = [{"token": token, "logprob": logprob, "bytes": None,
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in (top or {}).items()]}
               for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], tops, strict=True)]
    return {"content": content, "refusal": None}


def chat_response(completion: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A create_completion result as a `chat.completion`."""
    choice = completion["choices"][0]
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                         "logprobs": chat_logprobs(choice.get("logprobs")), "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"]}


def _chunk(source: Mapping[str, Any], model: str, delta: dict[str, Any], finish: str | None,
           logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "chat" + source["id"], "object": "chat.completion.chunk", "created": source["created"],
            "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


def chat_chunks(chunks: Iterator[Mapping[str, Any]], model: str) -> Iterator[dict[str, Any]]:
    """create_completion's stream as `chat.completion.chunk` objects: the role first, a content delta per
    piece of text, the finish reason last (with an empty delta), so that the contents concatenate to the
    text of the non-streamed response."""
    first = True
    for chunk in chunks:
        if first:
            yield _chunk(chunk, model, {"role": "assistant"}, None)
            first = False
        choice = chunk["choices"][0]
        logprobs = chat_logprobs(choice.get("logprobs"))
        if choice["finish_reason"] is None:
            yield _chunk(chunk, model, {"content": choice["text"]}, None, logprobs)
            continue
        if choice["text"]:  # the text held back for stop strings comes with the last completion chunk
            yield _chunk(chunk, model, {"content": choice["text"]}, None, logprobs)
            logprobs = None
        yield _chunk(chunk, model, {}, choice["finish_reason"], logprobs)


def tool_call_chunks(chunks: Iterator[dict[str, Any]], parse: Any) -> Iterator[dict[str, Any]]:
    """chat_chunks of a chat with tools, their content deltas parsed as they come (parse: a
    pyllama_so.tool_calls.ToolCallStream): content and tool_calls deltas of what became certain, the finish
    reason "tool_calls" when the message called a tool (tool_calls.finish_reason)."""
    for chunk in chunks:
        choice = chunk["choices"][0]
        if "content" in choice["delta"]:
            delta = parse.feed(choice["delta"]["content"])
            if delta is not None:
                yield {**chunk, "choices": [{**choice, "delta": delta}]}
        elif choice["finish_reason"] is not None:
            rest = parse.finish("")
            if rest is not None:
                yield {**chunk, "choices": [{**choice, "delta": rest, "finish_reason": None}]}
            finish = finish_reason(parse.called, choice["finish_reason"])
            yield {**chunk, "choices": [{**choice, "finish_reason": finish}]}
        else:
            yield chunk


def tools_from_functions(functions: Sequence[Mapping[str, Any]] | None,
                         function_call: str | Mapping[str, Any] | None) -> tuple[list[dict[str, Any]] | None, Any]:
    """OpenAI's legacy functions / function_call as tools / tool_choice (as llama-cpp-python converts them)."""
    tools = None if functions is None else [{"type": "function", "function": dict(f)} for f in functions]
    choice: Any = None
    if isinstance(function_call, str) and function_call in ("none", "auto"):
        choice = function_call
    elif isinstance(function_call, Mapping) and "name" in function_call:
        choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, choice
