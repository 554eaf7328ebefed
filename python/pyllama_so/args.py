"""Command-line values shared by the tools: llama.cpp's flag spellings, parsers and LLAMA_ARG_* defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TypeVar

from pyllama_so import _llama

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


def add_rpc_argument(ap: argparse.ArgumentParser) -> None:
    """--rpc as llama.cpp spells it: RPC servers host:port,host:port, default LLAMA_ARG_RPC."""
    ap.add_argument("-rpc", "--rpc", type=rpc_servers, default=env_default("RPC", "") or None, metavar="SERVERS",
                    help="use the devices of these RPC servers (host:port,...; started with python -m "
                         "pyllama_so.rpc_server; env LLAMA_ARG_RPC)")


def boolean(text: str) -> bool:
    key = text.lower()
    if key not in BOOL:
        raise argparse.ArgumentTypeError(f"expected 0/1, got {text!r}")
    return BOOL[key]


def _proportions(text: str, sep: str, check: Callable[[list[float], int], list[float]], what: str,
                 example: str) -> tuple[float, ...]:
    """Proportions per device separated by sep, checked by the bindings' rule (as Llama checks them). The
    number of entries is checked only against llama.cpp's maximum: how many devices there are is known
    to the tool, after --rpc (check_device_count)."""
    try:
        values = [float(v) for v in text.split(sep)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad {what} {text!r}; expected e.g. {example}") from None
    try:
        return tuple(check(values, _llama.max_devices()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_device_count(ap: argparse.ArgumentParser, flag: str, splits: list[tuple[float, ...]],
                       check: Callable[[list[float]], list[float]]) -> None:
    """At most one entry per local device in each split of a flag (-ts, -as), as argparse reports an error
    (exit status 2). Tools skip it with --rpc: the servers' devices count too, once connected."""
    for split in splits:
        if split:  # () follows the default
            try:
                check(list(split))
            except ValueError as e:
                ap.error(f"argument {flag}: {e}")


def tensor_split(text: str) -> tuple[float, ...]:
    """-ts: proportions per device separated by '/', e.g. 1/1 or 3/1."""
    return _proportions(text, "/", _llama.check_tensor_split, "tensor split", "1/1")


def attn_split(text: str) -> tuple[float, ...]:
    """--attn-split / -as: the attention heads' proportions per device, as llama.cpp writes lists: 1/3 or
    1,3 (a 0 entry gives that device no attention)."""
    return _proportions(text, "/" if "/" in text else ",", _llama.check_attn_split, "attention split", "1/3 or 1,3")


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
