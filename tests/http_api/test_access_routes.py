"""The session routes under API-key access, over an in-memory backend: starts by one
key at once held to its concurrency quota (never both through on a race), the
session guard on every route that names a session, and what stays public."""

import asyncio

import httpx
import pytest
from fake_backend import FakeBackend
from fastapi import FastAPI

from reactor_serve.access.access_control import AccessControl
from reactor_serve.access.api_keys import KeyLimits
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.http_api.routes import add_session_middleware, session_routes
from reactor_serve.http_api.tokens import token_routes


@pytest.fixture
def access(tmp_path):
    control = AccessControl.open(f"sqlite:///{tmp_path / 'access.sqlite3'}",
                                 auth_secret="r" * 48)
    yield control
    control.close()


def app_over(backend, access):
    app = FastAPI()
    throttle = FailureThrottle()
    add_session_middleware(app, auth_token=None, access=access, throttle=throttle)
    app.include_router(token_routes(access, throttle))
    app.include_router(session_routes(lambda request: backend, server_version="test",
                                      access=access))
    return app


def client_of(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                             timeout=30)


async def token_for(http, key):
    minted = await http.post("/tokens", headers={"Reactor-API-Key": key}, content=b"null")
    assert minted.status_code == 200, minted.text
    return {"Authorization": f"Bearer {minted.json()['jwt']}"}


async def test_starts_at_once_never_pass_the_concurrency_quota_together(access):
    backend = FakeBackend(max_sessions=100)
    _, key = access.store.create("racer", KeyLimits(max_concurrent=2))
    async with client_of(app_over(backend, access)) as http:
        auth = await token_for(http, key)
        answers = await asyncio.gather(*(
            http.post("/sessions", json={"model": {"name": "generator"}}, headers=auth)
            for _ in range(8)))
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [201, 201] + [429] * 6, [a.text for a in answers]
    assert len(backend.sessions) == 2


async def test_the_duration_limit_reaches_the_backend(access):
    backend = FakeBackend(max_sessions=10)
    _, key = access.store.create("short", KeyLimits(max_session_s=90))
    async with client_of(app_over(backend, access)) as http:
        auth = await token_for(http, key)
        started = await http.post("/start_session", json={}, headers=auth)
    assert started.status_code == 200, started.text
    assert backend.durations == [90.0]


async def test_every_route_naming_a_session_is_guarded(access):
    backend = FakeBackend(max_sessions=10)
    _, alice = access.store.create("alice")
    _, bob = access.store.create("bob")
    app = app_over(backend, access)
    routes = session_routes(lambda request: backend, server_version="test", access=access)
    paths = [(route.path, sorted(route.methods)) for route in routes.routes
             if "{sid}" in route.path]
    assert len(paths) >= 15  # transport, connections, uploads, viewers, steps, clips
    async with client_of(app) as http:
        alice_auth, bob_auth = await token_for(http, alice), await token_for(http, bob)
        started = await http.post("/sessions", json={"model": {"name": "generator"}},
                                  headers=alice_auth)
        sid = started.json()["session_id"]
        for path, methods in paths:
            for method in methods:
                url = path.replace("{sid}", sid).replace("{cid}", "1").replace(
                    "{step}", "1").replace("{file}", "a.mp4").replace("{segment}", "init.mp4")
                refused = await http.request(method, url, headers=bob_auth, json={})
                assert refused.status_code == 403, (method, url, refused.text)
        refused = await http.get(f"/clips?session_id={sid}&start=0&end=1", headers=bob_auth)
        assert refused.status_code == 403
        assert (await http.get("/health")).status_code == 200
