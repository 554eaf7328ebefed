"""Per-token log-probabilities: the rows of generated and prompt tokens (TokenLogprob), handed out with the text
they start in (LogprobRows), and their llama-cpp-python (completion) and OpenAI chat shapes. Llama and the
server's slots build the same rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, offset in prompt + completion, log-probability and the top
    alternatives as (text, logprob), best first; token and top_tokens are their ids."""

    text: str
    offset: int
    logprob: float | None
    top: tuple[tuple[str, float], ...]
    token: int = -1
    top_tokens: tuple[int, ...] = ()


class LogprobRows:
    """The logprobs of generated tokens, handed out with the text chunk they start in (Llama's stream and
    the server's slots): piece(token) is a token's text, prompt_len where the completion's offsets start."""

    def __init__(self, piece: Callable[[int], str], prompt_len: int = 0) -> None:
        self._piece = piece
        self._offset = prompt_len
        self._prompt_len = prompt_len
        self._rows: list[TokenLogprob] = []

    def add(self, token: int, logprobs: tuple[float | None, list[tuple[int, float]]] | None) -> None:
        assert logprobs is not None
        lp, top = logprobs
        text = self._piece(token)
        self._rows.append(TokenLogprob(text, self._offset, lp, tuple((self._piece(i), v) for i, v in top), token,
                                       tuple(i for i, _ in top)))
        self._offset += len(text)

    def take(self, sent: int, final: bool = False) -> list[TokenLogprob]:
        """The tokens whose text starts within the first `sent` characters of the completion; final: the
        rest is dropped (tokens past a stop string)."""
        limit = self._prompt_len + sent
        ready = [r for r in self._rows if r.offset < limit or (r.offset == limit and not r.text)]
        self._rows = [] if final else self._rows[len(ready):]
        return ready


def prompt_logprob_rows(tokens: Sequence[int], scored: Sequence[tuple[float | None, list[tuple[int, float]]]],
                        piece: Callable[[int], str], bos: int) -> list[TokenLogprob]:
    """echo with logprobs: a row per prompt token, a leading BOS left out, offsets from the prompt's start.
    scored[i - 1] is token i's (Context.decode_logprobs); the first row listed has neither a logprob nor
    alternatives (null in llama-cpp-python's and OpenAI's format, even after a BOS)."""
    rows, offset = [], 0
    first = 1 if tokens and tokens[0] == bos else 0
    for i in range(first, len(tokens)):
        text = piece(tokens[i])
        lp, top = scored[i - 1] if i > first else (None, [])
        rows.append(TokenLogprob(text, offset, lp, tuple((piece(t), v) for t, v in top), tokens[i],
                                 tuple(t for t, _ in top)))
        offset += len(text)
    return rows


def completion_logprobs(rows: Sequence[TokenLogprob]) -> dict[str, list[Any]]:
    """llama-cpp-python's (and OpenAI's legacy completions) format: top alternatives as {text: logprob},
    the token itself included; null for a row without either (an echoed prompt's first token)."""
    tops: list[dict[str, float] | None] = []
    for r in rows:
        alternatives = dict(r.top)
        if r.logprob is not None:
            alternatives[r.text] = r.logprob
        tops.append(alternatives if alternatives else None)
    return {"tokens": [r.text for r in rows], "text_offset": [r.offset for r in rows],
            "token_logprobs": [r.logprob for r in rows], "top_logprobs": tops}


def chat_logprobs(rows: Sequence[TokenLogprob]) -> dict[str, list[dict[str, Any]]]:
    """OpenAI's chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    def entry(text: str, lp: float | None) -> dict[str, Any]:
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**entry(r.text, r.logprob), "top_logprobs": [entry(t, v) for t, v in r.top]} for r in rows]}
