"""The embedding routes, as llama-server serves them with --embeddings: OpenAI's POST /v1/embeddings and
llama-server's own POST /embedding and /embeddings (tools/server/README.md of the pinned tree), on the
server's EmbeddingService (server/embeddings.py). Without --embeddings they answer 501 as llama-server does.

- /v1/embeddings: `input` (a string, strings, token ids or lists of them), `encoding_format` "float" or
  "base64", `embd_normalize`; pooled vectors, normalised (Euclidean unless --embd-normalize or the
  request says otherwise); pooling "none" is a 400 (not OpenAI-compatible). A body with `content`
  instead of `input` gets the native answer, as in llama-server.
- /embedding, /embeddings: `input` or `content`; a list of {"index", "embedding"} where "embedding" is a
  list of vectors: one pooled (normalised) vector, or with pooling "none" one unnormalised vector per token.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from pyllama_so.embeddings import normalize
from pyllama_so.server.embeddings import EmbeddingService, Prompt
from pyllama_so.server.errors import ApiError
from pyllama_so.server.routers.state import EmbeddingsDep, SettingsDep

NOT_SUPPORTED = "This server does not support embeddings. Start it with `--embeddings`"
PATHS = frozenset({"/embedding", "/embeddings"})  # llama-server's own: their errors have its shape

router = APIRouter()


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    input: Prompt | None = None
    content: Prompt | None = None  # llama-server's native name
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embd_normalize: int | None = None


async def embed_request(service: EmbeddingService | None,
                        body: EmbeddingRequest) -> tuple[list[list[int]], list[np.ndarray], int]:
    """The request's inputs, their embeddings and the normalisation to apply."""
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


@router.post("/v1/embeddings", response_model=None)
async def embeddings_oai(body: EmbeddingRequest, service: EmbeddingsDep, settings: SettingsDep) -> Any:
    if service is not None and service.pooling == "none":
        raise ApiError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                       param="input")
    inputs, arrays, norm = await embed_request(service, body)
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
    return {"model": body.model or settings.model_id, "object": "list",
            "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data}


async def embeddings_native(body: EmbeddingRequest, service: EmbeddingsDep) -> list[dict[str, Any]]:
    _, arrays, norm = await embed_request(service, body)
    return native(arrays, norm)


router.post("/embedding", response_model=None)(embeddings_native)  # llama-server's legacy name
router.post("/embeddings", response_model=None)(embeddings_native)
