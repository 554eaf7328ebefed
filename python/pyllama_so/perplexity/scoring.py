"""The numbers of one chunk: negative log-likelihoods, the base's distributions in compact form, and KL
divergences against them.

A base distribution is kept as its top k tokens (ids and log-probabilities) and the log of the probability
of all other tokens together (`rest`). The KL divergence against it is computed over those k + 1 outcomes:
KL(P || Q) = sum_i p_i (log p_i - log q_i) over the k tokens, plus p_rest (log p_rest - log q_rest). Merging
outcomes can only lower a divergence, so this is a lower bound of the full-vocabulary KLD; the tail that is
merged holds `rest` of the mass (reported as the mean rest mass), and with k >= n_vocab it is exact.

Log-probabilities are computed in float64 and rounded to float32 on both sides before they are compared,
so a distribution against itself gives exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROWS = 32  # rows of logits turned into float64 at a time (a row of a 262144-token vocabulary is 2 MiB)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of rows of logits, float64."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def _rest_logp(logp: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log of the probability of every token but ids (per row); -inf when ids cover the vocabulary."""
    masked = logp.copy()
    np.put_along_axis(masked, ids, -np.inf, axis=-1)
    top = masked.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.log(np.exp(masked - np.where(np.isfinite(top), top, 0.0)).sum(axis=-1)) + top[:, 0]
    return np.where(np.isfinite(top[:, 0]), out, -np.inf)


@dataclass
class BaseRows:
    """The base's distributions of some positions: top-k ids (best first) and log-probabilities, the log of
    the remaining mass, and the log-probability of the token that came next."""

    top_ids: np.ndarray  # (n, k) int32
    top_logp: np.ndarray  # (n, k) float32
    rest_logp: np.ndarray  # (n,) float32
    target_logp: np.ndarray  # (n,) float32

    @staticmethod
    def concat(parts: list[BaseRows]) -> BaseRows:
        return BaseRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                          ("top_ids", "top_logp", "rest_logp", "target_logp")))

    def slice(self, start: int, stop: int) -> BaseRows:
        return BaseRows(self.top_ids[start:stop], self.top_logp[start:stop], self.rest_logp[start:stop],
                        self.target_logp[start:stop])

    def __len__(self) -> int:
        return len(self.target_logp)


@dataclass
class Comparison:
    """Per position: KLD(base || this), whether the top tokens agree, and this model's probability of the next
    token (with the base's, Δp)."""

    kld: np.ndarray  # (n,) float64
    same_top: np.ndarray  # (n,) bool
    target_p: np.ndarray  # (n,) float64
    rest_p: np.ndarray  # (n,) float64: the base's mass outside its top k


def target_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) per row, float64."""
    out = np.empty(len(targets))
    for s in range(0, len(targets), ROWS):
        lp = log_softmax(logits[s:s + ROWS])
        out[s:s + ROWS] = -lp[np.arange(len(lp)), targets[s:s + ROWS]]
    return out


def base_rows(logits: np.ndarray, targets: np.ndarray, top_k: int) -> BaseRows:
    """The compact form of the distributions of rows of logits (targets: the token that followed each)."""
    n, n_vocab = logits.shape
    k = min(top_k, n_vocab)
    parts = []
    for s in range(0, n, ROWS):
        lp = log_softmax(logits[s:s + ROWS])
        ids = np.argpartition(-lp, k - 1, axis=-1)[:, :k] if k < n_vocab else np.tile(np.arange(n_vocab), (len(lp), 1))
        top = np.take_along_axis(lp, ids, axis=-1)
        order = np.argsort(-top, axis=-1, kind="stable")
        ids, top = np.take_along_axis(ids, order, axis=-1), np.take_along_axis(top, order, axis=-1)
        parts.append(BaseRows(ids.astype(np.int32), top.astype(np.float32), _rest_logp(lp, ids).astype(np.float32),
                              lp[np.arange(len(lp)), targets[s:s + ROWS]].astype(np.float32)))
    return BaseRows.concat(parts)


def compare(logits: np.ndarray, targets: np.ndarray, base: BaseRows) -> Comparison:
    """This model's rows of logits against the base's rows of the same positions."""
    n = len(targets)
    if len(base) != n:
        raise ValueError(f"{n} rows of logits against {len(base)} rows of the base")
    kld, same, target_p, rest_p = (np.empty(n), np.empty(n, dtype=bool), np.empty(n), np.empty(n))
    for s in range(0, n, ROWS):
        b = base.slice(s, s + ROWS)
        lp = log_softmax(logits[s:s + ROWS])
        q_top = np.take_along_axis(lp, b.top_ids.astype(np.int64), axis=-1).astype(np.float32).astype(np.float64)
        q_rest = _rest_logp(lp, b.top_ids.astype(np.int64)).astype(np.float32).astype(np.float64)
        p_top = b.top_logp.astype(np.float64)
        p_rest = b.rest_logp.astype(np.float64)
        top_term = (np.exp(p_top) * (p_top - q_top)).sum(axis=-1)
        with np.errstate(invalid="ignore"):
            rest_term = np.where(np.isfinite(p_rest), np.exp(p_rest) * (p_rest - q_rest), 0.0)
        kld[s:s + ROWS] = top_term + rest_term
        same[s:s + ROWS] = lp.argmax(axis=-1) == b.top_ids[:, 0]
        target_p[s:s + ROWS] = np.exp(lp[np.arange(len(lp)), targets[s:s + ROWS]])
        rest_p[s:s + ROWS] = np.exp(p_rest)
    return Comparison(kld, same, target_p, rest_p)
