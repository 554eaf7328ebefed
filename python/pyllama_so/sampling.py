"""Token sampling from a logits row: greedy, or temperature with top-k / top-p / min-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from one row of logits."""
    if params.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / params.temperature
    order = np.argsort(-x, kind="stable")
    if params.top_k:
        order = order[: params.top_k]
    p = np.exp(x[order] - x[order[0]])
    p /= p.sum()
    keep = int(np.searchsorted(np.cumsum(p), params.top_p) + 1)  # smallest prefix with mass >= top_p
    keep = min(keep, len(order))
    if params.min_p:
        keep = min(keep, max(1, int(np.count_nonzero(p[:keep] >= params.min_p * p[0]))))
    p = p[:keep] / p[:keep].sum()
    return int(order[rng.choice(keep, p=p)])
