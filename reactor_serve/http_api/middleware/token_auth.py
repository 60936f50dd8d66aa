"""Token auth for a whole app, as a pure ASGI middleware.

A request is let through when it carries the token as `Authorization: Bearer <token>`,
or as a `/t/{token}/` path prefix (the JS SDK 2.9.0 in local mode cannot send a
header, so its `apiUrl` carries the token), or when its path is on a small public
allow-list: `/health` and the web client's static `_web/` files, at the root or under
`/models/{name}`. Everything else, `/docs`, `/redoc` and `/openapi.json` included,
wants the token. Anything else is a 401 that says how to send it.

The `/t/{token}` prefix is stripped whether or not a token is configured, so a client
whose `apiUrl` carries one works against any server. It is moved into the ASGI
`root_path` (as a `Mount` would): routing sees the path below it, while URLs built
from the request (redirects, FastAPI's `/docs` fetching `openapi.json`) keep it.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = [
    "DEFAULT_PUBLIC_PATHS",
    "TokenAuthMiddleware",
    "bearer_token",
    "route_path",
    "strip_token_prefix",
]

_Scope = MutableMapping[str, Any]
_ASGIApp = Callable[[_Scope, Any, Any], Awaitable[None]]

# Full-match patterns on the path below the root path (and below any token prefix).
DEFAULT_PUBLIC_PATHS: tuple[str, ...] = (
    r"(?:/models/[^/]+)?/health",
    r"(?:/models/[^/]+)?/_web/[^/]+",
)

_TOKEN_PREFIX = re.compile(r"^/t/([^/]+)(?=/|$)")
_UNAUTHORISED = (
    "a valid token is required: send 'Authorization: Bearer <token>' or prefix the "
    "path with /t/<token>"
)


def route_path(scope: _Scope) -> str:
    """The path below `root_path` (what the router matches)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "") or ""
    if root and path.startswith(root):
        return path[len(root):]
    return path


def strip_token_prefix(scope: _Scope) -> tuple[_Scope, str | None]:
    """(scope with a leading `/t/{token}` moved into `root_path`, the token or None).

    The caller's scope is never mutated.
    """
    path: str = scope["path"]
    root: str = scope.get("root_path", "") or ""
    inside = path.startswith(root)
    rest = path[len(root):] if inside else path
    match = _TOKEN_PREFIX.match(rest)
    if match is None:
        return scope, None
    token = match.group(1)
    scope = dict(scope)
    scope["root_path"] = root + rest[: match.end()]
    if not inside:
        # A server that keeps root_path out of path: drop the prefix from path instead.
        scope["path"] = rest[match.end():] or "/"
    return scope, token


class TokenAuthMiddleware:
    """Let a request through only with the token, unless its path is public.

    `token=None` turns the check off (the `/t/{token}` prefix is still stripped), and
    any `Authorization` header is then ignored (the JS SDK sends `Bearer local`).
    """

    def __init__(
        self,
        app: _ASGIApp,
        *,
        token: str | None,
        public_paths: Iterable[str] = DEFAULT_PUBLIC_PATHS,
    ) -> None:
        if token is not None and not token:
            raise ValueError("the auth token must not be empty (use None for no token)")
        self.app = app
        self._token = token.encode("utf-8") if token is not None else None
        self._public = re.compile("|".join(f"(?:{p})" for p in public_paths) or r"(?!)")

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope, path_token = strip_token_prefix(scope)
        if self._allowed(scope, path_token):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await JSONResponse(
                {"detail": _UNAUTHORISED}, 401, headers={"WWW-Authenticate": "Bearer"}
            )(scope, receive, send)
        else:
            # Closing before accepting is how ASGI refuses a WebSocket handshake (403).
            await send({"type": "websocket.close", "code": 1008})

    def _allowed(self, scope: _Scope, path_token: str | None) -> bool:
        if self._token is None:
            return True
        if self._public.fullmatch(route_path(scope)):
            return True
        if path_token is not None and self._same(path_token):
            return True
        return self._same(bearer_token(scope))

    def _same(self, given: str | None) -> bool:
        assert self._token is not None
        if given is None:
            return False
        # Constant-time: the token is the only secret between a client and the server.
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._token)


def bearer_token(scope: _Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"authorization":
            scheme, _, credential = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return credential.strip()
            return None
    return None
