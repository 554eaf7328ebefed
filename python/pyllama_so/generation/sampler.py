"""The one factory of a request's llama.cpp sampler chain: Llama's generation loop and the server engine's
admission build it here, once per request, from parameters already checked (SamplingParams.checked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams


def new_sampler(model: _llama.Model, params: SamplingParams, *, n_ctx: int, grammar: Any = None,
                grammar_root: str = "root") -> _llama.Sampler:
    """A request's sampler chain on model (seeded from params.seed; n_ctx: the sequence's context, for the
    penalties' and DRY's windows; grammar: GBNF text or a tool call's grammar). The caller frees it."""
    return _llama.Sampler(model, params, n_ctx=n_ctx, grammar=grammar, grammar_root=grammar_root)


def with_banned(params: SamplingParams, tokens: Iterable[int]) -> SamplingParams:
    """params with a bias of -inf on tokens, over the request's own logit_bias (llama-server's ignore_eos bans
    every end-of-generation token so)."""
    bias = {**(params.logit_bias or {}), **{int(t): float("-inf") for t in tokens}}
    return dataclasses.replace(params, logit_bias=bias)
