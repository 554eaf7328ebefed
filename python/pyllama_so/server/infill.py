"""The prompt of llama-server's /infill, from the model's fill-in-the-middle tokens: the layout of
format_prompt_infill in the pinned tree's tools/server/server-common.cpp.

    [extra context][BOS]<FIM_PRE>prefix prompt<FIM_SUF>suffix<FIM_MID>

The extra context is each input_extra chunk, after <FIM_REP>"myproject\\n" when the vocabulary has that
token: <FIM_SEP>filename"\\n" text per chunk and a last <FIM_SEP>"filename\\n" when it has FIM_SEP, else each
text after a "--- snippet ---" line. To fit one batch, the prefix keeps its last 3/4 of n_batch tokens and
the suffix its first n_batch/4 - 2 - len(prompt); the extra context keeps its last n_ctx - n_batch -
2 * n_predict tokens (n_predict: the server's -n, -1 by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyllama_so import _llama

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class Chunk:
    text: str
    filename: str = "tmp"


def missing_fim_tokens(model: _llama.Model) -> list[str]:
    """The FIM tokens /infill needs that the vocabulary lacks, in llama-server's words."""
    fim = model.fim_tokens
    return [f"{name} token is missing." for key, name in (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
            if fim[key] is None]


def infill_tokens(model: _llama.Model, prefix: Sequence[int], suffix: Sequence[int], prompt: Sequence[int],
                  extra: Sequence[Chunk], *, n_batch: int, n_ctx: int, n_predict: int = -1) -> list[int]:
    """The prompt's tokens; prefix, suffix and prompt already tokenized (without special tokens)."""
    fim = model.fim_tokens
    pre, suf, mid = fim["pre"], fim["suf"], fim["mid"]
    if pre is None or suf is None or mid is None:
        raise ValueError("the model has no fill-in-the-middle tokens: " + " ".join(missing_fim_tokens(model)))

    def text(s: str) -> list[int]:
        return model.tokenize(s, add_special=False, parse_special=False).tolist()

    context: list[int] = []
    if fim["rep"] is not None:
        context += [fim["rep"], *text("myproject\n")]
    for chunk in extra:
        if fim["sep"] is not None:
            context += [fim["sep"], *text(chunk.filename + "\n")]
        else:
            context += text(SNIPPET_SEPARATOR)
        context += text(chunk.text)
    if fim["sep"] is not None:
        context += [fim["sep"], *text("filename\n")]

    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_context = min(max(0, n_ctx - n_batch - 2 * n_predict), len(context))
    head = [model.token_bos] if model.add_bos else []
    return [*context[len(context) - n_context:], *head, pre, *prefix[len(prefix) - n_prefix:], *prompt,
            suf, *suffix[:n_suffix], mid]
