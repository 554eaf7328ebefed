"""Command-line values shared by the tools: llama.cpp's flag spellings, parsers and LLAMA_ARG_* defaults."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TypeVar

from pyllama_so import _llama

T = TypeVar("T")

SPLIT_MODES = tuple(_llama.SPLIT_MODES)
FLASH_ATTN = {"0": "off", "off": "off", "false": "off", "1": "on", "on": "on", "true": "on", "auto": "auto"}
CACHE_TYPES = tuple(_llama.CACHE_TYPES)
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


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected an integer >= 1, got 0")
    return value


def gpu_layers(text: str) -> int:
    """-ngl: a count, or -1 / 'all' for every layer."""
    if text in ("all", "-1"):
        return -1
    return non_negative_int(text)


def choice(options: dict[str, str] | tuple[str, ...], what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        key = text.lower()
        if key not in options:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; expected one of {', '.join(options)}")
        return options[key] if isinstance(options, dict) else key

    return parse


def boolean(text: str) -> bool:
    key = text.lower()
    if key not in BOOL:
        raise argparse.ArgumentTypeError(f"expected 0/1, got {text!r}")
    return BOOL[key]


def tensor_split(text: str) -> tuple[float, ...]:
    """-ts: proportions per device separated by '/', e.g. 1/1 or 3/1."""
    try:
        values = tuple(float(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad tensor split {text!r}; expected e.g. 1/1") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"tensor split proportions must be finite and >= 0: {text!r}")
    return values


def pp_tg_pair(text: str) -> tuple[int, int]:
    """-pg: 'pp,tg' pairs, given as e.g. 512,128."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected pp,tg, got {text!r}")
    return positive_int(parts[0]), positive_int(parts[1])
