"""llama-server's sampler flags (--top-k, --top-p, ..., --ignore-eos, -l/--logit-bias), with its names and
LLAMA_ARG_* variables: the sampling a request that leaves a field out gets. Its sampler flags for what this
server's chain does not have (a custom order, dynamic temperature, adaptive-p) are in upstream_flags.py."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any

from pyllama_so.sampling import SamplingParams


@dataclass(frozen=True)
class SamplerFlag:
    names: tuple[str, ...]
    field: str  # SamplingParams' name
    type: type
    env: str | None = None  # llama-server's LLAMA_ARG_* variable, where it has one


SAMPLER_FLAGS = (
    SamplerFlag(("--top-k",), "top_k", int, "LLAMA_ARG_TOP_K"),
    SamplerFlag(("--top-p",), "top_p", float, "LLAMA_ARG_TOP_P"),
    SamplerFlag(("--min-p",), "min_p", float, "LLAMA_ARG_MIN_P"),
    SamplerFlag(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float),
    SamplerFlag(("--xtc-probability",), "xtc_probability", float),
    SamplerFlag(("--xtc-threshold",), "xtc_threshold", float),
    SamplerFlag(("--typical", "--typical-p"), "typical_p", float),
    SamplerFlag(("--repeat-last-n",), "penalty_last_n", int),
    SamplerFlag(("--repeat-penalty",), "repeat_penalty", float, "LLAMA_ARG_REPEAT_PENALTY"),
    SamplerFlag(("--presence-penalty",), "presence_penalty", float, "LLAMA_ARG_PRESENCE_PENALTY"),
    SamplerFlag(("--frequency-penalty",), "frequency_penalty", float, "LLAMA_ARG_FREQUENCY_PENALTY"),
    SamplerFlag(("--dry-multiplier",), "dry_multiplier", float),
    SamplerFlag(("--dry-base",), "dry_base", float),
    SamplerFlag(("--dry-allowed-length",), "dry_allowed_length", int),
    SamplerFlag(("--dry-penalty-last-n",), "dry_penalty_last_n", int),
    SamplerFlag(("--mirostat",), "mirostat_mode", int),
    SamplerFlag(("--mirostat-lr",), "mirostat_eta", float),
    SamplerFlag(("--mirostat-ent",), "mirostat_tau", float),
)

class _Breaker(argparse.Action):
    """--dry-sequence-breaker STRING, repeated: the first one replaces the default breakers; "none" clears them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        got = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, [] if values == "none" else [*got, str(values)])


def logit_bias_arg(text: str) -> tuple[int, float]:
    """TOKEN_ID(+/-)BIAS, as llama-server's -l: "15043+1", "15043-inf"."""
    for i in range(1, len(text)):
        if text[i] in "+-" and text[:i].isdigit():
            try:
                bias = float(text[i + 1:])
            except ValueError:
                break
            if math.isnan(bias):
                break
            return int(text[:i]), -bias if text[i] == "-" else bias
    raise argparse.ArgumentTypeError(f"expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf, not {text!r}")


def add_sampler_flags(ap: argparse.ArgumentParser) -> None:
    group = ap.add_argument_group("sampling of requests that leave a field out (llama-server's flags)")
    for f in SAMPLER_FLAGS:
        env = f" (env {f.env})" if f.env else ""
        group.add_argument(*f.names, dest=f"sampling_{f.field}", type=f.type, metavar="N",
                           default=os.environ.get(f.env) if f.env else None,
                           help=f"the {f.field} of a request that gives none "
                                f"(default {getattr(SamplingParams(), f.field)}){env}")
    group.add_argument("--dry-sequence-breaker", dest="sampling_dry_sequence_breakers", action=_Breaker,
                       default=None, metavar="STRING",
                       help="a DRY sequence breaker; the first replaces the defaults, 'none' leaves none")
    group.add_argument("-l", "--logit-bias", dest="sampling_logit_bias", type=logit_bias_arg, action="append",
                       default=None, metavar="TOKEN_ID(+/-)BIAS",
                       help="a token's logit bias, e.g. 15043+1 or 15043-inf (repeatable)")
    group.add_argument("--ignore-eos", action="store_true", default=False,
                       help="requests that leave ignore_eos out never sample an end-of-generation token")


def sampling_defaults(ap: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """The SamplingParams fields the flags set; a value out of range exits as a bad flag value does (status 2),
    naming the flag."""
    out: dict[str, Any] = {}
    for f in SAMPLER_FLAGS:
        value = getattr(ns, f"sampling_{f.field}")
        if value is None:
            continue
        try:
            SamplingParams(**{f.field: value})
        except (TypeError, ValueError) as e:
            ap.error(f"argument {'/'.join(f.names)}: {e}")
        out[f.field] = value
    if ns.sampling_dry_sequence_breakers is not None:
        out["dry_sequence_breakers"] = tuple(ns.sampling_dry_sequence_breakers)
    if ns.sampling_logit_bias:
        out["logit_bias"] = dict(ns.sampling_logit_bias)
    return out
