"""References for logits and log-probabilities in tests: the log-softmax in float64, and the logits rows that
generation itself computes."""

from __future__ import annotations

import numpy as np

from pyllama_so import Llama


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-softmax of each row (the last axis), in float64."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def generation_rows(llm: Llama, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The logits row before each generated token, in the shapes of generation: the prompt with only its last row
    out, then one token per decode. A batch of several rows can take other kernels than one row (on a CPU without
    AVX2 the tiny model's logits differ by 1e-3 between the two), so eval() of the whole text is no exact reference."""
    llm.reset()
    ctx = llm.context
    rows = [ctx.decode(prompt)[0]] + [ctx.decode([t])[0] for t in tokens[:-1]]
    llm.reset()
    return rows
