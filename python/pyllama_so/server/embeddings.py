"""The server's embedding service (--embeddings), which the embedding routes (routers/embeddings.py) run on.

Embeddings run in a context of their own on the server's model (embeddings on, the --pooling type, one
ubatch per batch), one request at a time under a lock, beside the generation engine and its slots.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from pyllama_so import _llama, config
from pyllama_so.embeddings import EUCLIDEAN, batch_limit, embed_tokens, embedding_sequences, normalize
from pyllama_so.server.errors import ApiError

Prompt = str | list[str] | list[int] | list[list[int]]


class EmbeddingService:
    """An embedding context on the server's model; embed() runs one request at a time."""

    def __init__(self, ctx: _llama.Context, embd_normalize: int = EUCLIDEAN) -> None:
        normalize(np.zeros(1, dtype=np.float32), embd_normalize)  # a bad value fails at start
        self.ctx = ctx
        self.embd_normalize = embd_normalize
        self.pooling = ctx.pooling_type
        self.limit = batch_limit(ctx)
        self._lock = threading.Lock()

    @classmethod
    def create(cls, model: _llama.Model, model_params: config.ModelParams, slots: config.ContextParams,
               pooling: str | None, embd_normalize: int = EUCLIDEAN) -> EmbeddingService:
        """The service beside the slots' context (slots: its parameters, from the server's flags): a batch
        is one ubatch of -ub tokens (llama-server lowers -b to -ub with --embeddings the same way), the
        context holds one batch; threads, flash attention and cache types are the slots'."""
        assert slots.n_ubatch is not None  # None given becomes the default in ContextParams.__post_init__
        n = min(slots.n_batch, slots.n_ubatch)
        params = dataclasses.replace(slots, n_ctx=n, n_batch=n, n_ubatch=n,
                                     n_seq_max=embedding_sequences(n, model_params),
                                     split_overlap=False, embeddings=True, pooling_type=pooling, kv_unified=True)
        ctx = config.create_context(model, params)
        try:
            return cls(ctx, embd_normalize)
        except BaseException:
            ctx.free()
            raise

    def free(self) -> None:
        with self._lock:
            self.ctx.free()

    def tokenize(self, prompt: Prompt) -> list[list[int]]:
        """The inputs of a request as llama-server reads them: a string or token ids is one input, a list
        of strings or of token lists is several; strings get the model's special tokens and parse them."""
        model = self.ctx.model
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            items: list[Any] = [prompt]
        else:
            items = list(prompt)
        if not items:
            raise ApiError(400, '"input" must not be empty', param="input")
        out = []
        for item in items:
            if isinstance(item, str):
                toks = model.tokenize(item, add_special=True, parse_special=True).tolist()
            else:
                toks = [int(t) for t in item]
                bad = [t for t in toks if not 0 <= t < model.n_vocab]
                if bad:
                    raise ApiError(400, f"token id {bad[0]} out of range [0, {model.n_vocab})", param="input")
            if not toks:
                raise ApiError(400, "Input content cannot be empty", param="input")
            if len(toks) > self.limit:
                raise ApiError(400, f"input ({len(toks)} tokens) is too large to process. increase the physical "
                               f"batch size (current batch size: {self.limit})", param="input")
            out.append(toks)
        return out

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        with self._lock:
            return embed_tokens(self.ctx, inputs)

