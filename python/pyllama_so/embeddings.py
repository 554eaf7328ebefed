"""Embeddings of several inputs in an embedding context: packed into batches, read back pooled or per
token, and normalised. Llama.embed and the server's embedding routes both use it.

A batch holds at most min(n_batch, n_ubatch) tokens, so that no sequence straddles two ubatches (llama.cpp
pools each ubatch on its own), and at most n_seq_max sequences (each input is one sequence).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pyllama_so import _llama
from pyllama_so.config import ModelParams

# llama-server's embd_normalize: -1 none, 0 max absolute (int16 range), 1 taxicab, 2 Euclidean, > 2 p-norm
EUCLIDEAN = 2


def embedding_sequences(n_batch: int, model: ModelParams) -> int:
    """The inputs one embedding batch may hold (an embedding context's n_seq_max). Under tensor split, one:
    the Meta backend reads an output tensor only from its start (GGML_ASSERT(offset == 0) in
    ggml-backend-meta.cpp), and a pooled sequence other than the first of a batch is read at an offset."""
    return 1 if model.split_mode == "tensor" else min(n_batch, _llama.max_parallel_sequences())


def batch_limit(ctx: _llama.Context) -> int:
    """The most tokens one embedding batch (and so one input) may have in this context."""
    return min(ctx.n_batch, ctx.n_ubatch, ctx.n_ctx)


def normalize(vec: np.ndarray, norm: int = EUCLIDEAN) -> np.ndarray:
    """vec scaled as llama-server's common_embd_normalize does: by its p-norm (norm >= 1; 2 is L2), by
    max|x| / 32760 (norm 0, an int16 range), or not at all (norm -1). A zero vector stays zero."""
    if not isinstance(norm, int) or isinstance(norm, bool) or norm < -1:
        raise ValueError(f"embd_normalize must be an integer >= -1, got {norm!r}")
    v = np.asarray(vec, dtype=np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = float(np.abs(v).max(initial=0.0)) / 32760.0
    else:
        total = float((np.abs(v) ** norm).sum() ** (1.0 / norm))
    scale = 1.0 / total if total > 0 else 0.0
    return (v * scale).astype(np.float32)


def _batches(lengths: Sequence[int], limit: int, n_seq_max: int) -> Iterator[list[int]]:
    """Indices of consecutive inputs per batch: up to `limit` tokens and n_seq_max inputs each."""
    batch: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if batch and (used + n > limit or len(batch) >= n_seq_max):
            yield batch
            batch, used = [], 0
        batch.append(i)
        used += n
    if batch:
        yield batch


def embed_tokens(ctx: _llama.Context, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """One float32 array per input, in order: (n_tokens, n_embd_out) with pooling "none", else pooled
    (n_embd_out,) (pooling "rank": the classifier's scores). The context must have been made with
    embeddings=True; its memory is empty afterwards and it outputs no embeddings (for generation)."""
    if ctx.model.has_encoder and ctx.model.has_decoder:
        raise ValueError("embeddings of encoder-decoder models are not supported")
    limit = batch_limit(ctx)
    lengths = [len(t) for t in inputs]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"input {i} has no tokens")
        if n > limit:
            raise ValueError(f"input {i} has {n} tokens, more than one embedding batch of {limit} "
                             "(n_batch, n_ubatch and n_ctx bound it)")
    out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(inputs)
    ctx.set_embeddings(True)
    try:
        for batch in _batches(lengths, limit, ctx.n_seq_max):
            for i, emb in zip(batch, _llama.embed_sequences(ctx, [list(inputs[i]) for i in batch]), strict=True):
                out[i] = emb
    finally:
        ctx.set_embeddings(False)
    return out


def embedding_inputs(input: str | list[str]) -> list[str]:
    """Llama.embed's input (a str or a list of str) as a list; ValueError for anything else."""
    if isinstance(input, str):
        return [input]
    if isinstance(input, list) and all(isinstance(t, str) for t in input):
        return input
    raise ValueError("input must be a str or a list of str")


def embedding_lists(arrays: Sequence[np.ndarray], normalized: bool) -> list[Any]:
    """embed_tokens' arrays as llama-cpp-python returns them, lists of floats (a list per token with pooling
    "none"); normalized: each vector divided by its Euclidean norm."""
    data = []
    for emb in arrays:
        if normalized:
            emb = np.stack([normalize(r) for r in emb]) if emb.ndim == 2 else normalize(emb)
        data.append(emb.tolist())
    return data
