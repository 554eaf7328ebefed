"""The embedding routes, as llama-server serves them with --embeddings: OpenAI's POST /v1/embeddings and
llama-server's own POST /embedding and /embeddings (tools/server/README.md of the pinned tree).

Embeddings run in a context of their own on the server's model (embeddings on, the --pooling type, one
ubatch per batch), one request at a time under a lock, beside the generation engine and its slots.
Without --embeddings the routes answer 501 as llama-server does.

- /v1/embeddings: `input` (a string, strings, token ids or lists of them), `encoding_format` "float" or
  "base64", `embd_normalize`; pooled vectors, normalised (Euclidean unless --embd-normalize or the
  request says otherwise); pooling "none" is a 400 (not OpenAI-compatible). A body with `content`
  instead of `input` gets the native answer, as in llama-server.
- /embedding, /embeddings: `input` or `content`; a list of {"index", "embedding"} where "embedding" is a
  list of vectors: one pooled (normalised) vector, or with pooling "none" one unnormalised vector per token.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from pyllama_so import _llama, config
from pyllama_so.embeddings import EUCLIDEAN, batch_limit, embed_tokens, embedding_sequences, normalize
from pyllama_so.server.errors import ApiError

Prompt = str | list[str] | list[int] | list[list[int]]
NOT_SUPPORTED = "This server does not support embeddings. Start it with `--embeddings`"


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    input: Prompt | None = None
    content: Prompt | None = None  # llama-server's native name
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embd_normalize: int | None = None


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
        n = min(slots.n_batch, slots.n_ubatch)
        params = dataclasses.replace(slots, n_ctx=n, n_batch=n, n_ubatch=n,
                                     n_seq_max=embedding_sequences(n, model_params.split_mode),
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


def install(app: FastAPI, service: EmbeddingService | None, model_id: str) -> None:
    """Add the embedding routes to app; without a service (no --embeddings) they answer 501."""

    async def run(body: EmbeddingRequest) -> tuple[list[list[int]], list[np.ndarray], int]:
        if service is None:
            raise ApiError(501, NOT_SUPPORTED, code="not_supported")
        prompt = body.input if body.input is not None else body.content
        if prompt is None:
            raise ApiError(400, '"input" or "content" must be provided', param="input")
        norm = service.embd_normalize if body.embd_normalize is None else body.embd_normalize
        try:
            normalize(np.zeros(1, dtype=np.float32), norm)
        except ValueError as e:
            raise ApiError(400, str(e), param="embd_normalize") from None
        inputs = service.tokenize(prompt)
        return inputs, await run_in_threadpool(service.embed, inputs), norm

    def native(arrays: list[np.ndarray], norm: int) -> list[dict[str, Any]]:
        # pooling "none": every token's vector as it is; pooled: one normalised vector
        return [{"index": i, "embedding": (emb.tolist() if emb.ndim == 2 else [normalize(emb, norm).tolist()])}
                for i, emb in enumerate(arrays)]

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings_oai(body: EmbeddingRequest) -> Any:
        if service is not None and service.pooling == "none":
            raise ApiError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                           param="input")
        inputs, arrays, norm = await run(body)
        if body.input is None:  # "content": llama-server's native answer
            return native(arrays, norm)
        data = []
        for i, emb in enumerate(arrays):
            vec = normalize(emb, norm)
            if body.encoding_format == "base64":
                data.append({"embedding": base64.b64encode(vec.astype("<f4").tobytes()).decode(), "index": i,
                             "object": "embedding", "encoding_format": "base64"})
            else:
                data.append({"embedding": vec.tolist(), "index": i, "object": "embedding"})
        n = sum(len(t) for t in inputs)
        return {"model": body.model or model_id, "object": "list",
                "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data}

    async def embeddings_native(body: EmbeddingRequest) -> list[dict[str, Any]]:
        _, arrays, norm = await run(body)
        return native(arrays, norm)

    app.post("/embedding", response_model=None)(embeddings_native)  # llama-server's legacy name
    app.post("/embeddings", response_model=None)(embeddings_native)
