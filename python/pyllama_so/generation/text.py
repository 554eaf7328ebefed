"""Token text: a token's piece in a logprobs row, a completion's text, and generated tokens to text as it
becomes final (TextStream: UTF-8 decoded incrementally and cut at the first stop string).

Llama and the server's slots both make their text here, so that a server response is the text Llama gives
for the same tokens.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Sequence

from pyllama_so import _llama

CONTEXT = 8  # tokens before a new one that its rendering may depend on


class TextStream:
    """push() each generated token and send what it returns; finish() gives the rest.

    The text is detokenize(tokens) decoded with invalid bytes replaced. A tokenizer may render a token
    differently at the start of the text than after others, and may clean up spaces between neighbours,
    so a token's bytes are what detokenize adds for it after the tokens before it: the first CONTEXT
    tokens are detokenized whole, later ones through a window of the CONTEXT tokens before them (constant
    work per token; long generations would otherwise cost O(n) per token). Where the window's text is
    not a prefix of the window-plus-token's, the whole output is detokenized again. An incomplete
    trailing character waits in the decoder for the next token's bytes.
    Text that may be the start of a stop string is held back until it cannot be; a stop string is found
    as soon as it is complete, so it never starts in text already returned.
    """

    def __init__(self, detokenize: Callable[[list[int]], bytes], stops: Sequence[str] = ()) -> None:
        self._detokenize = detokenize
        self.stops = [s for s in stops if s]  # "" would stop at once
        self.tokens: list[int] = []
        self.stopped = False  # a stop string was found: push() must not be called again
        self.stop_word = ""  # the stop string found ("" until then)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._fed = 0  # bytes of the detokenized output given to the decoder
        self._text = ""
        self._sent = 0  # characters of _text returned
        self._hold = max((len(s) for s in self.stops), default=1) - 1

    def push(self, token: int) -> str:
        """Add a generated token; return the text that became final (maybe "")."""
        if self.stopped:
            raise RuntimeError("the text already ended at a stop string")
        self.tokens.append(token)
        self._text += self._decoder.decode(self._new_bytes())
        hits = [(i, s) for s in self.stops for i in [self._text.find(s, self._sent)] if i >= 0]
        if hits:
            at, self.stop_word = min(hits, key=lambda hit: hit[0])  # the first one, the earliest listed at a tie
            self._text, self.stopped = self._text[:at], True
        ready = len(self._text) if self.stopped else len(self._text) - self._hold
        if ready <= self._sent:
            return ""
        out, self._sent = self._text[self._sent:ready], ready
        return out

    def _new_bytes(self) -> bytes:
        """What the last token adds to detokenize(tokens)."""
        n = len(self.tokens)
        if n > CONTEXT:
            window = self.tokens[n - 1 - CONTEXT:]
            before, after = self._detokenize(window[:-1]), self._detokenize(window)
            if after.startswith(before):
                self._fed += len(after) - len(before)
                return after[len(before):]
        data = self._detokenize(self.tokens)
        new, self._fed = data[self._fed:], len(data)
        return new

    def finish(self) -> str:
        """The text held back; an incomplete last character becomes U+FFFD (unless a stop string ended it)."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        out, self._sent = self._text[self._sent:], len(self._text)
        return out


def pieces_text(model: _llama.Model, tokens: list[int], special: bool = False) -> bytes:
    """Token ids to bytes as llama-cpp-python 0.3.x detokenizes: each token's piece joined (special: also the text
    of special tokens), one leading space dropped when the first token is BOS."""
    text = model.detokenize_pieces(tokens, special=special)
    if tokens and tokens[0] == model.token_bos and text.startswith(b" "):
        return text[1:]
    return text


def completion_text(model: _llama.Model, tokens: Sequence[int], special: bool = False) -> bytes:
    """The text of tokens as a completion shows it: llama_detokenize (special: with special tokens' text)."""
    return model.detokenize_bytes(list(tokens), unparse_special=special)


def token_piece(model: _llama.Model, token: int) -> str:
    """A token's text in a logprobs row (invalid UTF-8 dropped, as llama-cpp-python does)."""
    return model.detokenize_bytes([token]).decode("utf-8", "ignore")


def piece_of(model: _llama.Model) -> Callable[[int], str]:
    """token_piece of model, as the one-argument function LogprobRows and score_prompt take."""
    return functools.partial(token_piece, model)


def text_stream(model: _llama.Model, stops: Sequence[str], special: bool = False) -> TextStream:
    """The TextStream of a completion on model with these stop strings (special: special tokens' text kept, as
    a tool call's format may have its markers as special tokens)."""
    return TextStream(functools.partial(completion_text, model, special=special), stops)
