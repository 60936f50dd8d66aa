"""Driving an ASGI app in-process: an httpx client over `ASGITransport` for HTTP, and a
hand-built scope for what httpx cannot send (WebSocket and lifespan scopes, paths
holding lone surrogates). `RecordingApp` stands in for the app behind one middleware,
so a test sees exactly what that middleware passed on."""

from __future__ import annotations

import json
from collections.abc import Iterable, MutableMapping
from typing import Any

import httpx

__all__ = ["RecordingApp", "call_asgi", "client"]


def client(app: Any, **transport_kwargs: Any) -> httpx.AsyncClient:
    """An httpx client for `app` at `http://test`; `transport_kwargs` go to ASGITransport
    (`root_path=`, `raise_app_exceptions=`)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, **transport_kwargs), base_url="http://test"
    )


class RecordingApp:
    """An ASGI app that records every call (scope, receive, send) and answers an HTTP
    request with 200 and JSON naming what it saw: path, raw_path, root_path,
    query_string and how many body bytes it read.

    `read_body=False` answers without reading the body. `respond_first=True` sends the
    response start before reading the body (what a streaming route does)."""

    def __init__(self, *, read_body: bool = True, respond_first: bool = False) -> None:
        self.read_body = read_body
        self.respond_first = respond_first
        self.calls: list[tuple[MutableMapping[str, Any], Any, Any]] = []

    @property
    def scopes(self) -> list[MutableMapping[str, Any]]:
        return [scope for scope, _, _ in self.calls]

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        self.calls.append((scope, receive, send))
        if scope["type"] != "http":
            return
        if self.respond_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        size = 0
        if self.read_body:
            while True:
                message = await receive()
                size += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        raw = scope.get("raw_path")
        body = json.dumps({
            "path": scope["path"],
            "raw_path": raw.decode("latin-1") if isinstance(raw, bytes) else None,
            "root_path": scope.get("root_path", ""),
            "query_string": scope.get("query_string", b"").decode("latin-1"),
            "body_bytes": size,
        }).encode()
        if not self.respond_first:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


async def call_asgi(
    app: Any, scope: MutableMapping[str, Any], incoming: Iterable[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Call `app` with `scope`, feeding it `incoming` messages (then a disconnect);
    returns every message it sent."""
    pending = list(incoming)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return {"type": f"{scope['type']}.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent
