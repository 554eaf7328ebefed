"""Command-line values shared by the tools: llama.cpp's flag spellings, parsers and LLAMA_ARG_* defaults."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyllama_so import _llama, config

T = TypeVar("T")

BOOL = {"0": False, "off": False, "false": False, "no": False, "1": True, "on": True, "true": True, "yes": True}


def env_default(name: str, fallback: str) -> str:
    """llama.cpp convention: LLAMA_ARG_<NAME> supplies a flag's default."""
    return os.environ.get(f"LLAMA_ARG_{name}", fallback)


def comma_list(parse: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse type for llama-bench's comma-separated value lists."""

    def parse_list(text: str) -> list[T]:
        items = [s.strip() for s in text.split(",")]
        if any(not s for s in items):  # "".split(",") is [""], so an empty text fails here too
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        return [parse(s) for s in items]

    return parse_list


def _int_at_least(text: str, low: int) -> int:
    """An integer >= low; the message states the rule the flag has, whatever the value broke."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):  # not NaN either
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def tcp_port(low: int) -> Callable[[str], int]:
    """A TCP port in low..65535 (low 0 where 0 means any free port)."""
    def parse(text: str) -> int:
        value = _int_at_least(text, low)
        if value > 65535:
            raise argparse.ArgumentTypeError(f"expected a port in {low}..65535, got {value}")
        return value
    return parse


def gpu_layers(text: str) -> int:
    """-ngl: a count, or -1 / 'all' for every layer."""
    if text in ("all", "-1"):
        return -1
    return non_negative_int(text)


def rule(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from one of the bindings' value rules (_llama.split_mode_name, ...): the
    command line accepts exactly what Llama accepts."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = getattr(check, "__name__", "value")  # argparse names the type in its messages
    return parse


split_mode = rule(_llama.split_mode_name)
flash_attn = rule(_llama.flash_attn_name)
cache_type = rule(_llama.cache_type_name)


rpc_servers = rule(_llama.rpc_endpoints)


def rpc_server_lists(text: str) -> list[list[str]]:
    """The bench's --rpc: one list of servers for every run (its commas separate servers, as llama-bench's)."""
    return [rpc_servers(text)]


def boolean(text: str) -> bool:
    key = text.lower()
    if key not in BOOL:
        raise argparse.ArgumentTypeError(f"expected 0/1, got {text!r}")
    return BOOL[key]


def _proportions(text: str, check: Callable[[list[float], int], list[float]], what: str) -> tuple[float, ...]:
    """Proportions per device, as llama.cpp's -ts writes lists (3,1 or 3/1: runs of ',' and '/' separate),
    checked by the bindings' rule (as Llama checks them). The number of entries is checked only against
    llama.cpp's maximum here: against the devices there are when the tool makes its config.ModelParams
    (model_params), which knows about --rpc."""
    try:
        values = [float(v) for v in re.split(r"[,/]+", text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad {what} {text!r}; expected e.g. 3,1 or 3/1") from None
    try:
        return tuple(check(values, _llama.max_devices()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def tensor_split(text: str) -> tuple[float, ...]:
    """-ts: proportions per device, e.g. 1,1 or 3/1 (the bench splits its alternatives at ',' first)."""
    return _proportions(text, _llama.check_tensor_split, "tensor split")


def attn_split(text: str) -> tuple[float, ...]:
    """--attn-split / -as: the attention heads' proportions per device, written as -ts: 1/3 or 1,3 (a 0
    entry gives that device no attention)."""
    return _proportions(text, _llama.check_attn_split, "attention split")


ATTN_SPLIT_NONE = ("-", "none")  # an alternative of the bench's -as that follows -ts


def attn_split_alternatives(text: str) -> list[tuple[float, ...]]:
    """The bench's -as: alternatives separated by ';' (each 1/3 or 1,3), or, without ';', by ',' between
    '/' forms as -ts takes them (1/3,1/0); a text without '/' or ';' is one split (1,3). '-' or 'none' is
    the alternative that follows the tensor split, written as ()."""
    if ";" in text:
        items = text.split(";")
    elif "/" in text:
        items = text.split(",")
    else:
        items = [text]
    items = [s.strip() for s in items]
    if any(not s for s in items):
        raise argparse.ArgumentTypeError(f"empty item in {text!r}")
    return [() if s.lower() in ATTN_SPLIT_NONE else attn_split(s) for s in items]


def pp_tg_pair(text: str) -> tuple[int, int]:
    """-pg: 'pp,tg' pairs, given as e.g. 512,128."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected pp,tg, got {text!r}")
    return positive_int(parts[0]), positive_int(parts[1])


def default_threads() -> int:
    """Physical cores we may run on, as llama-bench (hyperthread siblings count once)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as pkg, open(f"{topo}/core_id") as core:
                cores.add((pkg.read().strip(), core.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


# ---------------------------------------------------------------------------------------------
# The model and context flags of the bench and the server: one definition of their names, variables,
# value rules, defaults and help. The bench takes comma lists of them (every combination runs), the
# server one value each.

@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    env: str  # LLAMA_ARG_<env> supplies the default
    parse: Callable[[str], Any]  # one value
    help: str
    default: str | Callable[[], str] | None = None  # text parsed like a value (computed when the parser is made)
    metavar: str | None = None
    alternatives: Callable[[str], list[Any]] | None = None  # the list form, when not a comma list of values
    alternatives_help: str = "comma list: each value runs"
    repeat: bool = False  # the list form adds each use of the flag to the list (-m a -m b)
    param: str | None = None  # the name in config.ModelParams / ContextParams, when not dest

    @property
    def dest(self) -> str:
        return next(n for n in self.names if n.startswith("--"))[2:].replace("-", "_")

    @property
    def param_name(self) -> str:
        return self.param or self.dest


MODEL_FLAGS: tuple[Flag, ...] = (
    Flag(("-m", "--model"), "MODEL", str, "GGUF model file; default: a cached synthetic model (--synthetic)",
         metavar="FILE", alternatives_help="comma list or repeated flag: each model runs", repeat=True, param="path"),
    Flag(("-b", "--batch-size"), "BATCH", positive_int, "logical batch: most tokens per llama_decode call",
         "2048", "N", param="n_batch"),
    Flag(("-ub", "--ubatch-size"), "UBATCH", positive_int,
         "physical batch: most tokens per ubatch; default 512, with -so 1 half of -b (each batch feeds both lanes)",
         metavar="N", param="n_ubatch"),
    Flag(("-ngl", "--n-gpu-layers"), "N_GPU_LAYERS", gpu_layers, "layers on the GPUs; -1 or all: every layer",
         "-1", "N"),
    Flag(("-sm", "--split-mode"), "SPLIT_MODE", split_mode, "none, layer, row or tensor", "layer", "MODE"),
    Flag(("-mg", "--main-gpu"), "MAIN_GPU", non_negative_int, "the GPU of -sm none and of row split's small tensors",
         "0", "I"),
    Flag(("-ts", "--tensor-split"), "TENSOR_SPLIT", tensor_split,
         "proportions per device, e.g. 3/1 (or 3,1 as llama-server)", metavar="SPLIT",
         alternatives_help="comma list of alternatives (each 3/1): each runs"),
    Flag(("-as", "--attn-split"), "ATTN_SPLIT", attn_split,
         "attention heads and KV cache per device, -sm tensor only: 1/3 or 1,3 (default: follow -ts)",
         metavar="SPLIT", alternatives=attn_split_alternatives,
         alternatives_help="alternatives separated by ';' (1/3;1,1), or by ',' between '/' forms as -ts (1/3,1/0); "
                           "'-' follows -ts; other split modes than tensor are skipped"),
    Flag(("-fa", "--flash-attn"), "FLASH_ATTN", flash_attn, "flash attention: on, off or auto", "auto", "MODE"),
    Flag(("-ctk", "--cache-type-k"), "CACHE_TYPE_K", cache_type, "KV cache type of K (f16, q8_0, ...)", "f16", "TYPE",
         param="type_k"),
    Flag(("-ctv", "--cache-type-v"), "CACHE_TYPE_V", cache_type, "KV cache type of V (f16, q8_0, ...)", "f16", "TYPE",
         param="type_v"),
    Flag(("-t", "--threads"), "THREADS", positive_int, "CPU threads; default: the physical cores",
         lambda: str(default_threads()), "N", param="n_threads"),
    Flag(("-so", "--split-overlap"), "SPLIT_OVERLAP", boolean,
         "alternate prompt ubatches between two lanes (0/1; -sm tensor only)", "0", "0|1",
         alternatives_help="comma list: each value runs; combinations without -sm tensor are skipped"),
    Flag(("-rpc", "--rpc"), "RPC", rpc_servers,
         "use the devices of these RPC servers, host:port,... (python -m pyllama_so.rpc_server); they come "
         "before the local devices, and -ts and -mg count them", metavar="SERVERS", alternatives=rpc_server_lists,
         alternatives_help="one list for every run", param="rpc_servers"),
)


class _ReplaceDefaultThenExtend(argparse.Action):
    """action="extend", except that the first use replaces the default (from LLAMA_ARG_MODEL) where
    extend would add to it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or items is self.default else list(items)
        setattr(namespace, self.dest, items + list(values))


def add_model_args(ap: argparse.ArgumentParser, *, lists: bool = False, synthetic_shapes: Sequence[str] = (),
                   skip: Sequence[str] = ()) -> None:
    """Add MODEL_FLAGS (but those whose dest is in skip) to ap, one value each or, with lists, the bench's
    lists. A flag's default is its LLAMA_ARG_* variable when set, else the table's, parsed as a value of
    the flag; no default is None. synthetic_shapes adds --synthetic, the shape used without -m."""
    for f in MODEL_FLAGS:
        if f.dest in skip:
            continue
        env = f"LLAMA_ARG_{f.env}"
        default = os.environ.get(env) or (f.default() if callable(f.default) else f.default)
        note = f"default {f.default}; env {env}" if isinstance(f.default, str) else f"env {env}"
        kw: dict[str, Any] = {"default": default, "metavar": f.metavar, "help": f"{f.help} ({note})"}
        if lists:
            kw["type"] = f.alternatives or comma_list(f.parse)
            kw["help"] = f"{f.help}; {f.alternatives_help} ({note})"
            if f.repeat:
                kw["action"] = _ReplaceDefaultThenExtend
        else:
            kw["type"] = f.parse
        ap.add_argument(*f.names, **kw)
    if synthetic_shapes:
        ap.add_argument("--synthetic", default="small", choices=list(synthetic_shapes),
                        help="shape of the synthetic model used without -m (default small)")


def add_rpc_argument(ap: argparse.ArgumentParser) -> None:
    """Only the table's --rpc (python -m pyllama_so info)."""
    add_model_args(ap, skip=[f.dest for f in MODEL_FLAGS if f.dest != "rpc"])


# ---------------------------------------------------------------------------------------------
# The tools' configuration from their parsed flags (one value each): the same parameter objects, and so
# the same rules and messages, as Llama's keyword arguments.

_MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(config.ModelParams))
_CONTEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(config.ContextParams))


def param_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The MODEL_FLAGS of a parsed namespace under their parameter names (n_batch for -b, path for -m, ...)."""
    return {f.param_name: getattr(ns, f.dest) for f in MODEL_FLAGS if hasattr(ns, f.dest)}


def model_params(ns: argparse.Namespace) -> config.ModelParams:
    """config.ModelParams of the flags (ValueError or TypeError naming the parameter)."""
    return config.ModelParams(**{k: v for k, v in param_values(ns).items() if k in _MODEL_FIELDS})


def context_params(ns: argparse.Namespace, **fields: Any) -> config.ContextParams:
    """config.ContextParams of the flags, with the tool's own fields (n_ctx from its -c, n_seq_max, ...).
    -t sets both thread counts (n_threads_batch follows n_threads)."""
    values = {k: v for k, v in param_values(ns).items() if k in _CONTEXT_FIELDS}
    return config.ContextParams(**{**values, **fields})


def exit_on_flag_error(ap: argparse.ArgumentParser, e: ValueError) -> None:
    """A ParamError of a parameter that has a flag here exits as argparse reports a bad flag value (status
    2): "argument -ts/--tensor-split: <the message Llama raises>". Anything else returns, for the tool to
    report as "tool: error: <message>" (the rules between parameters)."""
    if isinstance(e, config.ParamError):
        flag = next(("/".join(f.names) for f in MODEL_FLAGS if f.param_name == e.param), None)
        if flag is not None:
            ap.error(f"argument {flag}: {e}")


def tool_config(ns: argparse.Namespace, **context_fields: Any) -> tuple[config.ModelParams, config.ContextParams]:
    """Both objects of a tool's flags (one value each), and the rules between them (config.check_combination);
    ValueError or TypeError naming the parameter."""
    model, context = model_params(ns), context_params(ns, **context_fields)
    config.check_combination(model, context)
    return model, context
