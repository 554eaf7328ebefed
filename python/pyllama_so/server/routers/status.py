"""The server's status endpoints: llama-server's GET /props, GET /slots (its shape; off with --no-slots) and
GET /metrics (with --metrics), and our own GET /engine, the engine's whole snapshot (each slot's state,
the queue, the step counters, split overlap's lanes; off with --no-slots too).

/props and /slots have the fields of the pinned tree's tools/server (get_res_props, server_slot::to_json)
that this server can fill; a disabled endpoint answers 501 not_supported_error, as llama-server does.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.chat import ChatTemplate
from pyllama_so.server.engine import Engine, SlotView
from pyllama_so.server.errors import ApiError
from pyllama_so.server.settings import ServerDefaults, generation_settings, metrics_only

PATHS = frozenset({"/props", "/slots", "/metrics"})


def _text(model: _llama.Model, token: int) -> str:
    return "" if token < 0 else model.token_to_piece(token, special=True).decode("utf-8", "replace")


def slot_entry(view: SlotView, n_ctx: int) -> dict[str, Any]:
    """One slot as llama-server's /slots shows it; the request fields are those of its job, or of its last
    one once that ended (none before its first)."""
    out: dict[str, Any] = {"id": view.id, "n_ctx": n_ctx, "speculative": False, "is_processing": view.job is not None}
    job = view.task
    if job is not None:
        remain = -1 if job.max_tokens is None else max(0, job.max_tokens - view.task_generated)
        out |= {"id_task": job.id, "n_prompt_tokens": len(job.prompt), "n_prompt_tokens_processed": view.task_evaluated,
                "n_prompt_tokens_cache": view.task_cached, "params": metrics_only(dict(job.settings or {})),
                "next_token": [{"has_next_token": view.job is not None, "has_new_line": view.has_new_line,
                                "n_remain": remain, "n_decoded": view.task_generated}]}
    return out


def install(app: FastAPI, engine: Engine, *, model_id: str, chat: ChatTemplate, defaults: ServerDefaults,
            build_info: str, slots_endpoint: bool = True, metrics_endpoint: bool = False) -> None:
    model = engine.model
    started = int(time.time())
    metrics = None
    if metrics_endpoint:
        from pyllama_so.server.metrics import Metrics  # prometheus-client, only with --metrics

        metrics = Metrics(engine.snapshot)

    def check_slots() -> None:
        if not slots_endpoint:
            raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`",
                           code="not_supported")

    @app.get("/props")
    async def props() -> dict[str, Any]:
        n_predict = -1 if defaults.n_predict is None else defaults.n_predict
        params = generation_settings(SamplingParams.from_kwargs(**defaults.sampling()), n_predict=n_predict,
                                     ignore_eos=defaults.ignore_eos, backend_sampling=engine.backend_sampling)
        return {"default_generation_settings": {"params": metrics_only(params), "n_ctx": engine.n_ctx_slot},
                "total_slots": engine.n_slots, "model_alias": model_id, "model_path": model.path,
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": slots_endpoint, "endpoint_props": False, "endpoint_metrics": metrics_endpoint,
                "chat_template": getattr(chat, "text", None) or getattr(chat, "builtin", chat.name),
                "bos_token": _text(model, model.token_bos), "eos_token": _text(model, model.token_eos),
                "build_info": build_info, "is_sleeping": False}

    @app.post("/props")
    async def set_props() -> None:
        raise ApiError(501, "This server does not support changing global properties", code="not_supported")

    @app.get("/slots")
    async def slots(request: Request) -> list[dict[str, Any]]:
        check_slots()
        snap = engine.snapshot()
        if request.query_params.get("fail_on_no_slot") and all(v.job is not None for v in snap.slots):
            raise ApiError(503, "no slot available", code="unavailable")
        return [slot_entry(v, snap.n_ctx_slot) for v in snap.slots]

    @app.get("/engine")
    async def engine_view() -> dict[str, Any]:
        check_slots()
        return engine.snapshot().as_dict()

    @app.get("/metrics")
    async def get_metrics() -> Response:
        if metrics is None:
            raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                           code="not_supported")
        return Response(metrics.render(), media_type=metrics.content_type, headers={"Process-Start-Time-Unix": str(started)})
