"""Sampling parameters with llama-cpp-python's names, validated once; llama.cpp's sampler chain
(`_llama.Sampler`, `_sampler.pxi`) does the sampling in C.

The chain runs in the order of llama.cpp's common sampler: logit bias, penalties (repeat, frequency,
presence over the last `penalty_last_n` tokens, prompt included), DRY, top-n-sigma, top-k, typical-p,
top-p, min-p, XTC, temperature, then a seeded draw. `mirostat_mode` 1 or 2 replaces everything after DRY
by temperature and mirostat; `temperature=0` ends the chain with greedy (argmax) instead of a draw.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

# llama.cpp's default DRY sequence breakers (common_params_sampling.dry_sequence_breakers)
DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    return value


def logit_bias_entries(logit_bias: Mapping[Any, float] | None, n_vocab: int) -> list[tuple[int, float]]:
    """{token id: bias} (ids as int or as decimal str, as JSON gives them) to (id, bias) pairs, in order; a
    ValueError naming logit_bias for an id outside [0, n_vocab) or a bias that is not a number (NaN included)."""
    if logit_bias is None:
        return []
    if not isinstance(logit_bias, Mapping):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, not {type(logit_bias).__name__}")
    out = []
    for key, value in logit_bias.items():
        try:
            tok = int(key) if isinstance(key, (int, str)) and not isinstance(key, bool) else None
        except ValueError:
            tok = None
        if tok is None or not 0 <= tok < n_vocab:
            raise ValueError(f"logit_bias: {key!r} is not a token id of the vocabulary [0, {n_vocab})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"logit_bias: the bias of token {tok} must be a number, not {value!r}")
        out.append((tok, float(value)))
    return out


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling parameter of llama-cpp-python's create_completion, with its defaults.

    A value out of range is a ValueError naming the parameter. `logit_bias` maps token ids (int, or
    decimal str as JSON gives them) to a bias added to the logit (-inf bans a token); checked() checks its
    ids against a model's vocabulary, before a request's sampler chain is built from the parameters.
    `seed` None (or -1) draws a random seed.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DRY_SEQUENCE_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    min_keep: int = 0
    logit_bias: Mapping[Any, float] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        temperature = _number("temperature", self.temperature)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if _integer("top_k", self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        for name in ("top_p", "typical_p"):
            if not 0.0 < _number(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("min_p", "xtc_probability", "xtc_threshold"):
            if not 0.0 <= _number(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if _number("repeat_penalty", self.repeat_penalty) <= 0:
            raise ValueError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        _number("frequency_penalty", self.frequency_penalty)
        _number("presence_penalty", self.presence_penalty)
        _number("top_n_sigma", self.top_n_sigma)
        for name in ("penalty_last_n", "dry_penalty_last_n"):
            if _integer(name, getattr(self, name)) < -1:
                raise ValueError(f"{name} must be >= -1 (-1 = the whole context, 0 = off), got {getattr(self, name)}")
        if self.mirostat_mode not in (0, 1, 2) or isinstance(self.mirostat_mode, bool):
            raise ValueError(f"mirostat_mode must be 0 (off), 1 or 2, got {self.mirostat_mode!r}")
        if _number("mirostat_tau", self.mirostat_tau) < 0:
            raise ValueError(f"mirostat_tau must be >= 0, got {self.mirostat_tau}")
        if _number("mirostat_eta", self.mirostat_eta) <= 0:
            raise ValueError(f"mirostat_eta must be > 0, got {self.mirostat_eta}")
        if _number("dry_multiplier", self.dry_multiplier) < 0:
            raise ValueError(f"dry_multiplier must be >= 0 (0 = off), got {self.dry_multiplier}")
        if _number("dry_base", self.dry_base) <= 0:
            raise ValueError(f"dry_base must be > 0, got {self.dry_base}")
        if _integer("dry_allowed_length", self.dry_allowed_length) < 0:
            raise ValueError(f"dry_allowed_length must be >= 0, got {self.dry_allowed_length}")
        breakers = self.dry_sequence_breakers
        if isinstance(breakers, str) or not isinstance(breakers, Sequence) or \
                not all(isinstance(b, str) and b and "\0" not in b for b in breakers):
            raise ValueError(f"dry_sequence_breakers must be a list of non-empty strings, got {breakers!r}")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        if _integer("min_keep", self.min_keep) < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping of token id to bias, not {type(self.logit_bias).__name__}")
        if self.seed is not None and (_integer("seed", self.seed) < -1 or self.seed >= 2**32):
            raise ValueError(f"seed must be in [0, 2**32) or -1 / None (random), got {self.seed}")

    def checked(self, n_vocab: int) -> SamplingParams:
        """These parameters checked against a vocabulary of n_vocab tokens (a logit_bias id outside it, or a
        bias that is not a number, is a ValueError naming logit_bias), as a copy whose `vocabulary` says so:
        what a request carries to the one place its sampler chain is built."""
        logit_bias_entries(self.logit_bias, n_vocab)
        out = dataclasses.replace(self)
        object.__setattr__(out, "_vocabulary", n_vocab)
        return out

    @property
    def vocabulary(self) -> int | None:
        """The vocabulary size checked() checked these parameters against; None: not checked (a copy made
        with dataclasses.replace is not)."""
        return self.__dict__.get("_vocabulary")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SamplingParams:
        """The parameters given (None means the default), with llama-cpp-python's alias `temp`."""
        if "temp" in kwargs:
            temp = kwargs.pop("temp")
            if kwargs.get("temperature") is None:
                kwargs["temperature"] = temp
        unknown = set(kwargs) - set(cls.names())
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {sorted(unknown)}")
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
