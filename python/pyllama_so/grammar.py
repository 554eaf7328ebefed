"""Grammars for constrained generation: GBNF text handed to llama.cpp's grammar sampler, written by hand or
made from a JSON schema by llama.cpp's own converter (common/json-schema-to-grammar.cpp, compiled from the
pinned tree).

`LlamaGrammar` has llama-cpp-python's constructors, so `grammar=LlamaGrammar.from_string(...)` and
`LlamaGrammar.from_json_schema(...)` work unchanged; a plain GBNF string is accepted wherever a grammar is.
GBNF text is parsed by llama.cpp when a sampler is built: a grammar it rejects is a ValueError with the
parser's message. A schema the converter rejects is a ValueError with the converter's message.

`response_format` is read as llama-server reads it (tools/server/server-common.cpp of the pin):
`{"type": "json_object"}` is any JSON object, `{"type": "json_object", "schema": {...}}` (llama-cpp-python's
shape) and `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}` (OpenAI's) follow the
schema, `{"type": "text"}` constrains nothing. An empty schema means any object, as there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyllama_so import _llama

# what a Sampler takes as a grammar: GBNF text, or a tool call's whole grammar spec (ToolCallGrammar.spec)
GrammarSpec = str | dict[str, Any]


class GrammarError(ValueError):
    """A grammar, JSON schema or response_format that cannot be used; param names the argument."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class LlamaGrammar:
    """GBNF grammar text and its root rule."""

    def __init__(self, grammar: str, root: str = "root") -> None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("a grammar must be non-empty GBNF text")
        self.grammar = grammar
        self.root = root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"grammar file not found: {path}")
        return cls(path.read_text(encoding="utf-8"))

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = True) -> LlamaGrammar:
        """The grammar of a JSON schema, given as JSON text (llama-cpp-python's argument) or as a dict."""
        return cls(_llama.json_schema_to_grammar(json_schema))

    def __repr__(self) -> str:
        return f"LlamaGrammar({self.grammar[:40]!r}{'...' if len(self.grammar) > 40 else ''})"


class ToolCallGrammar(LlamaGrammar):
    """A tool call's grammar (pyllama_so.tool_calls, from llama.cpp's chat layer): GBNF text that waits for one
    of its triggers (lazy) or applies from the first token after accepting its prefill tokens."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec["grammar"])
        self.spec = dict(spec)


def grammar_text(grammar: str | LlamaGrammar | None) -> tuple[GrammarSpec | None, str]:
    """(GBNF text or None, root rule) of what a caller passed as grammar; a ToolCallGrammar's whole spec for
    the Sampler instead of its text."""
    if grammar is None:
        return None, "root"
    if isinstance(grammar, ToolCallGrammar):
        return grammar.spec, grammar.root
    if isinstance(grammar, LlamaGrammar):
        return grammar.grammar, grammar.root
    if isinstance(grammar, str):
        if not grammar.strip():
            raise GrammarError("grammar", "the GBNF text is empty")
        return grammar, "root"
    raise GrammarError("grammar", f"must be GBNF text or a LlamaGrammar, not {type(grammar).__name__}")


def schema_grammar(schema: Any, param: str) -> str:
    """The grammar of a request's JSON schema (a JSON object; an empty one means any object)."""
    if not isinstance(schema, Mapping):
        raise GrammarError(param, f"the JSON schema must be an object, not {type(schema).__name__}")
    try:
        return _llama.json_schema_to_grammar(dict(schema) or {"type": "object"})
    except ValueError as e:
        raise GrammarError(param, str(e)) from None


def response_format_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar of an OpenAI response_format (see the module's doc); None when it constrains nothing."""
    if response_format is None:
        return None
    param = "response_format"
    if not isinstance(response_format, Mapping):
        raise GrammarError(param, f"must be an object with a type, not {type(response_format).__name__}")
    kind = response_format.get("type", "")
    if kind in ("", "text"):
        return None
    if kind == "json_object":
        return schema_grammar(response_format.get("schema", {}), param)
    if kind == "json_schema":
        wrapper = response_format.get("json_schema", {})
        if not isinstance(wrapper, Mapping):
            raise GrammarError(f"{param}.json_schema", "must be an object with the schema under 'schema'")
        return schema_grammar(wrapper.get("schema", {}), f"{param}.json_schema.schema")
    raise GrammarError(param, f'type must be one of "text", "json_object" or "json_schema", got {kind!r}')


def resolve_grammar(grammar: str | LlamaGrammar | None = None, response_format: Mapping[str, Any] | None = None,
                    json_schema: Mapping[str, Any] | None = None) -> tuple[GrammarSpec | None, str]:
    """(GBNF text or None, root rule) of a request's grammar, JSON schema (llama-server's "json_schema"
    field) and response_format: at most one of them may constrain the output."""
    found: list[tuple[str, tuple[GrammarSpec, str]]] = []
    if grammar is not None:
        text, root = grammar_text(grammar)
        found.append(("grammar", (text or "", root)))
    if json_schema is not None:
        found.append(("json_schema", (schema_grammar(json_schema, "json_schema"), "root")))
    rf = response_format_grammar(response_format)
    if rf is not None:
        found.append(("response_format", (rf, "root")))
    if len(found) > 1:
        raise GrammarError(found[1][0], f"cannot be combined with {found[0][0]}: give one grammar, JSON schema "
                                        "or response_format")
    return found[0][1] if found else (None, "root")
