"""llama-cpp-python's LlamaTokenizer: a Llama's tokenizer as an object (Llama.tokenizer()), with its methods'
names and defaults: tokenize / detokenize on bytes, encode / decode on str."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyllama_so.llama import Llama


class LlamaTokenizer:
    def __init__(self, llama: Llama) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str | os.PathLike[str]) -> LlamaTokenizer:
        """A tokenizer of a GGUF file's vocabulary alone (no weights loaded)."""
        from pyllama_so.llama import Llama

        return cls(Llama(path, vocab_only=True))
