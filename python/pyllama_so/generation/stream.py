"""A completion's output as its tokens come: the text that became final (TextStream) with the logprobs rows of the
tokens it starts (LogprobRows), as Llama's stream and the server's slots send them."""

from __future__ import annotations

from pyllama_so import _llama
from pyllama_so.generation.logprobs import LogprobRows, TokenLogprob
from pyllama_so.generation.text import piece_of, text_stream


class CompletionStream:
    """push() each generated token (not an end-of-generation one) with its logprobs, send what it returns; after
    the last, finish() gives the rest. logprobs: rows are kept (the request asked for them); prompt_len: the
    characters before the completion, where the rows' offsets start."""

    def __init__(self, model: _llama.Model, stops: list[str], *, special: bool = False, logprobs: bool = False,
                 prompt_len: int = 0) -> None:
        self.text = text_stream(model, stops, special)
        self.rows = LogprobRows(piece_of(model), prompt_len) if logprobs else None
        self.sent = 0  # characters of text handed out

    @property
    def tokens(self) -> list[int]:
        return self.text.tokens

    @property
    def stopped(self) -> bool:
        """A stop string ended the text: push() must not be called again."""
        return self.text.stopped

    def push(self, token: int, logprobs: tuple[float | None, list[tuple[int, float]]] | None = None
             ) -> tuple[str, list[TokenLogprob]]:
        """The text that became final with this token (maybe "") and the rows of the tokens it starts."""
        if self.rows is not None:
            self.rows.add(token, logprobs)
        ready = self.text.push(token)
        if not ready:
            return "", []
        self.sent += len(ready)
        return ready, self.rows.take(self.sent) if self.rows is not None else []

    def finish(self, suffix: str = "") -> tuple[str, list[TokenLogprob] | None]:
        """The text held back (then suffix) and the rows not yet handed out (None without logprobs)."""
        tail = self.text.finish() + suffix
        self.sent += len(tail)
        return tail, self.rows.take(self.sent, final=True) if self.rows is not None else None
