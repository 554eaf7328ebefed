"""Tool calls in a chat, as llama-server makes them with --jinja: llama.cpp's chat layer (common/chat.cpp of the
pinned tree, bound in _llama.chat_tools_apply / chat_tools_parse) renders the chat with its tools in the
model's own format, gives the grammar that keeps a call well formed (lazy under tool_choice "auto": it
applies from the format's trigger, e.g. "<tool_call>", on), and parses the generated text into content and
tool calls, whole or as a stream of OpenAI deltas.

Beyond llama-server: tool_choice "required" or a named function gets a grammar that starts with the call (the
chat layer's own call rules as its root: no text may come first), so the answer is a call; a template in which
the chat layer finds no way to write a call cannot express tools, which is a ToolChoiceError when a call is
required and a warning (ToolChat.warning) otherwise, never a silent drop.

A chat without tools, or with tool_choice "none", is rendered by the chat template as before (Jinja2)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyllama_so import _llama

__all__ = ["ToolCallStream", "ToolChat", "ToolChoiceError", "finish_reason", "parse_message", "tool_chat",
           "uses_tools"]


def uses_tools(tools: Sequence[Any] | None, tool_choice: Any) -> bool:
    """Whether a request's tools take the tool-call path: some tools, and tool_choice other than "none"."""
    return bool(tools) and tool_choice != "none"


class ToolChoiceError(ValueError):
    """A tool_choice that cannot be met: not one OpenAI defines, a function not among the tools, or a call
    required of a template that cannot express tools (the server's 400 with param "tool_choice")."""


@dataclass(frozen=True)
class ToolChat:
    """A chat with tools, ready to generate: its prompt, the grammar for the Sampler (None for none), the stop
    strings the format adds, the parser of its output (for parse_message and ToolCallStream), and what the
    caller should warn of (the template cannot express the tools, or does not describe them), or None."""

    prompt: str
    format: str
    grammar: dict[str, Any] | None
    stops: tuple[str, ...]
    parser: dict[str, Any]
    warning: str | None = None


def _choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> tuple[str, list[Mapping[str, Any]]]:
    """OpenAI's tool_choice as llama.cpp's ("auto", "required", "none"): {"type": "function", "function":
    {"name": N}} requires a call of N, so only that tool is offered."""
    if tool_choice is None:
        return "auto", list(tools)
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required", "none"):
            raise ToolChoiceError(f'tool_choice must be "auto", "required", "none" or a function, got {tool_choice!r}')
        return tool_choice, list(tools)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, Mapping) else None
    if not isinstance(name, str):
        raise ToolChoiceError('tool_choice must be "auto", "required", "none" or {"type": "function", "function": '
                              '{"name": ...}}')
    chosen = [t for t in tools if isinstance(t, Mapping) and t.get("function", {}).get("name") == name]
    if not chosen:
        raise ToolChoiceError(f"tool_choice names {name!r}, which is not among the tools")
    return "required", chosen


def tool_chat(model: _llama.Model, template: str, messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]], tool_choice: Any = None, *, parallel_tool_calls: bool | None = None,
              add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None,
              template_name: str = "the chat template") -> ToolChat:
    """The prompt, grammar and parser of messages with tools, by llama.cpp's chat layer; template: the Jinja
    text of the chat template ("" for the model's own), template_name: what messages call it. ToolChoiceError
    when tool_choice cannot be met; ValueError when the chat layer refuses the request."""
    choice, offered = _choice(tool_choice, tools)
    request: dict[str, Any] = {"messages": list(messages), "tools": offered, "tool_choice": choice,
                               "add_generation_prompt": add_generation_prompt}
    if parallel_tool_calls is not None:
        request["parallel_tool_calls"] = parallel_tool_calls
    if template_kwargs:
        request["chat_template_kwargs"] = dict(template_kwargs)
    out = _llama.chat_tools_apply(model, request, template)
    calls = call_rules(out["parser"]["parser"])
    if not calls and choice == "required":
        raise ToolChoiceError(f"tool_choice {json.dumps(tool_choice, default=str)} needs a tool call, and "
                              f"{template_name} cannot express one: llama.cpp's chat layer finds no tool-call format "
                              "in it (give a chat template that writes tool calls)")
    grammar = None
    if out["grammar"]:
        grammar = {"grammar": out["grammar"], "lazy": out["grammar_lazy"], "trigger_patterns": out["trigger_patterns"],
                   "trigger_tokens": out["trigger_tokens"], "prefill": out["grammar_prefill"]}
        if choice == "required":
            grammar = _call_first(grammar, calls)
    return ToolChat(out["prompt"], out["format"], grammar, tuple(out["additional_stops"]), out["parser"],
                    _warning(template_name, offered, out["prompt"], bool(calls)))


def _warning(template_name: str, tools: Sequence[Mapping[str, Any]], prompt: str, writes_calls: bool) -> str | None:
    """What the caller should warn of: a template with no tool-call format (no call can come back), or one that
    leaves tools out of the prompt (the test llama.cpp's template caps make: a tool's name in the rendering)."""
    if not writes_calls:
        return (f"{template_name} cannot express tool calls (llama.cpp's chat layer finds no tool-call format in it): "
                "the tools are ignored and the answer is text")
    names = [str(t.get("function", {}).get("name")) for t in tools if isinstance(t, Mapping)]
    missing = [n for n in names if n not in prompt]
    if missing:
        return (f"{template_name} does not write these tools into the prompt: {', '.join(missing)}; the model "
                "knows them only through the grammar of a call")
    return None


def call_rules(parser: str) -> list[str]:
    """The rules of a tool call in a chat layer's parser (its saved PEG arena, JSON): the trigger rules (those a
    lazy grammar waits for) met first on the way from its root, sorted; [] for a format without calls."""
    if not parser:
        return []
    arena = json.loads(parser)
    nodes, rules = arena["parsers"], arena["rules"]
    found: set[str] = set()
    seen: set[int] = set()
    todo = [arena["root"]]
    while todo:
        i = todo.pop()
        if i in seen or not 0 <= i < len(nodes):  # the root of an empty arena is an invalid id
            continue
        seen.add(i)
        node = nodes[i]
        if node["type"] == "rule" and node["trigger"]:
            found.add(node["name"])
        elif node["type"] == "ref":
            todo.append(rules[node["name"]])
        else:
            todo.extend(node.get("children", ()))
            if "child" in node:
                todo.append(node["child"])
    return sorted(found)


_RULE_START = re.compile(r"^([a-zA-Z0-9-]+) ::= ", re.MULTILINE)
_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")


def _call_first(grammar: dict[str, Any], calls: Sequence[str]) -> dict[str, Any]:
    """The chat layer's grammar of a required call (which lets text come before the call) with its root replaced
    by the call rules: applied from the first token, no prefill. Unchanged when a rule is not in its text."""
    text = grammar["grammar"]
    calls = [_INVALID_RULE_CHARS.sub("-", c) for c in calls]  # as the grammar builder names a rule
    starts = sorted((m.start(), m.group(1)) for m in _RULE_START.finditer(text))
    defined = {name for _, name in starts}
    if "root" not in defined or not all(c in defined for c in calls):
        return grammar
    at = next(i for i, (_, name) in enumerate(starts) if name == "root")
    begin = starts[at][0]
    end = starts[at + 1][0] if at + 1 < len(starts) else len(text)
    rooted = text[:begin] + f"root ::= {' | '.join(calls)}\n" + text[end:]
    return {"grammar": rooted, "lazy": False, "trigger_patterns": [], "trigger_tokens": [], "prefill": []}


def finish_reason(called: bool, finish: str) -> str:
    """A generation's finish reason in a chat with tools, as llama-server gives it: "tool_calls" when the message
    called a tool and the generation ended by itself; a call cut by max_tokens stays "length"."""
    return "tool_calls" if called and finish == "stop" else finish


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_message(parser: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The assistant message of a whole generation in OpenAI's shape: content (None when it holds only tool
    calls) and tool_calls with their ids; text the parser cannot read stays content."""
    try:
        msg = _llama.chat_tools_parse(dict(parser), text, False)
    except ValueError:
        return {"role": "assistant", "content": text}
    calls = [{"id": _call_id(), "type": "function", "function": dict(c["function"])} for c in msg.get("tool_calls", [])]
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    return out


class ToolCallStream:
    """One choice's generation parsed as it streams: feed() each piece of text, finish() the rest; each gives
    the OpenAI delta of what became certain ({"content": ..., "tool_calls": [{"index", "id", "type",
    "function": {"name", "arguments"}}]}: a call's id, type and name once, then pieces of its arguments), or
    None when nothing did."""

    def __init__(self, parser: Mapping[str, Any]) -> None:
        self.parser = dict(parser)
        self.text = ""
        self.content = ""
        self.calls: list[dict[str, str]] = []  # id, name, arguments sent so far

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def feed(self, text: str) -> dict[str, Any] | None:
        self.text += text
        try:
            msg = _llama.chat_tools_parse(self.parser, self.text, True)
        except ValueError:
            return None  # not certain yet
        return self._delta(msg)

    def finish(self, text: str) -> dict[str, Any] | None:
        self.text += text
        try:
            msg = _llama.chat_tools_parse(self.parser, self.text, False)
        except ValueError:  # text the parser cannot read stays content
            msg = {"content": self.text}
        return self._delta(msg)

    def _delta(self, msg: Mapping[str, Any]) -> dict[str, Any] | None:
        delta: dict[str, Any] = {}
        content = msg.get("content") or ""
        if len(content) > len(self.content) and content.startswith(self.content):
            delta["content"] = content[len(self.content):]
            self.content = content
        calls = []
        for i, call in enumerate(msg.get("tool_calls", [])):
            name, args = call["function"]["name"], call["function"]["arguments"]
            entry: dict[str, Any] | None = None
            if i == len(self.calls):
                if not name:
                    break
                self.calls.append({"id": _call_id(), "name": name, "arguments": ""})
                entry = {"index": i, "id": self.calls[i]["id"], "type": "function",
                         "function": {"name": name, "arguments": ""}}
            sent = self.calls[i]["arguments"]
            if len(args) > len(sent) and args.startswith(sent):
                self.calls[i]["arguments"] = args
                if entry is None:
                    entry = {"index": i, "function": {"arguments": ""}}
                entry["function"]["arguments"] = args[len(sent):]
            if entry is not None:
                calls.append(entry)
        if calls:
            delta["tool_calls"] = calls
        return delta or None
