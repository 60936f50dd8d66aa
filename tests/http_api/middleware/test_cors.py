"""CORSMiddleware (http_api/middleware/cors.py): `*` for every origin on every HTTP
response, errors and crashes included, never with credentials; preflights answered
before anything else with a listed set of methods and headers, never an echo of what
was asked; nothing but HTTP touched.

First through the whole session app, then the middleware alone in front of small apps."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from asgi_calls import RecordingApp, call_asgi, client
from fake_backend import (
    detail,
    fake,  # noqa: F401 (fixtures: http needs it)
    http,  # noqa: F401 (fixtures)
)

from reactor_serve.http_api.middleware.cors import (
    CORS_ALLOWED_HEADERS,
    CORSMiddleware,
    allowed_request_headers,
)

# --------------------------------------------------------------------------- through the session app


async def test_cors_on_success_and_errors(http):
    origin = {"Origin": "http://elsewhere.example"}
    for r in [
        await http.get("/health", headers=origin),
        await http.get("/session", headers=origin),
        await http.post("/start_session", content=b"{", headers=origin),
        await http.post("/start_session", content=b" " * 300_000, headers=origin),
    ]:
        assert r.headers["access-control-allow-origin"] == "*", r.status_code
        assert r.headers["access-control-expose-headers"] == "Retry-After"
        assert "access-control-allow-credentials" not in r.headers


async def test_preflight_lists_methods_and_headers_instead_of_echoing(http):
    r = await http.options("/sessions/x/transport/webrtc/sdp_params", headers={
        "Origin": "http://elsewhere.example",
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers":
            "authorization, content-type, reactor-api-version, reactor-future-thing, x-evil",
    })
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "reactor-api-version",
            "reactor-api-accept-version", "reactor-webrtc-version",
            "reactor-future-thing"} == allowed
    methods = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    assert methods == {"GET", "POST", "PUT", "DELETE", "OPTIONS"}
    r = await http.options("/start_session", headers={
        "Origin": "http://x", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "*"})
    assert "*" not in r.headers["access-control-allow-headers"]


# --------------------------------------------------------------------------- the middleware alone

FIXED = [h.lower() for h in CORS_ALLOWED_HEADERS]


def allow_headers(r: Any) -> list[str]:
    return [h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")]


async def preflight(requested: str | bytes | None, app: Any = None) -> Any:
    headers: dict[str, Any] = {"Origin": "http://elsewhere.example",
                               "Access-Control-Request-Method": "POST"}
    if requested is not None:
        headers["Access-Control-Request-Headers"] = requested
    async with client(CORSMiddleware(app or RecordingApp())) as http:
        return await http.options("/any/path", headers=headers)


async def test_a_preflight_is_answered_without_reaching_the_app():
    app = RecordingApp()
    r = await preflight(None, app)
    assert app.calls == []
    assert r.status_code == 204 and r.content == b""
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-expose-headers"] == "Retry-After"
    assert r.headers["access-control-allow-methods"] == "GET, POST, PUT, DELETE, OPTIONS"
    assert allow_headers(r) == FIXED
    assert r.headers["access-control-max-age"] == "600"
    assert r.headers["vary"] == "Access-Control-Request-Headers"
    assert "access-control-allow-credentials" not in r.headers


@pytest.mark.parametrize("requested, extra", [
    ("x-evil, cookie, set-cookie, origin", []),
    ("*", []),
    ("reactor-ok, reactor-a_b, reactor-, reactor-" + "a" * 65, ["reactor-ok"]),
    ("reactor-ä, reactor-ok".encode(), ["reactor-ok"]),
    ("reactor-" + "a" * 64, ["reactor-" + "a" * 64]),
    ("REACTOR-X, reactor-x,reactor-x ,  Reactor-X", ["reactor-x"]),
    ("AUTHORIZATION, Content-Type, reactor-api-version", []),
    (",,, ,reactor-y,,", ["reactor-y"]),
    (b"reactor-\xff, reactor-z", ["reactor-z"]),
])
async def test_a_preflight_allows_only_listed_and_reactor_headers(requested, extra):
    r = await preflight(requested)
    assert allow_headers(r) == FIXED + extra


async def test_a_preflight_allows_at_most_eight_extra_headers_however_many_are_asked():
    asked = ", ".join(f"reactor-h{i}" for i in range(20_000))  # about 240 KB
    r = await preflight(asked)
    assert allow_headers(r) == FIXED + [f"reactor-h{i}" for i in range(8)]


async def test_a_preflight_never_carries_an_injected_header_line():
    scope = {"type": "http", "method": "OPTIONS", "path": "/", "headers": [
        (b"access-control-request-headers", b"reactor-a\r\nset-cookie: x=1, reactor-b\nx: y"),
    ]}
    sent = await call_asgi(CORSMiddleware(RecordingApp()), scope)
    start = sent[0]
    names = [name for name, _ in start["headers"]]
    assert b"set-cookie" not in names and b"x" not in names
    assert all(b"\r" not in v and b"\n" not in v for _, v in start["headers"])
    allowed = dict(start["headers"])[b"access-control-allow-headers"].decode()
    assert "reactor-a" not in allowed and "reactor-b" not in allowed


def test_allowed_request_headers_alone():
    assert allowed_request_headers(None) == list(CORS_ALLOWED_HEADERS)
    assert allowed_request_headers("") == list(CORS_ALLOWED_HEADERS)
    assert allowed_request_headers("reactor-new, x-other") == [*CORS_ALLOWED_HEADERS, "reactor-new"]


async def test_the_origin_is_never_echoed():
    async with client(CORSMiddleware(RecordingApp())) as http:
        r = await http.get("/", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "*"
    assert not any("evil" in value for value in r.headers.values())


async def test_the_apps_own_cors_headers_are_replaced_and_its_others_kept():
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"Access-Control-Allow-Origin", b"http://evil.example"),
            (b"access-control-expose-headers", b"X-Secret"),
            (b"x-kept", b"1"),
        ]})
        await send({"type": "http.response.body", "body": b"ok"})

    async with client(CORSMiddleware(app)) as http:
        r = await http.get("/")
    assert r.headers.get_list("access-control-allow-origin") == ["*"]
    assert r.headers.get_list("access-control-expose-headers") == ["Retry-After"]
    assert r.headers["x-kept"] == "1" and r.text == "ok"


@pytest.mark.parametrize("status", [400, 401, 404, 413, 500, 503])
async def test_error_answers_of_the_app_carry_cors(status):
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with client(CORSMiddleware(app)) as http:
        r = await http.post("/")
    assert r.status_code == status
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-expose-headers"] == "Retry-After"


async def test_an_app_that_raises_before_answering_is_a_logged_500_with_cors(caplog):
    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise RuntimeError("secret detail")

    with caplog.at_level(logging.ERROR, logger="reactor_serve.http_api"):
        async with client(CORSMiddleware(app)) as http:
            r = await http.post("/boom")
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error"}
    assert detail(r) == "internal server error" and "secret" not in r.text
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-expose-headers"] == "Retry-After"
    assert "unhandled error in POST /boom" in caplog.text and "secret detail" in caplog.text


async def test_an_app_that_raises_mid_response_is_not_answered_twice():
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("half way")

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    with pytest.raises(RuntimeError, match="half way"):
        await CORSMiddleware(app)(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start"]


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_other_scopes_pass_through_untouched(kind):
    # A WebSocket handshake is no CORS request; lifespan has no method at all.
    app = RecordingApp()
    scope = {"type": kind, "method": "OPTIONS", "path": "/",
             "headers": [(b"origin", b"http://evil.example")]}

    async def receive() -> dict:
        return {"type": f"{kind}.disconnect"}

    async def send(message: dict) -> None:
        raise AssertionError(f"the middleware answered {message}")

    await CORSMiddleware(app)(scope, receive, send)
    assert app.calls == [(scope, receive, send)]
