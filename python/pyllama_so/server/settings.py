"""The server's defaults for requests (--temp, --seed, -n, llama-server's sampler flags), the settings its
routes read (ServerSettings, on app.state), and a request's generation settings as llama-server
reports them: the `generation_settings` of a /completion
response, each slot's `params` in /slots and `default_generation_settings.params` in /props (field names
of task_params::to_json in the pinned tree's tools/server/server-task.cpp, for the fields this server has)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyllama_so import __version__
from pyllama_so._build_info import UPSTREAM_COMMIT
from pyllama_so.sampling import SamplingParams

# OpenAI's system_fingerprint and /props' build_info: this build (the package and its upstream commit)
FINGERPRINT = f"pyllama_so-{__version__}-{UPSTREAM_COMMIT[:9]}"
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.h: a random seed, as llama-server shows an unset one
# the order of our chain (sampling.py), in llama-server's sampler names
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


@dataclass(frozen=True)
class ServerDefaults:
    """--temp, --seed, -n/--n-predict, llama-server's other sampler flags and --ignore-eos: what a request that
    leaves the field out gets (None: the endpoint's own default, SamplingParams' for the sampling fields).
    sampling_fields: more SamplingParams fields, by name (--top-k gives top_k, ...)."""

    temperature: float | None = None
    seed: int | None = None
    n_predict: int | None = None
    sampling_fields: Mapping[str, Any] = field(default_factory=dict)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        SamplingParams.from_kwargs(**self.sampling())  # a bad sampler flag fails at start
        if self.n_predict is not None and self.n_predict < -1:
            raise ValueError(f"-n/--n-predict must be >= -1 (-1 = until the end of the slot), got {self.n_predict}")

    def sampling(self) -> dict[str, Any]:
        """The sampling fields these defaults set."""
        out = {k: v for k, v in (("temperature", self.temperature), ("seed", self.seed)) if v is not None}
        out.update(self.sampling_fields)
        return out


@dataclass(frozen=True)
class ServerSettings:
    """What the routes need of the server's flags besides the engine and the chat template (create_app puts
    it on app.state). model_id: the name the server serves its model as; model_meta: more /v1/models meta
    fields; stream_grace: how long a stream outlives a shutdown's start; slots_endpoint: /slots and /engine
    (--no-slots turns them off); metrics_endpoint: /metrics (--metrics); started: the start, in Unix seconds."""

    model_id: str
    defaults: ServerDefaults = ServerDefaults()
    model_meta: Mapping[str, Any] = field(default_factory=dict)
    stream_grace: float = 0.0
    slots_endpoint: bool = True
    metrics_endpoint: bool = False
    started: int = 0


def generation_settings(sampling: SamplingParams, *, n_predict: int, stop: Sequence[str] = (), stream: bool = False,
                        n_probs: int = 0, ignore_eos: bool = False, grammar: str | Mapping[str, Any] | None = None,
                        backend_sampling: bool = False) -> dict[str, Any]:
    """The settings object, in llama-server's order of fields; grammar: GBNF text, or a tool call's grammar
    (tool_calls.py: its text under "grammar")."""
    if isinstance(grammar, Mapping):
        grammar = grammar.get("grammar")
    seed = LLAMA_DEFAULT_SEED if sampling.seed is None or sampling.seed == -1 else sampling.seed
    samplers = [*SAMPLERS[:2], "mirostat"] if sampling.mirostat_mode else list(SAMPLERS)  # mirostat replaces the rest
    return {
        "seed": seed, "temperature": sampling.temperature, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
        "top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p, "top_n_sigma": sampling.top_n_sigma,
        "xtc_probability": sampling.xtc_probability, "xtc_threshold": sampling.xtc_threshold,
        "typical_p": sampling.typical_p, "repeat_last_n": sampling.penalty_last_n,
        "repeat_penalty": sampling.repeat_penalty, "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty, "dry_multiplier": sampling.dry_multiplier,
        "dry_base": sampling.dry_base, "dry_allowed_length": sampling.dry_allowed_length,
        "dry_penalty_last_n": sampling.dry_penalty_last_n,
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "mirostat": sampling.mirostat_mode, "mirostat_tau": sampling.mirostat_tau,
        "mirostat_eta": sampling.mirostat_eta,
        "stop": list(stop), "max_tokens": n_predict, "n_predict": n_predict, "n_keep": 0, "n_discard": 0,
        "ignore_eos": ignore_eos, "stream": stream, "logit_bias": _logit_bias(sampling.logit_bias), "n_probs": n_probs,
        "min_keep": sampling.min_keep, "grammar": grammar or "", "samplers": samplers, "timings_per_token": False,
        "post_sampling_probs": False, "backend_sampling": backend_sampling, "lora": [],
    }


def _logit_bias(bias: Mapping[Any, float] | None) -> list[dict[str, Any]]:
    """llama-server's list of {"bias", "token"}; a banned token's -inf is null, as llama-server's JSON library
    writes it."""
    return [{"bias": v if math.isfinite(v) else None, "token": int(k)} for k, v in (bias or {}).items()]


def metrics_only(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings without the request's texts and lists, as /slots and /props show them."""
    return {k: v for k, v in settings.items() if k not in ("dry_sequence_breakers", "stop", "logit_bias", "grammar")}
