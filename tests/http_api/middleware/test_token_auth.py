"""TokenAuthMiddleware (http_api/middleware/token_auth.py): with a token set, a request
passes with `Authorization: Bearer <token>`, under a `/t/<token>/` path prefix, or on a
public path; anything else is 401 (a WebSocket is closed unaccepted). The prefix moves
into root_path whether or not a token is set. The compare is constant-time.

First through the whole session app, then the middleware alone in front of small apps."""

from __future__ import annotations

from asgi_calls import client
from fake_backend import MAPPING, OFFER, FakeBackend, W, detail
from fastapi import FastAPI

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
