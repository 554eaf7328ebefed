"""The server's own ASGI middleware: the API key (--api-key) and llama-server's reading of any POST body as
JSON. Pure ASGI, so that streams pass untouched."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pyllama_so.server import errors

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})  # answered without the API key


class ApiKeyMiddleware:
    """401 for a request without the key, given as `Authorization: Bearer <key>` or `X-Api-Key: <key>` (as
    llama-server takes it); native_paths: the routes whose 401 has llama-server's shape."""

    def __init__(self, app: ASGIApp, key: str, native_paths: frozenset[str] = frozenset()) -> None:
        self.app, self.key, self.native_paths = app, key.encode(), native_paths

    def _valid(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key):
            return True
        return hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS and not self._valid(dict(scope["headers"])):
            if scope["path"] in self.native_paths:
                response = JSONResponse({"error": {"code": 401, "message": "Invalid API Key",
                                                   "type": "authentication_error"}}, status_code=401)
            else:
                response = errors.error_response(401, "invalid API key", code="invalid_api_key")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class JsonBodyMiddleware:
    """llama-server reads every request body as JSON, whatever its Content-Type (`curl -d` sends
    application/x-www-form-urlencoded): a POST without a JSON Content-Type gets one, so FastAPI parses it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            kind = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
            if not (kind == b"application/json" or kind.endswith(b"+json")):
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
