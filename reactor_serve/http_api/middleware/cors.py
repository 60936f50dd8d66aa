"""CORS for the session API, as a pure ASGI middleware, open only as far as clients need.

docs/protocol.md: any origin may call (a page served from anywhere drives a local model),
so `Access-Control-Allow-Origin: *`, never with credentials. What is allowed beyond
that is listed, not echoed: the methods our routes use, and the request headers the
JS SDK sends (`Authorization`, `Content-Type`, its `Reactor-*` version headers; a
literal `*` would not cover `Authorization` under the Fetch standard). Of the
response headers, only `Retry-After` is exposed: a client backing off from a 503 or
409 must be able to read it.

The CORS headers go on every response, errors included, or the browser reports each
4xx/5xx as an opaque "Failed to fetch". That is also why this middleware turns an
exception escaping the app into a 500 itself: Starlette's outermost error handler
would answer without them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = [
    "CORS_ALLOWED_HEADERS",
    "CORS_EXPOSED_HEADERS",
    "CORS_METHODS",
    "CORSMiddleware",
    "allowed_request_headers",
]

log = logging.getLogger("reactor_serve.http_api")

_Scope = MutableMapping[str, Any]
_ASGIApp = Callable[[_Scope, Any, Any], Awaitable[None]]

CORS_METHODS: tuple[str, ...] = ("GET", "POST", "PUT", "DELETE", "OPTIONS")
CORS_ALLOWED_HEADERS: tuple[str, ...] = (
    "Authorization",
    "Content-Type",
    "Reactor-API-Version",
    "Reactor-API-Accept-Version",
    "Reactor-WebRTC-Version",
)
CORS_EXPOSED_HEADERS: tuple[str, ...] = ("Retry-After",)

# A newer SDK may add a `Reactor-*` header of its own: allow that family by name (and
# nothing else a preflight asks for), a bounded number of them.
_REACTOR_HEADER = re.compile(r"reactor-[a-z0-9-]{1,64}")
_MAX_EXTRA_HEADERS = 8
_MAX_AGE_S = 600

_ALWAYS: list[tuple[bytes, bytes]] = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", ", ".join(CORS_EXPOSED_HEADERS).encode()),
]
_ALWAYS_NAMES = {name for name, _ in _ALWAYS}


class CORSMiddleware:
    """Answer preflights; put the CORS headers on every HTTP response; 500 with them
    when the app raises before responding."""

    def __init__(self, app: _ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS":
            # Before auth and routing: a preflight carries no Authorization header.
            await _preflight(scope, send)
            return
        started = False

        async def send_with_cors(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v) for k, v in message.get("headers", ()) if k.lower() not in _ALWAYS_NAMES
                ]
                message = {**message, "headers": [*headers, *_ALWAYS]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_cors)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope.get("path"))
            if started:
                raise  # half a response is out; the server can only drop the connection
            await JSONResponse(
                {"detail": "internal server error"}, 500,
                headers={k.decode("latin-1"): v.decode("latin-1") for k, v in _ALWAYS},
            )(scope, receive, send)


def allowed_request_headers(requested: str | None) -> list[str]:
    """The `Access-Control-Allow-Headers` list for a preflight asking for `requested`."""
    allowed = list(CORS_ALLOWED_HEADERS)
    known = {h.lower() for h in allowed}
    for name in (requested or "").split(","):
        name = name.strip().lower()
        if len(allowed) - len(CORS_ALLOWED_HEADERS) >= _MAX_EXTRA_HEADERS:
            break
        if name not in known and _REACTOR_HEADER.fullmatch(name):
            allowed.append(name)
            known.add(name)
    return allowed


async def _preflight(scope: _Scope, send: Any) -> None:
    requested = None
    for key, value in scope.get("headers", ()):
        if key.lower() == b"access-control-request-headers":
            requested = value.decode("latin-1")
            break
    headers = [
        *_ALWAYS,
        (b"access-control-allow-methods", ", ".join(CORS_METHODS).encode()),
        (b"access-control-allow-headers", ", ".join(allowed_request_headers(requested)).encode()),
        (b"access-control-max-age", str(_MAX_AGE_S).encode()),
        (b"vary", b"Access-Control-Request-Headers"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
