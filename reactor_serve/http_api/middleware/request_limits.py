"""Bounds on what a request may carry before any route sees it, as a pure ASGI middleware.

- The body: at most `max_body_bytes`. A declared `Content-Length` over the limit is
  refused before a byte is read; a body without one (chunked) is counted as it streams
  in and refused as soon as it passes the limit, so a 20 MB upload is never buffered.
  Either way the answer is 413 naming the limit.
- The URL: path plus query string at most `max_url_bytes`, else 414.
- `body_limits`: `(method, path pattern, limit)` rules for the few routes whose body is
  a file rather than a document (an upload's `PUT`); the first that matches replaces
  `max_body_bytes` for that request.

The routes then bound each field (see `http_api/bodies.py`); this layer keeps the
memory one request can take small whatever route it hits.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_URL_BYTES",
    "BodyTooLarge",
    "RequestLimitsMiddleware",
]

_Scope = MutableMapping[str, Any]
_ASGIApp = Callable[[_Scope, Any, Any], Awaitable[None]]

# An SDP offer with many candidates is a few KiB; 64 KiB is its own limit. The body
# limit leaves room for that plus a track mapping and extra_args.
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_MAX_URL_BYTES = 16 * 1024


class BodyTooLarge(HTTPException):
    """Raised from `receive` when the body passes the limit mid-stream.

    An HTTPException, so that whichever layer sees it first answers 413: Starlette's
    exception handling around the route, or this middleware.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large(limit))


def _too_large(limit: int) -> str:
    return f"request body too large: the limit is {limit} bytes ({limit // 1024} KiB)"


class RequestLimitsMiddleware:
    """Refuse bodies over `max_body_bytes` (413) and URLs over `max_url_bytes` (414)."""

    def __init__(
        self,
        app: _ASGIApp,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_url_bytes: int = DEFAULT_MAX_URL_BYTES,
        body_limits: Sequence[tuple[str, re.Pattern[str], int]] = (),
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_url_bytes = max_url_bytes
        self.body_limits = tuple(body_limits)

    def body_limit(self, method: str, path: str) -> int:
        """The body bound of a request."""
        for rule_method, pattern, limit in self.body_limits:
            if method == rule_method and pattern.fullmatch(path):
                return limit
        return self.max_body_bytes

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        url_bytes = len(scope["path"].encode("utf-8", "surrogatepass")) + len(
            scope.get("query_string", b"")
        )
        if url_bytes > self.max_url_bytes:
            await _refuse(scope, receive, send, 414,
                          f"URL too long: the limit is {self.max_url_bytes} bytes")
            return
        limit = self.body_limit(scope.get("method", ""), scope["path"])
        declared = _content_length(scope)
        if declared == -1:
            await _refuse(scope, receive, send, 400,
                          "Content-Length is not a non-negative integer")
            return
        if declared is not None and declared > limit:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return

        received = 0
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await _refuse(scope, receive, send, 413, _too_large(limit))


def _content_length(scope: _Scope) -> int | None:
    """The declared body length; None when absent, -1 when malformed."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            text = value.strip()
            # isdigit() on bytes is ASCII-only.
            if not text.isdigit():
                return -1
            # Past 18 digits it is over any limit; don't parse a huge number.
            return int(text) if len(text) <= 18 else 10**18
    return None


async def _refuse(scope: _Scope, receive: Any, send: Any, status: int, detail: str) -> None:
    await JSONResponse({"detail": detail}, status)(scope, receive, send)
