"""Grammars for constrained generation: GBNF text handed to llama.cpp's grammar sampler.

`LlamaGrammar` has llama-cpp-python's constructors, so `grammar=LlamaGrammar.from_string(...)` works
unchanged; a plain GBNF string is accepted wherever a grammar is. The text is parsed by llama.cpp when
a sampler is built: a grammar it rejects is a ValueError with the parser's message.
"""

from __future__ import annotations

import os
from pathlib import Path


class LlamaGrammar:
    """GBNF grammar text and its root rule."""

    def __init__(self, grammar: str, root: str = "root") -> None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError("a grammar must be non-empty GBNF text")
        self.grammar = grammar
        self.root = root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"grammar file not found: {path}")
        return cls(path.read_text(encoding="utf-8"))

    def __repr__(self) -> str:
        return f"LlamaGrammar({self.grammar[:40]!r}{'...' if len(self.grammar) > 40 else ''})"


def grammar_text(grammar: str | LlamaGrammar | None) -> tuple[str | None, str]:
    """(GBNF text or None, root rule) of what a caller passed as grammar."""
    if grammar is None:
        return None, "root"
    if isinstance(grammar, LlamaGrammar):
        return grammar.grammar, grammar.root
    if isinstance(grammar, str):
        if not grammar.strip():
            raise ValueError("grammar is empty")
        return grammar, "root"
    raise ValueError(f"grammar must be GBNF text or a LlamaGrammar, not {type(grammar).__name__}")
