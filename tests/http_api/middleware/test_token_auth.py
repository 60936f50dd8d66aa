"""TokenAuthMiddleware (http_api/middleware/token_auth.py): with a token set, a request
passes with `Authorization: Bearer <token>`, under a `/t/<token>/` path prefix, or on a
public path; anything else is 401 (a WebSocket is closed unaccepted). The prefix moves
into root_path whether or not a token is set. The compare is constant-time.

First through the whole session app, then the middleware alone in front of small apps."""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest
from asgi_calls import RecordingApp, call_asgi, client
from fake_backend import (
    MAPPING,
    OFFER,
    FakeBackend,
    W,
    detail,
    fake,  # noqa: F401 (fixtures: http needs it)
    http,  # noqa: F401 (fixtures)
)
from fastapi import FastAPI, Request

from reactor_serve.http_api.middleware.token_auth import (
    TokenAuthMiddleware,
    strip_token_prefix,
)
from reactor_serve.http_api.pages import asset_routes
from reactor_serve.http_api.routes import add_session_middleware, session_routes

# --------------------------------------------------------------------------- through the session app


async def test_reactor_version_headers_and_bearer_local_ignored_without_token(http):
    headers = {
        "Reactor-API-Version": "1", "Reactor-API-Accept-Version": "1",
        "Reactor-WebRTC-Version": "1.0", "Authorization": "Bearer local",
    }
    r = await http.post("/start_session", json={}, headers=headers)
    assert r.status_code == 200
    sid = r.json()["session_id"]
    r = await http.get(W.format(sid=sid) + "/ice_servers", headers=headers)
    assert r.status_code == 200


def token_app(fake: FakeBackend, token: str = "s3cret") -> FastAPI:
    app = FastAPI()
    add_session_middleware(app, auth_token=token)
    app.include_router(session_routes(lambda request: fake, server_version="1"))
    app.include_router(asset_routes(""))

    @app.get("/")
    async def index() -> dict[str, str]:
        return {"page": "index"}

    return app


async def test_token_via_header_or_path_prefix():
    fake = FakeBackend()
    async with client(token_app(fake)) as http:
        for headers in ({}, {"Authorization": "Bearer local"}, {"Authorization": "Bearer nope"},
                        {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"}):
            r = await http.post("/start_session", json={}, headers={**headers, "Origin": "http://x"})
            assert r.status_code == 401, headers
            assert "Bearer" in detail(r) and r.headers["www-authenticate"] == "Bearer"
            assert r.headers["access-control-allow-origin"] == "*"
        assert (await http.post("/t/wrong/start_session", json={})).status_code == 401
        assert fake.calls == []

        r = await http.post("/start_session", json={}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        sid = r.json()["session_id"]
        # The JS client keeps "Bearer local" on transport routes; the path token wins.
        r = await http.post(f"/t/s3cret//sessions/{sid}/transport/webrtc/sdp_params",
                            json={"sdp_offer": OFFER, "track_mapping": MAPPING},
                            headers={"Authorization": "Bearer local"})
        assert r.status_code == 202
        r = await http.get(f"/sessions/{sid}/transport/webrtc/sdp_params")
        assert r.status_code == 401
        r = await http.post("http://test//t/s3cret/stop_session", json={"session_id": sid})
        assert r.status_code == 200


async def test_token_allow_list_is_health_and_static_files_only():
    fake = FakeBackend()
    async with client(token_app(fake)) as http:
        for path in ("/health", "/t/s3cret/health", "/t/wrong/health", "/_web/player.js"):
            assert (await http.get(path)).status_code == 200, path
        for path in ("/", "/docs", "/redoc", "/openapi.json", "/session?session_id=x",
                     "/healthz", "/_web/../docs", "/sessions/x/health"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.get("/t/s3cret/openapi.json")).status_code == 200
        assert (await http.get("/", headers={"Authorization": "Bearer s3cret"})).json() == {
            "page": "index"}
        # Preflights carry no credentials: answered before the token check.
        r = await http.options("/start_session", headers={
            "Origin": "http://x", "Access-Control-Request-Method": "POST"})
        assert r.status_code == 204


async def test_docs_under_the_token_prefix_fetch_the_schema_under_it():
    async with client(token_app(FakeBackend())) as http:
        r = await http.get("/t/s3cret/docs")
        assert r.status_code == 200
        assert "/t/s3cret/openapi.json" in r.text


# --------------------------------------------------------------------------- the middleware alone

TOKEN = "s3cret"
REFUSAL = ("a valid token is required: send 'Authorization: Bearer <token>' or prefix the "
           "path with /t/<token>")


def guarded(app: RecordingApp, token: str | None = TOKEN, **kwargs: Any) -> TokenAuthMiddleware:
    return TokenAuthMiddleware(app, token=token, **kwargs)


def http_scope(path: str, root_path: str = "", headers: list | None = None) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "root_path": root_path,
            "query_string": b"", "headers": headers or []}


def assert_refused(r: Any) -> None:
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert detail(r) == REFUSAL


async def test_no_credentials_is_401_saying_how_to_send_the_token():
    app = RecordingApp()
    async with client(guarded(app)) as http:
        assert_refused(await http.get("/anything"))
        assert_refused(await http.post("/anything", content=b"body"))
    assert app.calls == []


@pytest.mark.parametrize("authorization", ["Bearer s3cret", "bearer s3cret", "BEARER s3cret"])
async def test_the_bearer_header_lets_a_request_through(authorization):
    app = RecordingApp()
    async with client(guarded(app)) as http:
        r = await http.get("/x", headers={"Authorization": authorization})
    assert r.status_code == 200 and r.json()["path"] == "/x"


@pytest.mark.parametrize("authorization", [
    "Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET", "Bearer  s3cret x", "Bearer",
    "Bearer ", "s3cret", "Basic s3cret", "Token s3cret", "Bearer local", "Bearer s3cret\x00",
])
async def test_any_other_authorization_is_401(authorization):
    app = RecordingApp()
    async with client(guarded(app)) as http:
        assert_refused(await http.get("/x", headers={"Authorization": authorization}))
    assert app.calls == []


async def test_the_path_token_lets_a_request_through_with_its_prefix_in_root_path():
    app = RecordingApp()
    async with client(guarded(app)) as http:
        r = await http.get("/t/s3cret/x/y", headers={"Authorization": "Bearer local"})
        assert r.status_code == 200
        assert r.json()["root_path"] == "/t/s3cret" and r.json()["path"] == "/t/s3cret/x/y"
        r = await http.get("/t/s3cret")
        assert r.status_code == 200 and r.json()["root_path"] == "/t/s3cret"


async def test_a_wrong_path_token_is_401_unless_the_header_is_right():
    app = RecordingApp()
    async with client(guarded(app)) as http:
        for path in ("/t/wrong/x", "/t/s3cre/x", "/t/s3cretX/x", "/t/S3CRET/x"):
            assert_refused(await http.get(path))
        assert app.calls == []
        r = await http.get("/t/wrong/x", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["root_path"] == "/t/wrong"


@pytest.mark.parametrize("path", [
    "/x/t/s3cret/y", "/tt/s3cret/x", "/T/s3cret/x", "/t//s3cret/x", "/t", "/t/", "/ts3cret/x",
])
async def test_the_token_counts_only_as_the_leading_path_segment_pair(path):
    app = RecordingApp()
    async with client(guarded(app)) as http:
        assert_refused(await http.get(path))
    async with client(guarded(app, token=None)) as http:
        r = await http.get(path)
    assert r.status_code == 200 and r.json()["root_path"] == ""  # nothing stripped


async def test_only_the_first_token_prefix_is_stripped():
    async with client(guarded(RecordingApp(), token=None)) as http:
        r = await http.get("/t/a/t/b/x")
    assert r.json()["root_path"] == "/t/a"


async def test_routing_sees_the_path_below_the_prefix_and_urls_keep_it():
    app = FastAPI()
    app.add_middleware(TokenAuthMiddleware, token=TOKEN)

    @app.get("/where")
    async def where(request: Request) -> dict[str, str]:
        return {"self": str(request.url_for("where"))}

    async with client(app) as http:
        r = await http.get("/t/s3cret/where")
    assert r.status_code == 200 and r.json() == {"self": "http://test/t/s3cret/where"}


async def test_without_a_token_every_request_passes_and_the_prefix_is_still_stripped():
    app = RecordingApp()
    async with client(guarded(app, token=None)) as http:
        for headers in ({}, {"Authorization": "Bearer local"}, {"Authorization": "Basic x"}):
            assert (await http.get("/docs", headers=headers)).status_code == 200
        r = await http.get("/t/anything/docs")
    assert r.status_code == 200 and r.json()["root_path"] == "/t/anything"


def test_an_empty_token_is_refused_at_construction():
    with pytest.raises(ValueError, match="must not be empty"):
        TokenAuthMiddleware(RecordingApp(), token="")


async def test_tokens_are_compared_in_constant_time(monkeypatch):
    compared: list[tuple[bytes, bytes]] = []

    def everything_matches(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return True

    # If the check used ==, this stand-in would never be asked and "wrong" would fail.
    monkeypatch.setattr(hmac, "compare_digest", everything_matches)
    async with client(guarded(RecordingApp())) as http:
        assert (await http.get("/x", headers={"Authorization": "Bearer wrong"})).status_code == 200
        assert (await http.get("/t/other/x")).status_code == 200
    assert compared == [(b"wrong", b"s3cret"), (b"other", b"s3cret")]


async def test_a_non_ascii_token_matches_in_the_path():
    async with client(guarded(RecordingApp(), token="ключ")) as http:
        assert (await http.get("/t/ключ/x")).status_code == 200  # sent percent-encoded
        assert_refused(await http.get("/t/ключи/x"))


@pytest.mark.parametrize("path", ["/t/\ud800/x", "/t/s3cret\udfff/x", "/\udcff"])
async def test_lone_surrogates_in_the_path_are_401_not_a_crash(path):
    # A server may hand over undecodable path bytes as lone surrogates.
    app = RecordingApp()
    sent = await call_asgi(guarded(app), http_scope(path))
    assert sent[0]["status"] == 401 and app.calls == []


async def test_very_long_tokens_are_401_without_delay():
    # "Without delay" is speed, which benchmarks measure, not tests: what is checked
    # is the behaviour, each very long token refused with the 401 that says how to
    # send one, and the app never reached.
    app = RecordingApp()
    async with client(guarded(app)) as http:
        assert_refused(await http.get("/x", headers={"Authorization": "Bearer " + "a" * 1_000_000}))
        assert_refused(await http.get("/t/" + "s3cret" * 10_000 + "/x"))
    # Past what httpx will send: a server with no URL limit of its own may pass it on.
    sent = await call_asgi(guarded(app), http_scope("/t/" + "s3cret" * 1_000_000 + "/x"))
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"]) == {"detail": REFUSAL}
    assert app.calls == []


@pytest.mark.parametrize("path", [
    "/health", "/models/gen/health", "/_web/player.js", "/models/gen/_web/x.css", "/t/wrong/health",
])
async def test_public_paths_need_no_token(path):
    async with client(guarded(RecordingApp())) as http:
        assert (await http.get(path)).status_code == 200


@pytest.mark.parametrize("path", [
    "/healthz", "/health/", "/health/x", "/x/health", "/models/a/b/health", "/models//health",
    "/_web/", "/_web/a/b", "/_web/../docs", "/docs", "/openapi.json", "/",
])
async def test_paths_near_the_public_ones_need_the_token(path):
    async with client(guarded(RecordingApp())) as http:
        assert_refused(await http.get(path))


async def test_public_paths_are_matched_below_the_root_path():
    async with client(guarded(RecordingApp()), root_path="/web") as http:
        assert (await http.get("/web/health")).status_code == 200
        assert_refused(await http.get("/web/x"))
    async with client(guarded(RecordingApp())) as http:
        assert_refused(await http.get("/web/health"))


async def test_an_empty_public_list_makes_every_path_private():
    async with client(guarded(RecordingApp(), public_paths=())) as http:
        assert_refused(await http.get("/health"))
        assert (await http.get("/t/s3cret/health")).status_code == 200


async def test_the_prefix_under_a_root_path():
    # The server keeps root_path inside path (as ASGITransport and uvicorn do).
    async with client(guarded(RecordingApp()), root_path="/web") as http:
        r = await http.get("/web/t/s3cret/x")
        assert r.status_code == 200
        assert r.json()["root_path"] == "/web/t/s3cret" and r.json()["path"] == "/web/t/s3cret/x"
        assert_refused(await http.get("/web/x"))


@pytest.mark.parametrize("path, new_path", [("/t/tok/x", "/x"), ("/t/tok", "/")])
def test_strip_token_prefix_when_root_path_is_kept_out_of_path(path, new_path):
    scope = http_scope(path, root_path="/web")
    stripped, token = strip_token_prefix(scope)
    assert token == "tok"
    assert stripped["root_path"] == "/web/t/tok" and stripped["path"] == new_path
    assert scope == http_scope(path, root_path="/web")  # the caller's scope is untouched


def test_strip_token_prefix_leaves_a_scope_without_one_as_it_is():
    scope = http_scope("/x/t/tok")
    assert strip_token_prefix(scope) == (scope, None)
    assert strip_token_prefix(scope)[0] is scope


async def test_a_websocket_without_the_token_is_closed_unaccepted():
    app = RecordingApp()
    scope = {**http_scope("/ws"), "type": "websocket"}
    sent = await call_asgi(guarded(app), scope, [{"type": "websocket.connect"}])
    assert sent == [{"type": "websocket.close", "code": 1008}] and app.calls == []

    for allowed in ({**scope, "headers": [(b"authorization", b"Bearer s3cret")]},
                    {**scope, "path": "/t/s3cret/ws"}):
        assert await call_asgi(guarded(app), allowed) == []
    assert [s["root_path"] for s in app.scopes] == ["", "/t/s3cret"]


async def test_lifespan_passes_through_untouched():
    app = RecordingApp()
    scope = {"type": "lifespan"}

    async def receive() -> dict:
        return {"type": "lifespan.startup"}

    async def send(message: dict) -> None:
        raise AssertionError(f"the middleware answered {message}")

    await guarded(app)(scope, receive, send)
    assert app.calls == [(scope, receive, send)]
