"""Chat messages to a prompt: a model's Jinja chat template rendered by Jinja2, or one of llama.cpp's built-ins.

A GGUF's `tokenizer.chat_template` is a Jinja template written for transformers. It is rendered here as
transformers and llama-cpp-python render it: Jinja2's ImmutableSandboxedEnvironment (a template cannot
reach Python internals nor mutate its inputs), trim_blocks and lstrip_blocks, the loop controls
extension (`{% break %}`), `{% generation %}` blocks kept as plain text, a `tojson` filter that keeps
non-ASCII characters and the key order, and the variables templates expect: `messages`,
`add_generation_prompt`, `bos_token`, `eos_token`, `tools`, `tool_choice`, `raise_exception(message)` and
`strftime_now(format)`.

llama.cpp's built-in templates (`chat_builtin_templates()`, formatted by llama_chat_apply_template in
C++) serve a model without a template, and anyone who asks for one by name. Jinja2 comes with the `chat`
extra; without it only the built-ins work.

A template that cannot be compiled or rendered is a ValueError naming the template (or ImportError when
Jinja2 is missing): never a silent fallback to another template.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pyllama_so import _llama

EXTRA = 'pip install "pyllama_so[chat]"'
DEFAULT_BUILTIN = "chatml"  # a model without a template: llama-server's fallback too

# llama-cpp-python's names for formats llama.cpp has under another name
_FORMAT_ALIASES = {"llama-2": "llama2", "llama-3": "llama3"}
# llama-cpp-python's name of the GGUF's own template, and the prefix of its named variants
MODEL_TEMPLATE_FORMAT = "chat_template.default"
_MODEL_VARIANT_PREFIX = "chat_template."

# what the render itself sets; chat_template_kwargs may not replace them
_RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "tool_choice",
                       "raise_exception", "strftime_now"})


def builtin_names() -> list[str]:
    """llama.cpp's built-in template names, then the llama-cpp-python spellings accepted for some of them."""
    return _llama.chat_builtin_templates() + list(_FORMAT_ALIASES)


def looks_like_jinja(text: str) -> bool:
    """A template text, as opposed to a name: it has a Jinja expression or statement."""
    return "{{" in text or "{%" in text


class ChatTemplate(abc.ABC):
    """Renders messages to a prompt. `name` says which template it is, for messages and logs.

    add_bos: whether tokenizing the prompt should add the vocabulary's BOS. A Jinja template writes
    `bos_token` itself where it wants one (llama-cpp-python tokenizes its output without adding one);
    llama.cpp's built-ins leave it to the tokenizer.
    stops: texts that end an assistant's turn (the text the template writes after an assistant message,
    and the EOS token's text); generation stops there, as at an end-of-generation token.
    """

    name: str
    add_bos: bool
    stops: tuple[str, ...]

    @abc.abstractmethod
    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
               **kwargs: Any) -> str:
        """The prompt for messages ({"role", "content", ...} mappings), ending with the start of the assistant's
        turn when add_generation_prompt; kwargs are more template variables. ValueError naming the template
        when it cannot render them."""

    def _turn_end(self) -> str:
        """What the template writes after an assistant's message: the end-of-turn marker, stripped, or ""."""
        probe = "pyllama-so-probe-reply"
        try:
            text = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": probe}],
                               add_generation_prompt=False)
        except ValueError:  # a template that rejects the probe's conversation
            return ""
        at = text.rfind(probe)
        return text[at + len(probe):].strip() if at >= 0 else ""


class BuiltinTemplate(ChatTemplate):
    """One of llama.cpp's built-in formats, applied by llama_chat_apply_template. It knows roles and text
    contents only: no tools, no extra variables."""

    def __init__(self, builtin: str, *, name: str, eos_token: str = "") -> None:
        if builtin not in _llama.chat_builtin_templates():
            raise ValueError(f"{name}: {builtin!r} is not one of llama.cpp's built-in chat templates")
        self.builtin, self.name, self.add_bos = builtin, name, True
        self.stops = tuple(dict.fromkeys(s for s in (self._turn_end(), eos_token) if s))

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
               **kwargs: Any) -> str:
        if tools:
            raise ValueError(f"tools need a Jinja chat template; {self.name} (a llama.cpp built-in) cannot "
                             "render them")
        if kwargs:
            raise ValueError(f"chat_template_kwargs need a Jinja chat template; {self.name} (a llama.cpp "
                             f"built-in) has no variables ({', '.join(sorted(kwargs))})")
        plain = [{"role": m["role"], "content": _text_content(m.get("content"), self.name)} for m in messages]
        try:
            return _llama.chat_apply_template(self.builtin, plain, add_assistant=add_generation_prompt)
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None


class JinjaTemplate(ChatTemplate):
    """A Jinja chat template, compiled once (ValueError naming it if it is not valid Jinja; ImportError
    when Jinja2 is not installed)."""

    def __init__(self, text: str, *, name: str, bos_token: str = "", eos_token: str = "") -> None:
        self.text, self.name, self.add_bos = text, name, False
        self.bos_token, self.eos_token = bos_token, eos_token
        self._compiled = _compile(text, name)
        self.stops = tuple(dict.fromkeys(s for s in (self._turn_end(), eos_token) if s))

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
               **kwargs: Any) -> str:
        clash = sorted(_RESERVED & kwargs.keys())
        if clash:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)}: the chat template gets them "
                             "from the request")
        variables = {**kwargs, "messages": [dict(m) for m in messages],
                     "add_generation_prompt": add_generation_prompt, "bos_token": self.bos_token,
                     "eos_token": self.eos_token, "tools": tools, "tool_choice": tool_choice,
                     "raise_exception": _raise_exception, "strftime_now": _strftime_now}
        try:
            return self._compiled.render(**variables)
        except _TemplateRaised as e:
            raise ValueError(f"{self.name} refused these messages: {e}") from None
        except Exception as e:  # whatever the template's code did: undefined calls, bad types, sandbox errors
            raise ValueError(f"{self.name} failed to render: {type(e).__name__}: {e}") from None


class _TemplateRaised(Exception):
    """raise_exception() called by a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter: Jinja's own sorts the keys and HTML-escapes, which changes the prompt
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _text_content(content: Any, name: str) -> str:
    """A message content as text for the built-ins: a string, None (""), or OpenAI's text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    raise ValueError(f"{name} takes text contents only (a string or text parts), got {type(content).__name__}")


def _compile(text: str, name: str) -> Any:
    try:
        import jinja2
        import jinja2.ext
        from jinja2 import nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError(f"{name} is a Jinja template, and rendering it needs Jinja2: {EXTRA}") from None

    class GenerationBlock(jinja2.ext.Extension):
        """transformers' {% generation %}...{% endgeneration %}: marks the assistant's text for training
        masks; a prompt keeps the body as it is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{name} is not a valid Jinja template: {e.message} (line {e.lineno})") from None


def _token_text(model: _llama.Model, token: int) -> str:
    """A special token's text (as templates use bos_token / eos_token), or "" when the vocabulary has none."""
    if token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", "replace")


def jinja_for_model(model: _llama.Model, text: str, *, name: str) -> JinjaTemplate:
    """A Jinja template with the model's BOS and EOS texts as bos_token and eos_token."""
    return JinjaTemplate(text, name=name, bos_token=_token_text(model, model.token_bos),
                         eos_token=_token_text(model, model.token_eos))


def from_spec(model: _llama.Model, spec: str, *, name: str) -> ChatTemplate:
    """A template the user chose, `name` saying where (e.g. "chat_template="): a template text (Jinja), a
    built-in name (or a llama-cpp-python alias of one), "chat_template.default" (the model's own template)
    or "chat_template.NAME" (the model's tokenizer.chat_template.NAME)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{name} must be a chat template name or text, got {spec!r}")
    if looks_like_jinja(spec):
        return jinja_for_model(model, spec, name=f"the chat template given as {name}")
    if spec.startswith(_MODEL_VARIANT_PREFIX):
        variant = spec[len(_MODEL_VARIANT_PREFIX):]
        variant_name = None if variant == "default" else variant
        if model.chat_template(variant_name) is None:
            raise ValueError(f"{name} {spec!r} names the model's {_model_key(variant_name)}, which the model does "
                             "not have")
        return model_template(model, variant_name)
    builtin = _FORMAT_ALIASES.get(spec, spec)
    if builtin not in _llama.chat_builtin_templates():
        raise ValueError(f"{name}: unknown chat template name {spec!r}; expected a Jinja template text (with {{{{ or "
                         f"{{%), chat_template.NAME or one of llama.cpp's built-ins: {', '.join(builtin_names())}")
    return BuiltinTemplate(builtin, name=f"the built-in chat template {builtin!r} ({name})",
                           eos_token=_token_text(model, model.token_eos))


def _model_key(variant: str | None) -> str:
    return "tokenizer.chat_template" + (f".{variant}" if variant else "")


def model_template(model: _llama.Model, variant: str | None = None) -> ChatTemplate:
    """The model's own template (tokenizer.chat_template, or its variant tokenizer.chat_template.VARIANT),
    as Jinja; without one (and no variant asked for), llama.cpp's DEFAULT_BUILTIN."""
    text = model.chat_template(variant)
    if text is None:
        if variant is not None:
            raise ValueError(f"the model has no {_model_key(variant)}")
        return BuiltinTemplate(DEFAULT_BUILTIN, name=f"the built-in chat template {DEFAULT_BUILTIN!r} (the model "
                               "has no tokenizer.chat_template)", eos_token=_token_text(model, model.token_eos))
    return jinja_for_model(model, text, name=f"the model's chat template ({_model_key(variant)})")
