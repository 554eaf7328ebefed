"""Where a sequence's generation may go: the prompt that fits a context, max_tokens as llama-cpp-python reads it,
and the context-end rule. Llama's generation loop and the server's slots ask these, so that both stop at the same
token."""

from __future__ import annotations

import numpy as np


def max_tokens_limit(max_tokens: int | None) -> int | None:
    """max_tokens as llama-cpp-python reads it: None, 0 or a negative count generate up to the end of the
    context (returned as None); a positive count at most that many tokens. The server follows the same
    rule. ValueError for anything but an integer or None."""
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
        raise ValueError(f"max_tokens must be an integer or None, got {max_tokens!r}")
    return int(max_tokens) if max_tokens > 0 else None


def prompt_fits(n_prompt: int, n_ctx: int, *, generates: bool = True) -> bool:
    """Whether a prompt of n_prompt tokens fits a sequence's context of n_ctx: with room for one generated
    token after it when it generates (llama-server refuses n_tokens >= n_ctx, llama-cpp-python too); a prompt
    only evaluated into the cache (max_tokens 0 on the server) may fill it."""
    return n_prompt <= n_ctx - generates


def at_context_end(n_cached: int, n_ctx: int) -> bool:
    """After a generated token (sampled, not yet decoded) of a sequence whose cache holds n_cached tokens:
    whether prompt and completion fill the context, the most they may (llama-server's and llama-cpp-python's
    cap): that token is sent, never decoded."""
    return n_cached + 1 >= n_ctx


def goes_on(n_generated: int, n_cached: int, max_tokens: int | None, n_ctx: int) -> bool:
    """Whether a sequence that generated n_generated tokens (end-of-generation ones not counted; the last one
    sampled, not yet decoded) and whose cache holds n_cached decodes its last token and samples another: below
    max_tokens (None: no limit) and short of the context's end."""
    return (max_tokens is None or n_generated < max_tokens) and not at_context_end(n_cached, n_ctx)
