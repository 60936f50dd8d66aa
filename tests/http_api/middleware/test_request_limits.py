"""RequestLimitsMiddleware (http_api/middleware/request_limits.py): a body over the
limit is 413 whether its Content-Length says so, lies, or is absent; a malformed
Content-Length is 400; a URL over the limit is 414; nothing but HTTP is touched.

First through the whole session app (the default limits), then the middleware alone in
front of a recording app with small limits, so that each boundary is a byte away."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgi_calls import RecordingApp, call_asgi, client
from fake_backend import W, detail, fake, http  # noqa: F401 (fixtures)
from fastapi import FastAPI, Request

from reactor_serve.http_api.middleware.request_limits import (
    BodyTooLarge,
    RequestLimitsMiddleware,
)

# --------------------------------------------------------------------------- through the session app


async def test_a_declared_oversized_body_is_413_before_anything_reads_it(http, fake):
    r = await http.post("/start_session", content=b"{" + b" " * (300 * 1024) + b"}")
    assert r.status_code == 413
    assert "262144 bytes" in detail(r)
    assert fake.calls == []


async def test_a_streamed_20_mb_body_is_refused_without_being_buffered(http, fake):
    sent = 0
    chunk = b" " * 65536

    async def body():
        nonlocal sent
        for _ in range(20 * 16):  # 20 MiB, no Content-Length: chunked
            sent += len(chunk)
            yield chunk

    r = await http.post(W.format(sid="abc") + "/sdp_params", content=body())
    assert r.status_code == 413 and "262144 bytes" in detail(r)
    # The server stopped reading right past the limit.
    assert sent <= 256 * 1024 + len(chunk)
    assert fake.calls == []


async def test_an_overlong_url_is_414(http, fake):
    r = await http.get(W.format(sid="s" * 17_000) + "/sdp_params")
    assert r.status_code == 414 and "16384" in detail(r)
    r = await http.get("/session", params={"session_id": "s" * 17_000})
    assert r.status_code == 414


# --------------------------------------------------------------------------- the middleware alone

BODY_LIMIT = 1000
URL_LIMIT = 100


def limited(app: RecordingApp) -> RequestLimitsMiddleware:
    return RequestLimitsMiddleware(app, max_body_bytes=BODY_LIMIT, max_url_bytes=URL_LIMIT)


async def chunks(count: int, size: int, sent: list[int]) -> AsyncIterator[bytes]:
    """`count` chunks of `size` bytes with no Content-Length (chunked); `sent` counts
    how many the server pulled."""
    for _ in range(count):
        sent[0] += size
        yield b"x" * size


async def test_a_body_of_exactly_the_limit_passes_and_one_byte_more_is_413_unread():
    app = RecordingApp()
    async with client(limited(app)) as http:
        r = await http.post("/", content=b"x" * BODY_LIMIT)
        assert r.status_code == 200 and r.json()["body_bytes"] == BODY_LIMIT
        r = await http.post("/", content=b"x" * (BODY_LIMIT + 1))
    assert r.status_code == 413
    assert detail(r) == "request body too large: the limit is 1000 bytes (0 KiB)"
    assert len(app.calls) == 1  # the declared length alone refused the second


async def test_a_content_length_that_lies_small_is_caught_by_counting():
    app = RecordingApp()
    async with client(limited(app)) as http:
        r = await http.post("/", content=b"x" * (BODY_LIMIT * 5), headers={"Content-Length": "10"})
    assert r.status_code == 413 and "the limit is 1000 bytes" in detail(r)
    assert len(app.calls) == 1  # the app was reached, and its read failed past the limit


async def test_a_chunked_body_within_the_limit_passes_whole():
    sent = [0]
    async with client(limited(RecordingApp())) as http:
        r = await http.post("/", content=chunks(10, 100, sent))
    assert r.status_code == 200 and r.json()["body_bytes"] == 1000 == sent[0]


async def test_a_chunked_body_past_the_limit_is_413_and_stops_being_read():
    sent = [0]
    async with client(limited(RecordingApp())) as http:
        r = await http.post("/", content=chunks(1000, 100, sent))
    assert r.status_code == 413 and "the limit is 1000 bytes" in detail(r)
    assert sent[0] == BODY_LIMIT + 100  # the chunk that crossed the limit, and no more


@pytest.mark.parametrize("declared", [
    b"-1", b"-0", b"+5", b"abc", b"", b"1e3", b"0x10", b"1.0", b"1 2", b"1,1",
    "\u0661\u0662".encode(),  # Arabic-Indic digits: str.isdigit() would take them
    b"\xb2",  # latin-1 superscript two
])
async def test_a_content_length_that_is_not_a_non_negative_integer_is_400(declared):
    app = RecordingApp()
    async with client(limited(app)) as http:
        r = await http.post("/", content=b"x", headers={"Content-Length": declared})
    assert r.status_code == 400
    assert detail(r) == "Content-Length is not a non-negative integer"
    assert app.calls == []


async def test_a_huge_declared_length_is_413_not_an_error():
    app = RecordingApp()
    async with client(limited(app)) as http:
        for declared in ("9" * 19, "9" * 5000, "0" * 30 + "1001"):
            r = await http.post("/", content=b"x", headers={"Content-Length": declared})
            assert r.status_code == 413, declared
    assert app.calls == []


async def test_a_body_the_route_reads_itself_is_413_from_the_route():
    # BodyTooLarge is an HTTPException: FastAPI's handler around the route answers it.
    app = FastAPI()
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=BODY_LIMIT)
    reached = []

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        reached.append(True)
        return {"size": len(await request.body())}

    sent = [0]
    async with client(app) as http:
        assert (await http.post("/upload", content=b"x" * BODY_LIMIT)).json() == {"size": 1000}
        r = await http.post("/upload", content=chunks(50, 100, sent))
    assert r.status_code == 413 and "the limit is 1000 bytes" in detail(r)
    assert reached == [True, True] and sent[0] == BODY_LIMIT + 100


async def test_past_the_limit_after_the_response_started_the_error_propagates():
    # Half a response is out: a second one cannot follow, the server must drop it.
    app = RecordingApp(respond_first=True)
    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"", "headers": []}
    incoming = [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 2
    with pytest.raises(BodyTooLarge) as raised:
        await call_asgi(limited(app), scope, incoming)
    assert raised.value.status_code == 413


async def test_a_url_of_exactly_the_limit_passes_and_one_byte_more_is_414():
    app = RecordingApp()
    async with client(limited(app)) as http:
        assert (await http.get("/" + "a" * (URL_LIMIT - 1))).status_code == 200
        r = await http.get("/" + "a" * URL_LIMIT)
        assert r.status_code == 414 and detail(r) == "URL too long: the limit is 100 bytes"
        # The query string counts: "/a" and "q=" are 4 of the 100 bytes.
        assert (await http.get("/a", params={"q": "b" * (URL_LIMIT - 4)})).status_code == 200
        assert (await http.get("/a", params={"q": "b" * (URL_LIMIT - 3)})).status_code == 414
    assert len(app.calls) == 2


async def test_the_url_limit_counts_utf8_bytes_not_characters():
    app = RecordingApp()
    async with client(limited(app)) as http:
        # 51 characters, 101 bytes once encoded.
        assert (await http.get("/" + "ü" * 50)).status_code == 414
        assert (await http.get("/" + "ü" * 49)).status_code == 200


@pytest.mark.parametrize("count, status", [(33, 200), (34, 414)])
async def test_a_path_with_lone_surrogates_is_measured_not_crashed_on(count, status):
    # A server may hand over undecodable path bytes as lone surrogates (3 bytes each).
    scope = {"type": "http", "method": "GET", "path": "/" + "\ud800" * count,
             "query_string": b"", "headers": []}
    sent = await call_asgi(limited(RecordingApp()), scope)
    assert sent[0]["status"] == status


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_other_scopes_pass_through_untouched(kind):
    app = RecordingApp()
    scope = {"type": kind, "path": "/" + "a" * (URL_LIMIT * 10),
             "headers": [(b"content-length", b"nonsense")]}

    async def receive() -> dict:
        return {"type": f"{kind}.disconnect"}

    async def send(message: dict) -> None:
        raise AssertionError(f"the middleware answered {message}")

    await limited(app)(scope, receive, send)
    assert app.calls == [(scope, receive, send)]


async def test_a_body_limit_rule_applies_to_its_method_and_path_only():
    import re

    app = RecordingApp()
    middleware = RequestLimitsMiddleware(
        app, max_body_bytes=BODY_LIMIT, max_url_bytes=URL_LIMIT,
        body_limits=(("PUT", re.compile(r".*/uploads/[^/]+"), 5000),),
    )
    async with client(middleware) as http:
        assert (await http.put("/m/uploads/abc", content=b"x" * 5000)).status_code == 200
        too_big = await http.put("/m/uploads/abc", content=b"x" * 5001)
        assert too_big.status_code == 413 and "the limit is 5000 bytes" in detail(too_big)
        # Another method, or another path, keeps the general limit.
        assert (await http.post("/m/uploads/abc", content=b"x" * 1001)).status_code == 413
        assert (await http.put("/m/uploads", content=b"x" * 1001)).status_code == 413
        assert (await http.put("/m/uploads/abc/more", content=b"x" * 1001)).status_code == 413
