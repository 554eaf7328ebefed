"""Request bodies of the OpenAI endpoints. Known fields are checked strictly (a string where a number
belongs is a 400, not a conversion); fields this server does not use are ignored, as OpenAI clients send
some by default. Strings must be valid Unicode: JSON may spell a lone surrogate ("\\ud800"), which no
text encoding takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from pyllama_so.chat_template import ChatTemplate
from pyllama_so.generation.limits import max_tokens_limit
from pyllama_so.grammar import GrammarSpec, resolve_grammar
from pyllama_so.sampling import SamplingParams


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode: a lone surrogate {text[e.start]!r} at position {e.start}") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class GenerationRequest(_Body):
    """The fields both endpoints share. The sampling defaults are Llama's (and llama-server's)."""

    model: Text | None = None  # any name: the server has one model
    # sampling: llama-cpp-python's names (llama-server's where it names one differently); None takes
    # SamplingParams' default, and its ranges (one rule, one message) are checked when the job is made
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    penalty_last_n: int | None = None
    repeat_last_n: int | None = None  # llama-server's name of penalty_last_n
    mirostat_mode: int | None = None
    mirostat: int | None = None  # llama-server's name of mirostat_mode
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[Text] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    top_n_sigma: float | None = None
    min_keep: int | None = None
    logit_bias: dict[Text, float] | None = None  # OpenAI's: token id (as a string) -> bias
    seed: int | None = None
    stop: Text | list[Text] | None = None
    ignore_eos: bool = False  # llama-server's extension: end-of-generation tokens are never sampled
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1  # choices (llama-server's n_cmpl): each its own job, at most the server's slots
    # structured output, at most one: GBNF text or a JSON schema (llama-server's fields), OpenAI's response_format
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def sampling(self, defaults: Mapping[str, Any] | None = None,
                 logit_bias: Mapping[int, float] | None = None) -> SamplingParams:
        """The sampling parameters: fields left out take defaults' value (the server's --temp, --seed) where
        it has one, else SamplingParams' default (the one place they are written); logit_bias: instead of the
        field (a native request's, resolved to token ids). ValueError naming the one out of range."""
        names = set(SamplingParams.names()) - {"penalty_last_n", "mirostat_mode", "dry_sequence_breakers"}
        given = {n: getattr(self, n) for n in names}
        if logit_bias is not None:
            given["logit_bias"] = logit_bias
        # the fields with two request names (llama-server's and llama-cpp-python's)
        given["penalty_last_n"] = self.penalty_last_n if self.penalty_last_n is not None else self.repeat_last_n
        given["mirostat_mode"] = self.mirostat_mode if self.mirostat_mode is not None else self.mirostat
        breakers = self.dry_sequence_breakers
        given["dry_sequence_breakers"] = None if breakers is None else tuple(breakers)
        for name, value in (defaults or {}).items():
            if given.get(name) is None:
                given[name] = value
        return SamplingParams.from_kwargs(**given)

    @property
    def n_logprobs(self) -> int | None:
        """How many top logprobs each generated token reports, or None (the endpoint's own fields)."""
        return None

    @property
    def logprobs_param(self) -> str:
        """The field n_logprobs comes from, for a 400."""
        return "logprobs"

    def grammar_text(self) -> GrammarSpec | None:
        """GBNF for grammar / json_schema / response_format (pyllama_so.grammar; a GrammarError names the field).
        An empty grammar is none, as in llama-server."""
        return resolve_grammar(self.grammar or None, self.response_format, self.json_schema)[0]

    @property
    def grammar_param(self) -> str:
        """The field the grammar came from, for a 400 on a grammar llama.cpp's parser rejects."""
        return "grammar" if self.grammar else "json_schema" if self.json_schema is not None else "response_format"

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(GenerationRequest):
    prompt: Text | list[int] | list[Text] | list[list[int]]  # text, token ids, or a list of either (several prompts)
    max_tokens: int | None = 16  # OpenAI's default; see token_limit
    echo: bool = False
    logprobs: int | None = None  # the legacy completions' top-N count (0..MAX_LOGPROBS)

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, each a text or token ids, in order."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        # validation left a list of one kind: token ids (or nothing), texts or token id lists
        if not p or isinstance(p[0], int):
            return [cast("list[int]", p)]
        return cast("list[str | list[int]]", list(p))

    @property
    def token_limit(self) -> int | None:
        """Llama's (llama-cpp-python's) rule: None, 0 or less: up to the end of the slot's context."""
        return max_tokens_limit(self.max_tokens)


class ContentPart(_Body):
    type: Text
    text: Text | None = None


class Message(_Body):
    """A chat turn. Fields beyond role and content (name, tool_calls, tool_call_id, ...) reach the chat
    template as they are."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Text
    content: Text | list[ContentPart] | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, v: str | list[ContentPart] | None) -> str | list[ContentPart] | None:
        if isinstance(v, list) and any(p.type != "text" or p.text is None for p in v):
            raise ValueError("only text content parts are supported")
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""

    def variables(self) -> dict[str, Any]:
        """The message as the chat template sees it: content as text ("" for null), the other fields kept."""
        return {**(self.model_extra or {}), "role": self.role, "content": self.text()}


class ChatTemplateRequest(_Body):
    """What the chat template renders: the fields of /v1/chat/completions that /apply-template takes too."""

    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # with tools: whether a reply may hold several calls
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template (llama-server's field)

    def render(self, template: ChatTemplate) -> str:
        """The prompt text; ValueError when the template fails on these messages."""
        return template.render([m.variables() for m in self.messages], add_generation_prompt=self.add_generation_prompt,
                               tools=self.tools, tool_choice=self.tool_choice, **(self.chat_template_kwargs or {}))


class ChatRequest(GenerationRequest, ChatTemplateRequest):
    max_tokens: int | None = None  # see token_limit
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None  # 0..MAX_LOGPROBS, with logprobs

    @property
    def n_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise ValueError("top_logprobs needs logprobs: true")
            return None
        return 0 if self.top_logprobs is None else self.top_logprobs

    @property
    def logprobs_param(self) -> str:
        return "top_logprobs"

    @property
    def token_limit(self) -> int | None:
        """max_completion_tokens, else max_tokens, by Llama's rule: None, 0 or less: up to the end of the
        slot's context."""
        return max_tokens_limit(self.max_completion_tokens if self.max_completion_tokens is not None
                                else self.max_tokens)
