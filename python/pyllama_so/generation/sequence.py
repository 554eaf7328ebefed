"""A sequence's cache in a llama.cpp context: which of its tokens a new prompt reuses, and cutting it back.

A sequence is (ctx, seq_id) with `held`, the list of the tokens its part of the KV cache holds, in order: Llama's
one sequence (seq_id 0) and each server slot's. The functions here change the context and `held` together, so that
`held` stays what the cache holds. A memory that cannot drop a suffix (a recurrent model's) starts over: the
sequence is emptied and the prompt evaluated whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyllama_so import _llama


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of a's and b's common prefix (numpy: prompts may have 100k tokens)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def cut(ctx: _llama.Context, seq_id: int, held: list[int], keep: int) -> int:
    """Drop the sequence's tokens from position keep on (nothing when it holds at most keep). A memory that
    cannot drop a suffix is emptied instead. Returns how many tokens the sequence holds afterwards (keep, or 0)."""
    if keep >= len(held):
        return len(held)
    try:
        ctx.truncate(keep, seq_id)
    except _llama.LlamaError:  # memories that cannot drop a suffix start over
        ctx.truncate(0, seq_id)
        keep = 0
    del held[keep:]
    return keep


def reusable_prefix(held: Sequence[int], prompt: Sequence[int], shared: int | None = None) -> int:
    """How many of prompt's tokens a sequence holding `held` keeps: their common prefix, short of the prompt's last
    token, which is always evaluated for its logits. shared: common_prefix(held, prompt) where the caller has it."""
    return min(common_prefix(held, prompt) if shared is None else shared, len(prompt) - 1)


def reuse_prefix(ctx: _llama.Context, seq_id: int, held: list[int], prompt: Sequence[int], *,
                 reuse: bool = True, shared: int | None = None) -> int:
    """Bring the sequence to the longest prefix of prompt it holds (reusable_prefix; with reuse=False, to
    nothing: the whole prompt is evaluated), cutting what follows. Returns the prompt tokens kept, so that
    prompt[returned:] is what is left to evaluate; held is prompt[:returned] afterwards."""
    keep = reusable_prefix(held, prompt, shared) if reuse else 0
    return cut(ctx, seq_id, held, keep)
