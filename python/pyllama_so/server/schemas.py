"""Request bodies of the OpenAI endpoints. Known fields are checked strictly (a string where a number
belongs is a 400, not a conversion); fields this server does not use are ignored, as OpenAI clients send
some by default."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pyllama_so.sampling import SamplingParams


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class GenerationRequest(_Body):
    """The fields both endpoints share. The sampling defaults are Llama's (and llama-server's)."""

    model: str | None = None  # any name: the server has one model
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0, lt=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # llama-server's extension: end-of-generation tokens are never sampled
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one choice per request

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str]  # text, token ids, or a list of one text
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; None: up to the end of the slot's context
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) != 1:
            raise ValueError(f"one prompt per request, got {len(v)}")
        return v


class ContentPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: str
    content: str | list[ContentPart] | None = None

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


class ChatRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)  # None: up to the end of the slot's context
    max_completion_tokens: int | None = Field(None, ge=0)  # the newer name of max_tokens

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
