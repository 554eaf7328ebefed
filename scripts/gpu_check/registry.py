"""The stages of scripts/gpu-check by name: each a small function registered with @stage, run in ORDER."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import Context

# The order stages run in, whatever order --stages names them in: the builds first, arbench before tpbench
# (ce_best reads its sweep), upserver before serverload and servertrace (they use its llama-server), and the
# long optional stages last, so that the time budget cuts those.
ORDER = ("build", "probe", "smoke", "tests", "arbench", "tpbench", "sobench", "so2bench", "decode", "server",
         "generation", "sanitize", "bench", "upserver", "serverload", "mixedload", "precision", "logits",
         "profile", "steptrace", "servertrace")


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Context], None]
    default: bool  # run when --stages is not given

    @property
    def summary(self) -> str:
        """What the stage does: its function's docstring, on one line."""
        return " ".join((self.run.__doc__ or "").split())


STAGES: dict[str, Stage] = {}


def stage(name: str, default: bool = True) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    """Register the decorated function as the stage `name`."""
    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        assert name in ORDER, f"stage {name} has no place in ORDER"
        assert name not in STAGES, f"stage {name} registered twice"
        STAGES[name] = Stage(name, fn, default)
        return fn
    return register


def registered() -> list[Stage]:
    """Every stage, in the order they run."""
    from . import benches, checks, servers, traces  # noqa: F401  (importing them registers their stages)

    return [STAGES[name] for name in ORDER]


def default_names() -> list[str]:
    return [s.name for s in registered() if s.default]
