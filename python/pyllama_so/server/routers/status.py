"""The server's status endpoints: GET /health (also /v1/health), OpenAI's GET /v1/models (also llama-server's
/models), llama-server's GET /props, GET /slots (its shape; off with --no-slots) and GET /metrics (with
--metrics), and our own GET /engine, the engine's whole snapshot (each slot's state, the queue, the step
counters, split overlap's lanes; off with --no-slots too).

/props and /slots have the fields of the pinned tree's tools/server (get_res_props, server_slot::to_json)
that this server can fill; a disabled endpoint answers 501 not_supported_error, as llama-server does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.engine import SHUTTING_DOWN, SlotView
from pyllama_so.server.errors import ApiError
from pyllama_so.server.routers.state import ChatDep, EngineDep, MetricsDep, SettingsDep
from pyllama_so.server.settings import FINGERPRINT, ServerSettings, generation_settings, metrics_only

PATHS = frozenset({"/props", "/slots", "/metrics"})  # their errors have llama-server's shape

router = APIRouter()


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


def check_slots(settings: ServerSettings) -> None:
    if not settings.slots_endpoint:
        raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`",
                       code="not_supported")


@router.get("/health")
@router.get("/v1/health")
async def health(engine: EngineDep) -> JSONResponse:
    if not engine.running:
        return JSONResponse({"status": "error", "error": str(engine.error or "the engine stopped")},
                            status_code=503)
    if not engine.accepting:
        return JSONResponse({"status": "error", "error": SHUTTING_DOWN}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/v1/models")
@router.get("/models")
async def models(engine: EngineDep, chat: ChatDep, settings: SettingsDep) -> dict[str, Any]:
    # the template itself (a Jinja text, or the name of a llama.cpp built-in) and where it came from
    meta = {"n_ctx_slot": engine.n_ctx_slot, "n_slots": engine.n_slots, "n_vocab": engine.model.n_vocab,
            "chat_template": getattr(chat, "text", None) or getattr(chat, "builtin", chat.name),
            "chat_template_source": chat.name, **settings.model_meta}
    return {"object": "list", "data": [{"id": settings.model_id, "object": "model", "created": settings.started,
                                        "owned_by": "pyllama_so", "meta": meta}]}


@router.get("/props")
async def props(engine: EngineDep, chat: ChatDep, settings: SettingsDep) -> dict[str, Any]:
    model, defaults = engine.model, settings.defaults
    n_predict = -1 if defaults.n_predict is None else defaults.n_predict
    params = generation_settings(SamplingParams.from_kwargs(**defaults.sampling()), n_predict=n_predict,
                                 ignore_eos=defaults.ignore_eos, backend_sampling=engine.backend_sampling)
    return {"default_generation_settings": {"params": metrics_only(params), "n_ctx": engine.n_ctx_slot},
            "total_slots": engine.n_slots, "model_alias": settings.model_id, "model_path": model.path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": settings.slots_endpoint, "endpoint_props": False,
            "endpoint_metrics": settings.metrics_endpoint,
            "chat_template": getattr(chat, "text", None) or getattr(chat, "builtin", chat.name),
            "bos_token": _text(model, model.token_bos), "eos_token": _text(model, model.token_eos),
            "build_info": FINGERPRINT, "is_sleeping": False}


@router.post("/props")
async def set_props() -> None:
    raise ApiError(501, "This server does not support changing global properties", code="not_supported")


@router.get("/slots")
async def slots(request: Request, engine: EngineDep, settings: SettingsDep) -> list[dict[str, Any]]:
    check_slots(settings)
    snap = engine.snapshot()
    if request.query_params.get("fail_on_no_slot") and all(v.job is not None for v in snap.slots):
        raise ApiError(503, "no slot available", code="unavailable")
    return [slot_entry(v, snap.n_ctx_slot) for v in snap.slots]


@router.get("/engine")
async def engine_view(engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    check_slots(settings)
    return engine.snapshot().as_dict()


@router.get("/metrics")
async def get_metrics(metrics: MetricsDep, settings: SettingsDep) -> Response:
    if metrics is None:
        raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                       code="not_supported")
    return Response(metrics.render(), media_type=metrics.content_type,
                    headers={"Process-Start-Time-Unix": str(settings.started)})
