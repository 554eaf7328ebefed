"""Per-token log-probabilities in llama-cpp-python's completion format, and its callable hooks
(logits processors, stopping criteria): the slow path that hands a step's logits row to Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from pyllama_so.llama import Llama

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list):  # type: ignore[type-arg]
    """Processors applied in order, as llama-cpp-python's LogitsProcessorList."""

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):  # type: ignore[type-arg]
    """Stops when any criterion says so, as llama-cpp-python's StoppingCriteriaList."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any(criterion(input_ids, logits) for criterion in self)


class _LogprobRows:
    """The logprobs of generated tokens, handed out with the chunk whose text they start in.

    Each entry: the token's text, its offset in prompt + completion (llama-cpp-python's text_offset),
    its log-probability, and the top alternatives as {text: logprob}, the token itself included.
    """

    def __init__(self, llm: Llama, prompt_len: int) -> None:
        self._piece = lambda tok: llm._text([tok]).decode("utf-8", "ignore")  # the completion text's rule
        self._offset = prompt_len
        self._prompt_len = prompt_len
        self._rows: list[tuple[str, int, float | None, dict[str, float]]] = []

    def add(self, token: int, logprobs: tuple[float | None, list[tuple[int, float]]] | None) -> None:
        assert logprobs is not None
        lp, top = logprobs
        text = self._piece(token)
        alternatives = {self._piece(i): v for i, v in top}
        if lp is not None:
            alternatives[text] = lp
        self._rows.append((text, self._offset, lp, alternatives))
        self._offset += len(text)

    def take(self, sent: int, final: bool = False) -> dict[str, list[Any]] | None:
        """The entries of tokens whose text starts within the first `sent` characters of the completion;
        final: also drop the rest (tokens past a stop string)."""
        limit = self._prompt_len + sent
        ready = [r for r in self._rows if r[1] < limit or (r[1] == limit and not r[0])]
        self._rows = [] if final else self._rows[len(ready):]
        if not ready and not final:
            return None
        return {"tokens": [r[0] for r in ready], "text_offset": [r[1] for r in ready],
                "token_logprobs": [r[2] for r in ready], "top_logprobs": [r[3] for r in ready]}
