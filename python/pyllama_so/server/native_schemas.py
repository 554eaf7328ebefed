"""Request bodies of llama-server's native endpoints (/completion, /infill, /tokenize, /detokenize), with the
fields and forms of the pinned tree's tools/server/README.md. As for the OpenAI bodies, known fields are
checked strictly and unknown ones ignored; a field llama-server has that this server cannot honour is a
400 naming it when set to anything but its neutral value, never silently dropped."""

from __future__ import annotations

import math
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, StrictInt, field_validator

from pyllama_so.server.schemas import GenerationRequest, Text

# a prompt: a text, token ids, or both mixed ([12, 34, "text", 56])
MixedPrompt = Text | list[StrictInt | Text]
# /completion's: one, or several in a list (see NativeCompletionRequest.prompts)
MixedPrompts = Text | list[StrictInt | Text | list[StrictInt | Text]]

# llama-server fields this server does not implement, and the value that leaves them off
UNSUPPORTED = {"dynatemp_range": 0.0, "samplers": None, "post_sampling_probs": False, "n_indent": 0,
               "t_max_predict_ms": 0, "lora": None, "adaptive_target": -1.0}


class NativeCompletionRequest(GenerationRequest):
    """POST /completion. prompt: one, or several in a list (see prompts). n_cmpl (or n): that many completions
    of each prompt; an array of results when more than one in all, completion c of prompt p at index
    p * n_cmpl + c (at most the server's slots in all). n_predict (also max_tokens / max_completion_tokens):
    -1 (default, or the server's -n) until the end of the slot's context, 0 the prompt is evaluated into the
    cache and nothing is generated. n_probs (also logprobs): the top-N log-probabilities of each generated
    token. logit_bias: [[token, bias], ...] or {token: bias}, a token an id or a text (each of its tokens), a
    bias a number or false (never sampled)."""

    prompt: MixedPrompts
    n_predict: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_probs: int | None = None
    logprobs: int | None = None
    cache_prompt: bool = True
    id_slot: int = -1
    return_tokens: bool = False
    logit_bias: list[Any] | dict[Text, Any] | None = None  # type: ignore[assignment]  # resolved by the endpoint
    response_fields: list[Text] | None = None
    # not implemented: see UNSUPPORTED
    dynatemp_range: float = 0.0
    samplers: list[Text] | Text | None = None
    post_sampling_probs: bool = False
    n_indent: int = 0
    t_max_predict_ms: int = 0
    lora: list[Any] | None = None
    adaptive_target: float = -1.0
    n_cmpl: int | None = None  # completions of the prompt (llama-server's; OpenAI's n is its fallback)

    @property
    def n_choices(self) -> int:
        return self.n if self.n_cmpl is None else self.n_cmpl

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _unsupported(cls, v: Any, info: Any) -> Any:
        off = UNSUPPORTED[info.field_name]
        if info.field_name == "adaptive_target" and v < 0:
            return v
        if v != off:
            raise ValueError(f"{info.field_name} is not supported by this server (leave it out or set it to "
                             f"{'null' if off is None else str(off).lower()})")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt_lists(cls, v: Any) -> Any:
        if isinstance(v, list) and any(isinstance(p, int) for p in v) and any(isinstance(p, list) for p in v):
            raise ValueError("a prompt holds token ids and texts; several prompts are a list of prompts with no "
                             "token id beside them")
        return v

    @property
    def prompts(self) -> list[str | list[int | str]]:
        """The prompts, as llama-server reads the field: a list holding no token id at its top level is
        several prompts (texts, token id lists or mixed lists), anything else one."""
        v = self.prompt
        if isinstance(v, list) and v and not any(isinstance(p, int) for p in v):
            return [p for p in v if not isinstance(p, int)]  # all of them (the filter tells mypy so)
        return [cast("str | list[int | str]", v)]  # one prompt: _prompt_lists refused lists beside token ids

    @field_validator("n_predict", "max_tokens", "max_completion_tokens")
    @classmethod
    def _n_predict(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v < -1:
            raise ValueError(f"{info.field_name} must be >= -1 (-1 = until the end of the slot's context), got {v}")
        return v

    @property
    def n_predict_given(self) -> int | None:
        """n_predict, else max_tokens, else max_completion_tokens, as llama-server reads them; None if none."""
        return next((v for v in (self.n_predict, self.max_tokens, self.max_completion_tokens) if v is not None), None)

    @property
    def n_logprobs(self) -> int | None:
        n = self.n_probs if self.n_probs is not None else self.logprobs
        return n if n else None  # 0: none, as in llama-server

    @property
    def logprobs_param(self) -> str:
        return "n_probs" if self.n_probs is not None else "logprobs"


class InfillExtra(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    text: Text
    filename: Text = "tmp"


class InfillRequest(NativeCompletionRequest):
    """POST /infill: every field of /completion, with input_prefix and input_suffix (texts, or mixed with
    token ids), input_extra (context chunks before the prefix) and prompt a text that follows the prefix."""

    input_prefix: MixedPrompt
    input_suffix: MixedPrompt
    input_extra: list[InfillExtra] = []
    prompt: Text = ""


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    content: MixedPrompt | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    tokens: list[StrictInt] = []


def bias_value(value: Any) -> float:
    """A logit bias as llama-server reads it: a number, or false for -inf (never sampled)."""
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"logit_bias: a bias must be a number or false, not {value!r}")
    return float(value)
