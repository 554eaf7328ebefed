"""Prompt scoring (echo with logprobs): every prompt token given the ones before it, in C."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pyllama_so import _llama
from pyllama_so.generation.logprobs import TokenLogprob, prompt_logprob_rows


def score_prompt(ctx: _llama.Context, seq_id: int, held: list[int], prompt: Sequence[int], n_top: int,
                 piece: Callable[[int], str], bos: int, *, rows: np.ndarray | None = None) -> list[TokenLogprob]:
    """The sequence emptied and the whole prompt evaluated into it from its start with an output at every token,
    each token after the first scored from the row before it (Context.decode_logprobs, its n_top alternatives);
    a row per prompt token, a leading BOS left out (prompt_logprob_rows). Afterwards held is the prompt and the
    last token's logits are the context's last output. A decode that fails leaves the sequence empty.
    rows: a (len(prompt), n_vocab) float32 array that receives each token's logits row (Llama's logits_all)."""
    ctx.truncate(0, seq_id)
    held.clear()
    try:
        scored = ctx.decode_logprobs(prompt, n_top, seq_id=seq_id, rows=rows)
    except BaseException:
        ctx.truncate(0, seq_id)
        raise
    held.extend(int(t) for t in prompt)
    return prompt_logprob_rows(prompt, scored, piece, bos)
