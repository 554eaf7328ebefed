"""AllReduce paths of the CUDA backend under ``split_mode="tensor"``: counters and per-context settings.

Two GPUs reduce partial results twice per layer. Each reduction runs on one of these paths
(see docs/multi-gpu.md):

``ce``        copy engines through pinned host memory (GPUs without peer access, >= 512 KiB)
``nccl``      NCCL
``internal``  llama.cpp's internal 2-GPU pipeline (reductions between the ``ll`` and ``ce`` sizes)
``fallback``  declined by the CUDA backend; the meta backend's generic reduction ran
``ll``        low latency: data and flags in one store through pinned host memory (GPUs without peer
              access, up to 64 KiB: a decode token's reductions)

Each context takes its own settings (``AllReduceParams``; a knob left None takes its environment variable,
the command line's setting, else the built-in default) and counts its own reductions::

    from pyllama_so import Llama
    from pyllama_so.allreduce import AllReduceParams
    with Llama(path, split_mode="tensor", allreduce=AllReduceParams(copy_engines=True)) as llm:
        llm("...")
        routing = llm.allreduce_routing()
        print(routing.copy_engines_on, routing.paths["ce"].calls)

``allreduce_stats()`` sums the counters of every context of the process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pyllama_so import _llama
from pyllama_so.config import (
    CHUNK_BYTES_RANGE,
    ENV_CE,
    ENV_CE_CHUNK_BYTES,
    ENV_CE_MIN_BYTES,
    ENV_LL_MAX_BYTES,
    LL_MAX_BYTES_LIMIT,
    AllReduceParams,
)

__all__ = [
    "PATHS",
    "PathStats",
    "AllReduceStats",
    "allreduce_stats",
    "reset_allreduce_stats",
    "AllReduceParams",
    "AllReduceRouting",
    "context_routing",
    "allreduce_available",
    "CHUNK_BYTES_RANGE",
    "LL_MAX_BYTES_LIMIT",
    "ENV_CE",
    "ENV_CE_MIN_BYTES",
    "ENV_CE_CHUNK_BYTES",
    "ENV_LL_MAX_BYTES",
    "ENV_ALLREDUCE",
]

PATHS: tuple[str, ...] = tuple(_llama.ALLREDUCE_PATHS)

ENV_ALLREDUCE = "GGML_CUDA_ALLREDUCE"  # upstream's base path: nccl, internal, none (read when a comm context is made)


@dataclass(frozen=True)
class PathStats:
    calls: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class AllReduceStats:
    """Counters summed over every comm context of this process since the last reset."""

    available: bool = False
    paths: dict[str, PathStats] = field(default_factory=lambda: {p: PathStats() for p in PATHS})
    ce_rounds: int = 0
    ce_buffer_allocs: int = 0
    ce_alloc_failures: int = 0

    @property
    def total_calls(self) -> int:
        return sum(p.calls for p in self.paths.values())

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def allreduce_available() -> bool:
    """True when this build has the CUDA backend (and so the AllReduce paths and counters)."""
    return bool(_llama.allreduce_available())


def allreduce_stats() -> AllReduceStats:
    """Reductions and bytes per path. All zeros, ``available=False``, in a build without CUDA."""
    raw = _llama.allreduce_stats()
    return AllReduceStats(
        available=bool(raw["available"]),
        paths=_paths(raw["paths"]),
        ce_rounds=raw["ce_rounds"],
        ce_buffer_allocs=raw["ce_buffer_allocs"],
        ce_alloc_failures=raw["ce_alloc_failures"],
    )


def reset_allreduce_stats() -> None:
    _llama.allreduce_stats_reset()


def _paths(raw: dict[str, dict[str, int]]) -> dict[str, PathStats]:
    return {name: PathStats(**raw[name]) for name in PATHS}


@dataclass(frozen=True)
class AllReduceRouting:
    """One context's AllReduce settings, as its comm contexts use them, and its own reductions per path.

    comm_contexts: the comm contexts that reported (0: the context has none that takes settings, e.g. no
    split_mode="tensor", and every other field is zero; 2 with split-overlap lanes, whose counters are summed).
    copy_engines: the mode (None automatic, True forced, False never); copy_engines_on: whether this context's
    large reductions go to the copy engines (the mode, two CUDA devices, their peer access). min_bytes,
    chunk_bytes (None: automatic), ll_max_bytes: the thresholds (AllReduceParams). The CPU virtual devices take
    the settings and report them, and count nothing: their one reduction is none of these paths.
    """

    comm_contexts: int = 0
    copy_engines: bool | None = None
    copy_engines_on: bool = False
    min_bytes: int = 0
    chunk_bytes: int | None = None
    ll_max_bytes: int = 0
    paths: dict[str, PathStats] = field(default_factory=lambda: {p: PathStats() for p in PATHS})
    ce_rounds: int = 0

    @property
    def total_calls(self) -> int:
        return sum(p.calls for p in self.paths.values())

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def context_routing(ctx: _llama.Context) -> AllReduceRouting:
    """The AllReduce settings and counters of one context (Llama.allreduce_routing())."""
    raw: dict[str, Any] = ctx.allreduce_report()
    settings = raw["settings"]
    mode = settings["copy_engines"]  # -1 automatic, 0 never, 1 forced
    return AllReduceRouting(
        comm_contexts=raw["comm_contexts"],
        copy_engines=None if mode < 0 or not raw["comm_contexts"] else bool(mode),
        copy_engines_on=raw["ce_enabled"],
        min_bytes=settings["min_bytes"],
        chunk_bytes=settings["chunk_bytes"] or None,
        ll_max_bytes=settings["ll_max_bytes"],
        paths=_paths(raw["paths"]),
        ce_rounds=raw["ce_rounds"],
    )
