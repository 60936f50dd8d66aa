"""The upload routes over the in-test backend: what a client must send to reserve an
upload and write its bytes, and the 4xx for everything else. The bounds themselves
are the store's (tests/sessions/uploads); both real servers are in the contract suite."""

from __future__ import annotations

import pytest
from asgi_calls import client
from fake_backend import FakeBackend, detail, start

from reactor_serve.http_api.routes import session_app

UPLOAD = {"name": "photo.png", "size": 5, "mime_type": "image/png"}


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(fake):
    app = session_app(lambda request: fake, server_version="9.9.9", max_upload_bytes=4000)
    async with client(app) as c:
        yield c


async def reserve(http, sid, body=UPLOAD, prefix=""):
    r = await http.post(f"{prefix}/sessions/{sid}/uploads", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def test_reserve_then_put_the_bytes(http, fake):
    sid = await start(http)
    reply = await reserve(http, sid)
    upload_id = reply["presigned_id"]
    assert reply["upload_id"] == upload_id
    assert reply["presigned_url"] == f"http://test/uploads/{upload_id}"
    assert reply["path"] == f"sessions/{sid}/uploads/{upload_id}/photo.png"
    r = await http.put(f"/uploads/{upload_id}", content=b"12345",
                       headers={"content-type": "image/png"})
    assert r.status_code == 200 and r.content == b"", r.text
    assert fake.uploads.file(upload_id).data == b"12345"
    again = await http.put(f"/uploads/{upload_id}", content=b"12345")
    assert again.status_code == 409, again.text


async def test_the_put_url_keeps_the_routes_prefix():
    fake = FakeBackend()
    from fastapi import FastAPI

    from reactor_serve.http_api.routes import add_session_middleware, session_routes

    app = FastAPI()
    add_session_middleware(app, auth_token=None, max_upload_bytes=4000)
    app.include_router(session_routes(lambda r: fake, server_version="1"), prefix="/models/{name}")
    async with client(app) as http:
        sid = await start(http, "/models/m")
        reply = await reserve(http, sid, prefix="/models/m")
        url = reply["presigned_url"]
        assert url == f"http://test/models/m/uploads/{reply['presigned_id']}"
        assert (await http.put(url, content=b"12345")).status_code == 200


@pytest.mark.parametrize("body, words", [
    ({"size": 5, "mime_type": "a/b"}, "name"),
    ({"name": "", "size": 5, "mime_type": "a/b"}, "name"),
    ({"name": 5, "size": 5, "mime_type": "a/b"}, "name"),
    ({"name": "x" * 256, "size": 5, "mime_type": "a/b"}, "name"),
    ({"name": "a\x00b", "size": 5, "mime_type": "a/b"}, "control"),
    ({"name": "x", "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": 0, "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": -3, "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": 2.5, "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": True, "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": "5", "mime_type": "a/b"}, "size"),
    ({"name": "x", "size": 5}, "mime_type"),
    ({"name": "x", "size": 5, "mime_type": "png"}, "mime_type"),
    ({"name": "x", "size": 5, "mime_type": "a/b\r\nX-Evil: 1"}, "mime_type"),
])
async def test_a_bad_reservation_is_400_naming_the_field(http, fake, body, words):
    sid = await start(http)
    r = await http.post(f"/sessions/{sid}/uploads", json=body)
    assert r.status_code == 400, r.text
    assert detail(r).startswith(words) or words in detail(r)
    assert not fake.called("create_upload")


@pytest.mark.parametrize("raw", [b"", b"[]", b"null", b"{", b'{"name": "\\ud800", "size": 1, "mime_type": "a/b"}',
                                 b'{"name": "x", "size": ' + b"9" * 5000 + b', "mime_type": "a/b"}'])
async def test_malformed_bodies_are_400(http, fake, raw):
    sid = await start(http)
    r = await http.post(f"/sessions/{sid}/uploads", content=raw,
                        headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert not fake.called("create_upload")


async def test_over_the_bounds_is_413(http):
    sid = await start(http)
    r = await http.post(f"/sessions/{sid}/uploads", json={**UPLOAD, "size": 1001})
    assert r.status_code == 413 and "1000" in detail(r)


async def test_an_unknown_session_is_404(http):
    r = await http.post("/sessions/nope/uploads", json=UPLOAD)
    assert r.status_code == 404


@pytest.mark.parametrize("upload_id", [
    "00000000-0000-4000-8000-000000000000",  # well formed, never issued
    "not-a-uuid", "..", "%2e%2e", "A" * 300,
])
async def test_a_put_to_an_id_never_issued_is_404(http, fake, upload_id):
    r = await http.put(f"/uploads/{upload_id}", content=b"x")
    assert r.status_code in (404, 414), r.text
    assert not fake.called("write_upload")


async def test_a_body_that_is_not_the_reserved_size_is_refused_unread(http, fake):
    sid = await start(http)
    upload_id = (await reserve(http, sid))["presigned_id"]
    short = await http.put(f"/uploads/{upload_id}", content=b"1234")
    assert short.status_code == 400 and "reserved for 5 bytes" in detail(short)
    # Chunked, without a Content-Length: read no further than the reservation.

    async def chunks():
        for _ in range(100):
            yield b"0123456789"

    long = await http.put(f"/uploads/{upload_id}", content=chunks())
    assert long.status_code == 400 and "longer than the 5 bytes" in detail(long)
    assert not fake.called("write_upload")
    ok = await http.put(f"/uploads/{upload_id}", content=b"12345")
    assert ok.status_code == 200


async def test_a_body_past_the_servers_upload_bound_is_413_before_any_route(http, fake):
    r = await http.put("/uploads/00000000-0000-4000-8000-000000000000", content=b"x" * 5000)
    assert r.status_code == 413
    assert not fake.called("upload_size")


async def test_the_put_url_keeps_a_token_prefix():
    fake = FakeBackend()
    app = session_app(lambda request: fake, server_version="1", auth_token="tok",
                      max_upload_bytes=4000)
    async with client(app) as http:
        sid = await start(http, "/t/tok")
        reply = await reserve(http, sid, prefix="/t/tok")
        assert reply["presigned_url"] == f"http://test/t/tok/uploads/{reply['presigned_id']}"
        assert (await http.put(reply["presigned_url"], content=b"12345")).status_code == 200
        # Without the token, nothing is written.
        other = await reserve(http, sid, prefix="/t/tok")
        refused = await http.put(f"/uploads/{other['presigned_id']}", content=b"12345")
        assert refused.status_code == 401
