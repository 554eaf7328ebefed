"""Llama's chat completion: the messages through the chat template (with tools: llama.cpp's chat layer, its
grammar and parser), then create_completion, its result in OpenAI's chat shapes (responses.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyllama_so.generation import responses
from pyllama_so.grammar import ToolCallGrammar
from pyllama_so.tool_calls import ToolCallStream, finish_reason, parse_message, tool_chat, uses_tools

if TYPE_CHECKING:
    from pyllama_so.llama import Llama


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be a mapping with a 'role' string, got {m!r}")


def chat_completion(llm: Llama, messages: Sequence[Mapping[str, Any]], functions: Sequence[Mapping[str, Any]] | None,
                    function_call: str | Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]] | None,
                    tool_choice: str | Mapping[str, Any] | None, chat_template_kwargs: Mapping[str, Any] | None,
                    model: str | None, *, max_tokens: int | None, temperature: float, top_p: float, top_k: int,
                    min_p: float, stop: str | Sequence[str] | None, seed: int | None, stream: bool,
                    grammar: Any, response_format: Mapping[str, Any] | None, logprobs: bool | None,
                    top_logprobs: int | None, extra: dict[str, Any]) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """Llama.create_chat_completion's work (its docstring says what it does); extra: the create_completion
    arguments it passes on as they are."""
    check_messages(messages)
    if functions is not None or function_call is not None:
        legacy_tools, legacy_choice = responses.tools_from_functions(functions, function_call)
        tools = tools if tools is not None else legacy_tools
        tool_choice = tool_choice if tool_choice is not None else legacy_choice
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=True")
    extra = dict(extra, grammar=grammar, response_format=response_format,
                 logprobs=(top_logprobs or 0) if logprobs else None)
    template = llm.chat_template
    name = llm.model_path if model is None else model
    if uses_tools(tools, tool_choice):
        if grammar is not None or response_format is not None:
            raise ValueError("grammar or response_format cannot go with tools")
        return chat_with_tools(llm, template, messages, tools or [], tool_choice, chat_template_kwargs, name,
                               max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                               min_p=min_p, stop=stop, seed=seed, stream=stream, extra=extra)
    prompt = template.render(messages, add_generation_prompt=True, tools=tools, tool_choice=tool_choice,
                             **dict(chat_template_kwargs or {}))
    tokens = llm.tokenize(prompt, add_bos=template.add_bos, special=True)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    out = llm.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                min_p=min_p, stop=stops + [s for s in template.stops if s not in stops],
                                seed=seed, stream=stream, **extra)
    if isinstance(out, dict):  # not streamed
        return responses.chat_response(out, name)
    return responses.chat_chunks(out, name)


def chat_with_tools(llm: Llama, template: Any, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]],
                    tool_choice: Any, template_kwargs: Mapping[str, Any] | None, name: str, *,
                    max_tokens: int | None, temperature: float, top_p: float, top_k: int, min_p: float,
                    stop: str | Sequence[str] | None, seed: int | None, stream: bool,
                    extra: dict[str, Any]) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """create_chat_completion with tools, as llama-server's --jinja: llama.cpp's chat layer renders the
    messages and tools in the model's format, its grammar keeps a call well formed, and the text is parsed
    into the message's content and tool_calls (finish_reason "tool_calls"). A template that cannot express the
    tools is a UserWarning, or with a call required a ValueError (tool_calls.ToolChoiceError)."""
    text = getattr(template, "text", None)
    if text is None:
        raise ValueError(f"tools need a Jinja chat template; {template.name} (a llama.cpp built-in) cannot "
                         "render them (give chat_template= a Jinja text)")
    tc = tool_chat(llm.model, text, [dict(m) for m in messages], tools, tool_choice,
                   template_kwargs=template_kwargs, template_name=template.name)
    if tc.warning:
        warnings.warn(tc.warning, UserWarning, stacklevel=4)
    # the chat layer takes the template's BOS off where the vocabulary adds one: the tokenizer adds it
    tokens = llm.tokenize(tc.prompt, add_bos=True, special=True)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    stops += [s for s in (*template.stops, *tc.stops) if s not in stops]
    grammar = ToolCallGrammar(tc.grammar) if tc.grammar else None
    out = llm.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                min_p=min_p, stop=stops, seed=seed, stream=stream, **{**extra, "grammar": grammar})
    if not isinstance(out, dict):  # streamed
        return responses.tool_call_chunks(responses.chat_chunks(out, name), ToolCallStream(tc.parser))
    out = responses.chat_response(out, name)
    choice = out["choices"][0]
    choice["message"] = parse_message(tc.parser, choice["message"]["content"])
    choice["finish_reason"] = finish_reason("tool_calls" in choice["message"], choice["finish_reason"])
    return out
