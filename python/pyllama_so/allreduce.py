"""AllReduce paths of the CUDA backend under ``split_mode="tensor"``: counters and configuration.

Two GPUs reduce partial results twice per layer. Each reduction runs on one of these paths
(see docs/multi-gpu.md):

``ce``        copy engines through pinned host memory (GPUs without peer access, >= 512 KiB)
``nccl``      NCCL
``internal``  llama.cpp's internal 2-GPU pipeline (reductions between the ``ll`` and ``ce`` sizes)
``fallback``  declined by the CUDA backend; the meta backend's generic reduction ran
``ll``        low latency: data and flags in one store through pinned host memory (GPUs without peer
              access, up to 64 KiB: a decode token's reductions)

Example::

    from pyllama_so import allreduce
    allreduce.configure_allreduce(copy_engines=True)   # before creating the Llama
    with Llama(path, split_mode="tensor") as llm:
        allreduce.reset_allreduce_stats()
        llm("...")
        print(allreduce.allreduce_stats().paths["ce"].calls)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from pyllama_so import _llama
from pyllama_so.config import ParamError

__all__ = [
    "PATHS",
    "PathStats",
    "AllReduceStats",
    "allreduce_stats",
    "reset_allreduce_stats",
    "AllReduceParams",
    "configure_allreduce",
    "allreduce_available",
]

PATHS: tuple[str, ...] = tuple(_llama.ALLREDUCE_PATHS)

ENV_CE = "GGML_CUDA_AR_CE"
ENV_CE_MIN_BYTES = "GGML_CUDA_AR_CE_MIN_BYTES"
ENV_CE_CHUNK_BYTES = "GGML_CUDA_AR_CE_CHUNK_BYTES"
ENV_LL_MAX_BYTES = "GGML_CUDA_AR_LL_MAX_BYTES"
ENV_ALLREDUCE = "GGML_CUDA_ALLREDUCE"  # upstream's base path: nccl, internal, none
CHUNK_BYTES_RANGE = (64 << 10, 4 << 20)
LL_MAX_BYTES_LIMIT = 4 << 20


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
        paths={name: PathStats(**raw["paths"][name]) for name in PATHS},
        ce_rounds=raw["ce_rounds"],
        ce_buffer_allocs=raw["ce_buffer_allocs"],
        ce_alloc_failures=raw["ce_alloc_failures"],
    )


def reset_allreduce_stats() -> None:
    _llama.allreduce_stats_reset()


@dataclass(frozen=True)
class AllReduceParams:
    """The copy-engine knobs of the CUDA comm context, checked (ParamError naming the knob, TypeError for a
    wrong type).

    copy_engines: None = automatic (copy engines for large reductions between GPUs without peer
        access), True = force them even with peer access, False = never (upstream routing).
    min_bytes: smallest reduction (bytes of the F32 tensor) that goes to the copy engines; None =
        default (512 KiB); 1 = every reduction.
    chunk_bytes: bytes per copy-engine copy, a power of two from 64 KiB to 4 MiB; None = automatic
        (1 MiB below 8 MiB of BF16 payload, 2 MiB from there). Smaller chunks start the receiving
        copies sooner but each copy has a fixed cost.
    ll_max_bytes: largest reduction (bytes of the F32 tensor) for the low-latency path, where the copy
        engines are on; None = default (64 KiB); 0 = never (the internal pipeline takes them); at most 4 MiB.

    They are not part of config.ModelParams / ContextParams: the CUDA backend reads them only from
    environment variables, once per comm context, when the context is created
    (ggml/src/ggml-cuda/allreduce-ce.cu, ggml_cuda_ce_router_init), so they reach it through
    environment() (configure_allreduce sets it for the process).
    """

    copy_engines: bool | None = None
    min_bytes: int | None = None
    chunk_bytes: int | None = None
    ll_max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.copy_engines is not None and not isinstance(self.copy_engines, bool):
            raise TypeError(f"copy_engines must be bool or None, not {type(self.copy_engines).__name__}")
        _check_int("min_bytes", self.min_bytes)
        _check_int("chunk_bytes", self.chunk_bytes)
        _check_int("ll_max_bytes", self.ll_max_bytes)
        if self.ll_max_bytes is not None and not 0 <= self.ll_max_bytes <= LL_MAX_BYTES_LIMIT:
            raise ParamError("ll_max_bytes",
                             f"ll_max_bytes must be from 0 to {LL_MAX_BYTES_LIMIT}, got {self.ll_max_bytes}")
        if self.min_bytes is not None and self.min_bytes < 1:
            raise ParamError("min_bytes", f"min_bytes must be >= 1, got {self.min_bytes}")
        if self.chunk_bytes is not None:
            lo, hi = CHUNK_BYTES_RANGE
            if not lo <= self.chunk_bytes <= hi or self.chunk_bytes & (self.chunk_bytes - 1):
                raise ParamError("chunk_bytes",
                                 f"chunk_bytes must be a power of two from {lo} to {hi}, got {self.chunk_bytes}")

    def environment(self) -> dict[str, str | None]:
        """The variables that say this (None: unset, the automatic choice)."""
        return {
            ENV_CE: None if self.copy_engines is None else ("1" if self.copy_engines else "0"),
            ENV_CE_MIN_BYTES: None if self.min_bytes is None else str(self.min_bytes),
            ENV_CE_CHUNK_BYTES: None if self.chunk_bytes is None else str(self.chunk_bytes),
            ENV_LL_MAX_BYTES: None if self.ll_max_bytes is None else str(self.ll_max_bytes),
        }


def configure_allreduce(copy_engines: bool | None = None, min_bytes: int | None = None,
                        chunk_bytes: int | None = None, ll_max_bytes: int | None = None) -> None:
    """Set the copy-engine knobs (AllReduceParams) for comm contexts created from now on, through their
    environment variables (GGML_CUDA_AR_CE, GGML_CUDA_AR_CE_MIN_BYTES, GGML_CUDA_AR_CE_CHUNK_BYTES,
    GGML_CUDA_AR_LL_MAX_BYTES; a knob left None is unset).

    Must be called before creating a ``Llama`` (or anything else that builds a ``split_mode="tensor"``
    context): the CUDA backend reads the variables when it creates the comm context, not later. Nothing
    is set when a value is refused.
    """
    set_env(AllReduceParams(copy_engines, min_bytes, chunk_bytes, ll_max_bytes).environment())


def _check_int(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be int or None, not {type(value).__name__}")


@contextlib.contextmanager
def environ(changes: dict[str, str | None]) -> Iterator[None]:
    """Set (or remove, for None) the variables for the duration, then restore what was there."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        set_env(changes)
        yield
    finally:
        set_env(saved)


def set_env(values: dict[str, str | None]) -> None:
    """Set each variable, or remove it where the value is None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
