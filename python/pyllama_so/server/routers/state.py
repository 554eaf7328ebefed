"""What the routes read from app.state, as FastAPI dependencies: the engine, the chat template, the server's
settings, the embedding service (None without --embeddings) and the metrics (None without --metrics).
create_app puts them there with put_state(). The dependencies are coroutines, so that FastAPI runs them on
the event loop instead of sending each to the thread pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, FastAPI, Request

from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.embeddings import EmbeddingService
from pyllama_so.server.engine import Engine
from pyllama_so.server.settings import ServerSettings

if TYPE_CHECKING:
    from pyllama_so.server.metrics import Metrics  # prometheus-client, only with --metrics


def put_state(app: FastAPI, *, engine: Engine, chat: ChatTemplate, settings: ServerSettings,
              embeddings: EmbeddingService | None = None, metrics: Metrics | None = None) -> None:
    app.state.engine = engine
    app.state.chat = chat
    app.state.settings = settings
    app.state.embeddings = embeddings
    app.state.metrics = metrics


async def _engine(request: Request) -> Engine:
    return request.app.state.engine


async def _chat(request: Request) -> ChatTemplate:
    return request.app.state.chat


async def _settings(request: Request) -> ServerSettings:
    return request.app.state.settings


async def _embeddings(request: Request) -> EmbeddingService | None:
    return request.app.state.embeddings


async def _metrics(request: Request) -> Metrics | None:
    return request.app.state.metrics


EngineDep = Annotated[Engine, Depends(_engine)]
ChatDep = Annotated[ChatTemplate, Depends(_chat)]
SettingsDep = Annotated[ServerSettings, Depends(_settings)]
EmbeddingsDep = Annotated[EmbeddingService | None, Depends(_embeddings)]
MetricsDep = Annotated["Metrics | None", Depends(_metrics)]
