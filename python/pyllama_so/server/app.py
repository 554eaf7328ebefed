"""The HTTP side over an Engine: the FastAPI app of the routers (server/routers/: OpenAI's completions and chat,
llama-server's native routes, the status routes, the embedding routes), with the engine, the chat template and
the settings on app.state, the error handlers and the middleware (API key, JSON body, CORS).

Errors have OpenAI's shape on the OpenAI routes and llama-server's on its native ones (errors.py).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from pyllama_so.server import errors
from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.cors import cors_options
from pyllama_so.server.embeddings import EmbeddingService
from pyllama_so.server.engine import Engine
from pyllama_so.server.middleware import ApiKeyMiddleware, JsonBodyMiddleware
from pyllama_so.server.routers import embeddings as embedding_routes, native, openai, status
from pyllama_so.server.routers.state import put_state
from pyllama_so.server.settings import ServerDefaults, ServerSettings

# llama-server's own routes: their errors have its shape
NATIVE_PATHS = native.PATHS | status.PATHS | embedding_routes.PATHS
# a stream outlives the engine's grace period by this much, so that its last chunk and [DONE] get out
STREAM_GRACE_MARGIN_S = 1.5


def create_app(engine: Engine, *, model_id: str, chat: ChatTemplate, api_key: str | None = None,
               model_meta: dict[str, Any] | None = None, shutdown_grace: float = 5.0,
               embeddings: EmbeddingService | None = None,
               defaults: ServerDefaults = ServerDefaults(), slots_endpoint: bool = True,
               metrics_endpoint: bool = False, cors_origins: str = "*") -> FastAPI:
    """The FastAPI app serving engine's model as model_id. shutdown_grace: the seconds the engine gives
    requests after engine.drain() (streams stay open that long, and a little more for their last chunk);
    embeddings: the --embeddings service; defaults: --temp, --seed, -n; slots_endpoint: /slots and /engine
    (--no-slots turns them off); metrics_endpoint: /metrics (--metrics); cors_origins: --cors-origins."""
    app = FastAPI(title="pyllama_so", summary="OpenAI-compatible server over llama.cpp")
    settings = ServerSettings(model_id, defaults, model_meta or {}, shutdown_grace + STREAM_GRACE_MARGIN_S,
                              slots_endpoint, metrics_endpoint, started=int(time.time()))
    metrics = None
    if metrics_endpoint:
        from pyllama_so.server.metrics import Metrics  # prometheus-client, only with --metrics

        metrics = Metrics(engine.snapshot)
    put_state(app, engine=engine, chat=chat, settings=settings, embeddings=embeddings, metrics=metrics)
    errors.install(app, NATIVE_PATHS)
    for router in (embedding_routes.router, native.router, status.router, openai.router):
        app.include_router(router)
    app.add_middleware(JsonBodyMiddleware)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key, native_paths=NATIVE_PATHS)
    app.add_middleware(CORSMiddleware, **cors_options(cors_origins))  # outermost: a preflight needs no key
    return app
