"""A Llama's state as save_state / load_state carry it (LlamaState, llama-cpp-python's attributes), and the seeds
of its calls (CallSeeds): what a prompt cache (pyllama_so.cache) keeps and gives back."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pyllama_so import _llama
from pyllama_so.generation.session import Session


class LlamaState:
    """A snapshot of a Llama (save_state / load_state), with llama-cpp-python's attributes: the tokens held
    (input_ids, n_tokens), their logits rows when the Llama keeps them (scores, logits_all=True; else 0
    rows), llama.cpp's context state (llama_state, llama_state_size bytes: KV cache, last logits) and the
    seed. rng_state is the Llama's random generator, so that sampling goes on exactly as after the save."""

    def __init__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single], n_tokens: int,
                 llama_state: bytes, llama_state_size: int, seed: int,
                 rng_state: dict[str, Any] | None = None) -> None:
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed
        self.rng_state = rng_state


def seed_in_use(seed: int | None) -> int:
    """The seed of a Llama's generator: the one given, or for None or -1 (random, as llama.cpp's
    LLAMA_DEFAULT_SEED) one drawn now, so that save_state() can say which seed a run used."""
    if seed is None or seed == -1:
        return int(np.random.default_rng().integers(0, 2**32 - 1))
    return int(seed)


class CallSeeds:
    """The seeds of a Llama's calls: a call's own, else the next from a generator started from the Llama's seed
    (Llama(seed=...), set_seed), so that a seeded Llama's calls repeat."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed_in_use(seed)
        self.rng = np.random.default_rng(self.seed)

    def restart(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed_in_use(int(seed))
        self.rng = np.random.default_rng(self.seed)

    def for_call(self, seed: int | None) -> int:
        """A call's seed: the one given, else the next from the generator."""
        if seed is None or seed == -1:
            return int(self.rng.integers(0, 2**32 - 1))
        return seed


def save(seq: Session, seeds: CallSeeds) -> LlamaState:
    """The context's state (llama_state_get_data) with the tokens, kept logits rows and seeds."""
    data = _llama.context_state(seq.ctx)
    n = len(seq.tokens)
    scores = (seq.scores_rows()[:n].copy() if seq.logits_all
              else np.empty((0, seq.ctx.model.n_vocab), dtype=np.single))
    return LlamaState(input_ids=np.array(seq.tokens, dtype=np.intc), scores=scores, n_tokens=n, llama_state=data,
                      llama_state_size=len(data), seed=seeds.seed, rng_state=dict(seeds.rng.bit_generator.state))


def load(seq: Session, seeds: CallSeeds, state: LlamaState) -> None:
    """Restore a save() of a Llama on the same model and context size (llama_state_set_data); a state that does
    not fit is a LlamaError and leaves the context empty."""
    ctx, n_vocab = seq.ctx, seq.ctx.model.n_vocab
    n = int(state.n_tokens)
    ids = np.asarray(state.input_ids).reshape(-1)
    if not 0 <= n <= min(len(ids), ctx.n_ctx):
        raise ValueError(f"state.n_tokens {n} does not fit its input_ids ({len(ids)}) or n_ctx ({ctx.n_ctx})")
    tokens = [int(t) for t in ids[:n]]
    if any(not 0 <= t < n_vocab for t in tokens):
        raise ValueError(f"state.input_ids has token ids outside [0, {n_vocab})")
    data = bytes(state.llama_state)[: int(state.llama_state_size)]
    try:
        _llama.set_context_state(ctx, data)
    except BaseException:
        seq.tokens.clear()
        raise
    seq.tokens[:] = tokens
    rows = np.asarray(state.scores)
    if seq.logits_all and rows.ndim == 2 and rows.shape[0] >= n and rows.shape[1] == n_vocab:
        seq.keep_rows(0, rows[:n])
    seeds.seed = state.seed
    rng_state = getattr(state, "rng_state", None)
    if rng_state is not None:
        seeds.rng.bit_generator.state = rng_state
    else:
        seeds.rng = np.random.default_rng(state.seed)
