"""Collapse doubled slashes in request paths, as a pure ASGI middleware.

The JS SDK builds its URLs as `${apiUrl}/start_session`, so an `apiUrl` that ends in a
slash (the natural way to write `http://host/models/x/`) yields `//start_session`.
FastAPI's router matches paths literally, so the path is rewritten before routing.
Only the part below the app's `root_path` (the mount point, e.g. a Serve route
prefix) is touched.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["PathNormalisationMiddleware", "collapse_slashes"]

_Scope = MutableMapping[str, Any]
_ASGIApp = Callable[[_Scope, Any, Any], Awaitable[None]]

_SLASHES = re.compile(r"/{2,}")
_RAW_SLASHES = re.compile(rb"/{2,}")


def collapse_slashes(scope: _Scope) -> _Scope:
    """The scope with runs of `/` in its path (below `root_path`) made single.

    Returns the same scope when there is nothing to change, else a copy: the caller's
    scope is never mutated.
    """
    path: str = scope["path"]
    if "//" not in path:
        return scope
    root: str = scope.get("root_path", "") or ""
    # ASGI servers put the root path inside `path`; keep that part as it is.
    prefix, rest = (root, path[len(root):]) if root and path.startswith(root) else ("", path)
    new_path = prefix + _SLASHES.sub("/", rest)
    if new_path == path:
        return scope
    scope = dict(scope)
    scope["path"] = new_path
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        # raw_path is only informational for Starlette; keep it consistent anyway.
        scope["raw_path"] = _RAW_SLASHES.sub(b"/", raw)
    return scope


class PathNormalisationMiddleware:
    """Rewrite `//` to `/` in HTTP and WebSocket paths before the app routes them."""

    def __init__(self, app: _ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = collapse_slashes(scope)
        await self.app(scope, receive, send)
