"""Request prompts to token ids, for every generation endpoint: token ids checked against the vocabulary,
texts tokenized, and llama-server's mixed prompts ([12, 34, "text", 56]) where the first element alone gets
the vocabulary's special tokens (BOS) when it is a text (tokenize_mixed in tools/server/server-common.cpp).
A bad id or an empty prompt is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Sequence

from pyllama_so import _llama
from pyllama_so.server.errors import ApiError


def checked_ids(model: _llama.Model, ids: Sequence[int], param: str) -> list[int]:
    """ids as ints; a 400 for the first outside the vocabulary."""
    n_vocab = model.n_vocab
    out = [int(t) for t in ids]
    bad = [t for t in out if not 0 <= t < n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} out of range [0, {n_vocab})", param=param)
    return out


def mixed_tokens(model: _llama.Model, prompt: str | Sequence[int | str], *, add_special: bool, parse_special: bool,
                 param: str) -> list[int]:
    """A text, token ids, or both mixed, as llama-server tokenizes them: add_special for a leading text only."""
    parts = [prompt] if isinstance(prompt, str) else list(prompt)
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            tokens += model.tokenize(part, add_special=add_special and i == 0, parse_special=parse_special).tolist()
        else:
            tokens += checked_ids(model, [part], param)
    return tokens


def nonempty(tokens: list[int], param: str) -> list[int]:
    if not tokens:
        raise ApiError(400, "the prompt is empty", param=param)
    return tokens
