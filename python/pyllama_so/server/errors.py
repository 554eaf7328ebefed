"""Error responses for our own errors, FastAPI's validation errors (400 here, not FastAPI's 422 shape) and
unknown routes: OpenAI's shape, {"error": {"message", "type", "param", "code"}}, on the OpenAI routes (and
unknown ones); llama-server's, {"error": {"code": status, "message", "type"}} with its types
(tools/server/server-common.cpp, format_error_response), on its native routes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("pyllama_so.server")

# the error types of OpenAI's API, and llama-server's for 501 and 503
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


# llama-server's error types by status; a prompt longer than the slot's context has its own
_NATIVE_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}
CONTEXT_EXCEEDED = "context_length_exceeded"  # OpenAI's code; llama-server's type exceed_context_size_error


class ApiError(Exception):
    """An error response: status, message, the request field (param) and OpenAI's code where they are known;
    details: more fields of llama-server's error object (n_prompt_tokens and n_ctx of a prompt too long)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.details = status, message, param, code, details


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error" if status >= 500 else
                                                              "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def native_error_body(status: int, message: str, code: str | None = None,
                      details: dict[str, Any] | None = None) -> dict[str, Any]:
    """llama-server's error object: its code is the HTTP status."""
    kind = "exceed_context_size_error" if code == CONTEXT_EXCEEDED else _NATIVE_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"code": status, "message": message, "type": kind, **(details or {})}}


def response_for(path: str, native_paths: frozenset[str], status: int, message: str, param: str | None = None,
                 code: str | None = None, details: dict[str, Any] | None = None) -> JSONResponse:
    """The error in the shape of the route: llama-server's on native_paths, OpenAI's elsewhere."""
    if path in native_paths:
        return JSONResponse(native_error_body(status, message, code, details), status_code=status)
    return error_response(status, message, param, code)


def _field(error: dict[str, Any]) -> list[str]:
    """The request field of a pydantic error: its location without "body" and without the labels of a
    union's types (list[int], function-after[...])."""
    return [str(p) for p in error.get("loc", ()) if p != "body" and "[" not in str(p)]


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One message for pydantic's errors, and the request field (param) of the first."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{': ' + detail if detail else ''}", None
    # a field of several types fails once per type: where one of them is our own check (a value error),
    # that is the field's reason
    checked = {tuple(_field(e)[:1]) for e in errors if e.get("type") == "value_error"}
    parts, param = [], None
    for e in errors:
        loc = _field(e)
        if tuple(loc[:1]) in checked and e.get("type") != "value_error":
            continue
        field = ".".join(loc)
        param = param or (loc[0] if loc else None)
        part = f"{field}: {e.get('msg')}" if field else f"request body: {e.get('msg')}"
        if part not in parts:
            parts.append(part)
    if len(parts) > 4:
        parts[4:] = [f"and {len(parts) - 4} more"]
    return "; ".join(parts), param


def _respond(request: Request, status: int, message: str, param: str | None = None, code: str | None = None,
             details: dict[str, Any] | None = None) -> JSONResponse:
    """The error in the shape of the request's route (install() puts the native routes on app.state)."""
    return response_for(request.url.path, request.app.state.native_paths, status, message, param, code, details)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _respond(request, exc.status, exc.message, exc.param, exc.code, exc.details)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(list(exc.errors()))
    return _respond(request, 400, message, param)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _respond(request, exc.status_code, str(exc.detail))


async def internal(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _respond(request, 500, f"internal error: {exc}")


# each handler's exception type; a handler takes its type's exceptions only (Any: Starlette types them all Exception)
HANDLERS: tuple[tuple[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]], ...] = (
    (ApiError, api_error), (RequestValidationError, invalid), (StarletteHTTPException, http_error),
    (Exception, internal))


def install(app: FastAPI, native_paths: frozenset[str] = frozenset()) -> None:
    """Error handlers for app; native_paths: the routes whose errors have llama-server's shape."""
    app.state.native_paths = native_paths
    for kind, handler in HANDLERS:
        app.add_exception_handler(kind, handler)
