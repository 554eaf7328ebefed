"""--cors-origins to Starlette's CORSMiddleware, with llama-server's CORS rules (tools/server/server-http.cpp,
common/common.h of the pinned tree): the methods GET, POST, DELETE, OPTIONS, any request header, credentials
allowed; a preflight (OPTIONS with Access-Control-Request-Method) is answered before the API key check, since
browsers send no key with it. Imports nothing of the server, so that the flags are checked without it."""

from __future__ import annotations

from typing import Any

CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
LOCALHOST_ORIGIN = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def cors_options(origins: str) -> dict[str, Any]:
    """CORSMiddleware's arguments for --cors-origins, as llama-server reads it: "*" reflects any Origin with
    credentials allowed, "localhost" only localhost origins, else a comma-separated list of origins."""
    common = {"allow_methods": list(CORS_METHODS), "allow_headers": ["*"], "allow_credentials": True}
    if origins.strip() == "*":
        return {**common, "allow_origins": ["*"]}
    if origins.strip() == "localhost":
        return {**common, "allow_origin_regex": LOCALHOST_ORIGIN}
    listed = [o.strip() for o in origins.split(",") if o.strip()]
    if not listed:
        raise ValueError("--cors-origins: give origins, '*' or 'localhost'")
    return {**common, "allow_origins": listed}
