"""TextStream gives detokenize(all tokens) as it becomes final, with constant work per token after the first
CONTEXT ones, on real vocabularies (byte-level BPE: SmolLM2; SentencePiece with a leading space: Gemma 3) and
a synthetic one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_so import _llama
from pyllama_so.generation.text import CONTEXT, TextStream

TEXT = ("The capital of France is Paris. Zürich, São Paulo and 東京 are cities; emoji 🙂🚀 too.\n"
        "  Indented   spaces, tabs\tand \"quotes\" (brackets) don't break it: 3.14159 ... done.")


def stream(model: _llama.Model, tokens: list[int], stops: tuple[str, ...] = ()) -> tuple[str, list[int], TextStream]:
    lengths: list[int] = []

    def detok(toks: list[int]) -> bytes:
        lengths.append(len(toks))
        return model.detokenize_bytes(toks)

    ts = TextStream(detok, stops)
    out = []
    for t in tokens:
        out.append(ts.push(t))
        if ts.stopped:
            break
    out.append(ts.finish())
    return "".join(out), lengths, ts


def token_sequences(model: _llama.Model) -> list[list[int]]:
    rng = np.random.default_rng(0)
    text = model.tokenize(TEXT.encode(), add_special=False, parse_special=False)
    return [text, [int(t) for t in rng.integers(0, model.n_vocab, 200)]]


@pytest.fixture(scope="module", params=["smollm2", "gemma3", "tiny"])
def vocab(request: pytest.FixtureRequest) -> _llama.Model:
    path: Path = request.getfixturevalue(f"{request.param}_model")
    model = _llama.Model.load(path, vocab_only=True)
    yield model
    model.free()


def test_text_equals_whole_detokenization(vocab: _llama.Model) -> None:
    for tokens in token_sequences(vocab):
        text, lengths, _ = stream(vocab, tokens)
        assert text == vocab.detokenize_bytes(tokens).decode("utf-8", "replace")
        # after the first CONTEXT tokens each push detokenizes at most CONTEXT + 1 of them
        assert max(lengths[CONTEXT:]) <= CONTEXT + 1, lengths


def test_stop_string_cuts_the_text(vocab: _llama.Model) -> None:
    tokens = token_sequences(vocab)[0]
    whole = vocab.detokenize_bytes(tokens).decode("utf-8", "replace")
    text, _, ts = stream(vocab, tokens, stops=("3.14",))
    assert ts.stopped and text == whole[: whole.index("3.14")]


def test_context_dependent_rendering() -> None:
    """A tokenizer that drops the first token's leading space and cleans up a space before punctuation (as
    llama.cpp does for SentencePiece and WordPiece vocabularies): the text is still detokenize(all tokens)."""
    pieces = [" the", " cat", " ,", " sat", " .", " \xc3", "\xa9", " on", " it", " !"]
    vocab = [p.encode("latin-1") for p in pieces]  # " \xc3" + "\xa9": an "é" split over two tokens

    def detok(toks: list[int]) -> bytes:
        data = b"".join(vocab[t] for t in toks)
        for punct in (b",", b".", b"!"):
            data = data.replace(b" " + punct, punct)
        return data[1:] if data.startswith(b" ") else data

    rng = np.random.default_rng(1)
    for _ in range(20):
        tokens = [int(t) for t in rng.integers(0, len(vocab), 60)]
        ts = TextStream(detok)
        text = "".join(ts.push(t) for t in tokens) + ts.finish()
        assert text == detok(tokens).decode("utf-8", "replace")
