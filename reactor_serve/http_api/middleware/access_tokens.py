"""Signed access tokens for a whole app (`auth: required`), as a pure ASGI middleware.

Authentication only: a request that is not on the public allow-list must carry a
token that verifies (`Authorization: Bearer <jwt>`, or the `/t/{jwt}/` path prefix a
client without headers can use); its `Grant` is put in the ASGI scope under
`GRANT_SCOPE_KEY` for the routes, which decide what it may touch. A missing, bad,
expired or revoked token is a 401 naming why. An address that keeps failing is
answered ever more slowly and then, for a while, 429 with `Retry-After`.

Public: health, the web client's static files and pages (so a browser can load the
page that asks for a key), viewer links (the link is the viewer's credential),
`POST /tokens` (it authenticates by API key itself) and `GET /usage` (by the operator
token).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

from reactor_serve.access.access_control import AccessControl, AccessDenied
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.http_api.middleware.token_auth import (
    DEFAULT_PUBLIC_PATHS,
    bearer_token,
    route_path,
    strip_token_prefix,
)

__all__ = [
    "ACCESS_PUBLIC_PATHS",
    "GRANT_SCOPE_KEY",
    "AccessTokenMiddleware",
    "client_address",
    "refusal",
]

_Scope = MutableMapping[str, Any]
_ASGIApp = Callable[[_Scope, Any, Any], Awaitable[None]]

GRANT_SCOPE_KEY = "reactor.grant"
_BASE = r"(?:/models/[^/]+)?"
ACCESS_PUBLIC_PATHS: tuple[str, ...] = (
    *DEFAULT_PUBLIC_PATHS,
    rf"{_BASE}/tokens",
    # Operators' routes: guarded by the operator token, not a client's.
    r"/usage",
    r"GET /models/[^/]+/sessions",
    rf"{_BASE}/watch/[^/]+(?:/[^/]+)?",
    # The pages: the player, the model picker, the doctor. Their API calls carry the token.
    rf"{_BASE}/?",
    rf"{_BASE}/doctor/?",
    r"/models/?",
)


def client_address(scope: _Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def refusal(denied: AccessDenied) -> JSONResponse:
    headers: dict[str, str] = {}
    if denied.status == 401:
        headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    if denied.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(denied.retry_after_s)))
    return JSONResponse({"detail": denied.reason}, denied.status, headers=headers or None)


class AccessTokenMiddleware:
    def __init__(
        self,
        app: _ASGIApp,
        *,
        access: AccessControl,
        throttle: FailureThrottle,
        public_paths: Iterable[str] = ACCESS_PUBLIC_PATHS,
    ) -> None:
        self.app = app
        self.access = access
        self.throttle = throttle
        # An entry is a path pattern, or "METHOD pattern" for one method only.
        self._public = re.compile("|".join(
            f"(?:{p})" if " " in p else f"(?:[A-Z]+ {p})" for p in public_paths) or r"(?!)")

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope, path_token = strip_token_prefix(scope)
        if self._public.fullmatch(f"{scope.get('method', 'GET')} {route_path(scope)}"):
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        presented: str | None = None
        try:
            retry = self.throttle.retry_after_s(address)
            if retry is not None:
                raise AccessDenied(429, "too many failed attempts from this address",
                                   retry_after_s=retry)
            presented = path_token or bearer_token(scope)
            grant = await self.access.authenticate(presented)
        except AccessDenied as denied:
            # Only a credential that was tried counts: a request without one is not
            # a guess (a page's first call, a client that forgot the header).
            if denied.status == 401 and presented:
                self.throttle.failed(address)
                await asyncio.sleep(self.throttle.delay_s(address))
            if scope["type"] == "http":
                await refusal(denied)(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        # The scope is this request's own (as Starlette's routing does, a key is set
        # on it rather than the whole of it copied on every request).
        scope[GRANT_SCOPE_KEY] = grant
        await self.app(scope, receive, send)
