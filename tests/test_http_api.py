"""The session HTTP API (PROTOCOL.md) over a fake in-memory backend, no WebRTC; then
LocalBackend and `reactor run`'s app with a fake PeerSession in place of aiortc."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from fastapi import FastAPI, Request

from reactor_serve.runtime.manifest import load_manifest
from reactor_serve.runtime.model_spec import inspect_model
from reactor_serve.webrtc import devserver
from reactor_serve.webrtc.backend import (
    AnswerPending,
    BackendError,
    ModelBusy,
    OfferRejected,
    SessionInfo,
    UnknownSession,
)
from reactor_serve.webrtc.devserver import LocalBackend, create_app
from reactor_serve.webrtc.http_api import SessionHTTPMiddleware, session_app, session_routes
from reactor_serve.webrtc.settings import IceServer, WebRTCSettings

MODELS = Path(__file__).parent / "reference_models"
GENERATOR = MODELS / "generator"
SPEC = inspect_model(load_manifest(GENERATOR).load_class(), "generator")
OFFER = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
MAPPING = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]
W = "/sessions/{sid}/transport/webrtc"


# --------------------------------------------------------------------------- fake backend


class FakeBackend:
    """An in-memory SessionBackend whose answers the test hands out by hand."""

    def __init__(self, spec=SPEC, *, max_sessions: int = 1, retry_after_s: float | None = None):
        self._spec = spec
        self.max_sessions = max_sessions
        self.retry_after_s = retry_after_s
        self.sessions: dict[str, SessionInfo] = {}
        self.offers: dict[int, tuple[str, str, list]] = {}
        self.answers: dict[int, str | Exception] = {}
        self.latest: dict[str, int] = {}
        self.pending_status: dict[str, Any] = {"status": "queued", "position": 1, "eta_s": 3}
        self.stopped: list[str] = []
        self.candidates: list[tuple[str, list, bool]] = []
        self.ice = [{"uris": ["stun:stun.example.org:3478"]}]
        self._n = 0
        self._cid = 100

    @property
    def spec(self):
        return self._spec

    async def create_session(self, extra_args):
        live = self.live_sessions()
        if len(live) >= self.max_sessions:
            raise ModelBusy(f"model {self._spec.name} is busy with another session",
                            self.retry_after_s)
        self._n += 1
        info = SessionInfo(f"sess-{self._n}", "created", time.time(), dict(extra_args))
        self.sessions[info.session_id] = info
        return info

    def get_session(self, session_id):
        try:
            return self.sessions[session_id]
        except KeyError:
            raise UnknownSession(f"unknown session {session_id!r}") from None

    def live_sessions(self):
        return [s for s in self.sessions.values() if s.state != "ended"]

    async def submit_offer(self, session_id, sdp_offer, track_mapping):
        info = self.get_session(session_id)
        if info.state == "ended":
            raise UnknownSession(f"session {session_id} has ended")
        if "v=0" not in sdp_offer:
            raise OfferRejected("malformed SDP offer")
        self._cid += 1
        self.offers[self._cid] = (session_id, sdp_offer, track_mapping)
        self.latest[session_id] = self._cid
        info.state = "connecting"
        return self._cid

    def poll_answer(self, session_id, connection_id):
        self.get_session(session_id)
        cid = self.latest.get(session_id) if connection_id is None else connection_id
        if cid is None or cid not in self.offers:
            raise UnknownSession(f"no connection {cid}")
        result = self.answers.get(cid)
        if result is None:
            return AnswerPending(dict(self.pending_status))
        if isinstance(result, Exception):
            raise result
        return result

    async def stop_session(self, session_id):
        info = self.get_session(session_id)
        info.state = "ended"
        self.stopped.append(session_id)

    def ice_servers(self):
        return self.ice

    async def add_ice_candidates(self, session_id, candidates, is_final):
        self.get_session(session_id)
        self.candidates.append((session_id, list(candidates), is_final))

    # test helpers
    def answer(self, cid, sdp="v=0 answer"):
        self.answers[cid] = sdp


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
def fake():
    return FakeBackend()


@pytest.fixture
def app(fake):
    return session_app(lambda request: fake, server_version="9.9.9")


@pytest.fixture
async def http(app):
    async with client(app) as c:
        yield c


async def start(http, prefix="") -> str:
    r = await http.post(f"{prefix}/start_session", json={})
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


# --------------------------------------------------------------------------- start / descriptor


def check_descriptor(d: dict[str, Any]) -> None:
    """The checks the JS client makes before connect() succeeds (PROTOCOL.md)."""
    for key in ("session_id", "state", "cluster"):
        assert isinstance(d[key], str), key
    assert isinstance(d["model"]["name"], str)
    assert isinstance(d["server_info"]["server_version"], str)
    assert d["selected_transport"] == {"protocol": "webrtc", "version": "1.0"}
    caps = d["capabilities"]
    assert isinstance(caps["protocol_version"], str)
    assert caps["emission_fps"] is None or isinstance(caps["emission_fps"], (int, float))
    for track in caps["tracks"]:
        assert isinstance(track["name"], str)
        assert track["kind"] in ("video", "audio")
        assert track["direction"] in ("recvonly", "sendonly")
    for command in caps["commands"]:
        assert isinstance(command["name"], str)
        assert isinstance(command["description"], str)
        if "schema" in command:
            assert isinstance(command["schema"], dict)
    assert isinstance(d["schema"], dict)


@pytest.mark.parametrize("kwargs", [{}, {"content": b""}, {"json": {}}, {"content": b"  \n"}])
async def test_start_session_accepts_empty_bodies(http, fake, kwargs):
    r = await http.post("/start_session", **kwargs)
    assert r.status_code == 200, r.text
    d = r.json()
    check_descriptor(d)
    assert d["model"]["name"] == "generator"
    assert d["server_info"]["server_version"] == "9.9.9"
    assert d["state"] == "created"
    assert d["capabilities"]["tracks"] == [
        {"name": "main_video", "kind": "video", "direction": "recvonly"}
    ]
    assert fake.sessions[d["session_id"]].extra_args == {}


async def test_start_session_passes_extra_args_and_ignores_unknown_fields(http, fake):
    r = await http.post("/start_session", json={"extra_args": {"seed": 3}, "model": "x"})
    assert r.status_code == 200
    assert fake.sessions[r.json()["session_id"]].extra_args == {"seed": 3}


@pytest.mark.parametrize(
    "body, needle",
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"),
     (b'{"extra_args": 5}', "extra_args")],
)
async def test_start_session_bad_bodies_are_400(http, fake, body, needle):
    r = await http.post("/start_session", content=body,
                        headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert isinstance(r.json()["detail"], str) and needle in r.json()["detail"]
    assert fake.sessions == {}


async def test_busy_model_is_409_with_retry_after(fake, http):
    await start(http)
    r = await http.post("/start_session", json={})
    assert r.status_code == 409
    assert "busy" in r.json()["detail"]
    assert "retry-after" not in r.headers
    fake.retry_after_s = 2.2
    r = await http.post("/start_session")
    assert r.status_code == 409 and r.headers["retry-after"] == "3"


async def test_get_session(http, fake):
    r = await http.get("/session")
    assert r.status_code == 404 and isinstance(r.json()["detail"], str)
    sid = await start(http)
    r = await http.get("/session")
    assert r.status_code == 200
    check_descriptor(r.json())
    assert r.json()["session_id"] == sid
    fake.max_sessions = 2
    other = await start(http)
    r = await http.get("/session")
    assert r.status_code == 400 and "2 sessions" in r.json()["detail"]
    r = await http.get("/session", params={"session_id": other})
    assert r.status_code == 200 and r.json()["session_id"] == other
    r = await http.get("/session", params={"session_id": "nope"})
    assert r.status_code == 404


async def test_health(http):
    r = await http.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": "generator", "live_sessions": 0}


async def test_unhealthy_backend_is_503(fake, http):
    fake.healthy = False
    r = await http.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "unhealthy"


# --------------------------------------------------------------------------- transport


async def test_ice_servers(http):
    sid = await start(http)
    r = await http.get(W.format(sid=sid) + "/ice_servers")
    assert r.status_code == 200
    assert r.json() == {"ice_servers": [{"uris": ["stun:stun.example.org:3478"]}]}
    r = await http.get(W.format(sid="nope") + "/ice_servers")
    assert r.status_code == 404


async def test_offer_is_exactly_202_then_poll_pending_then_ready(http, fake):
    sid = await start(http)
    url = W.format(sid=sid) + "/sdp_params"
    r = await http.post(url, json={"sdp_offer": OFFER, "client_info": {"sdk": "js"},
                                   "track_mapping": MAPPING})
    assert r.status_code == 202
    cid = r.json()["connection_id"]
    assert r.json() == {"connection_id": cid} and isinstance(cid, int)
    assert fake.offers[cid] == (sid, OFFER, MAPPING)

    r = await http.get(url)
    assert r.status_code == 202
    assert r.json() == {"status": "queued", "position": 1, "eta_s": 3}
    fake.pending_status = {}
    r = await http.get(url)
    assert r.status_code == 202 and r.json() == {"status": "pending"}

    fake.answer(cid, "v=0 answer-1")
    r = await http.get(url)
    assert r.status_code == 200
    assert r.json() == {"sdp_answer": "v=0 answer-1", "connection_id": cid}


async def test_put_reconnect_never_returns_the_old_answer(http, fake):
    sid = await start(http)
    url = W.format(sid=sid) + "/sdp_params"
    first = (await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})).json()
    fake.answer(first["connection_id"], "v=0 old")
    assert (await http.get(url)).json()["sdp_answer"] == "v=0 old"

    r = await http.put(url, json={"sdp_offer": OFFER + "a=x\r\n", "track_mapping": MAPPING})
    assert r.status_code == 202
    second = r.json()["connection_id"]
    assert second != first["connection_id"]
    r = await http.get(url)
    assert r.status_code == 202, "a poll after a re-offer must not see the old answer"
    fake.answer(second, "v=0 new")
    r = await http.get(url)
    assert r.status_code == 200 and r.json() == {"sdp_answer": "v=0 new", "connection_id": second}


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"json": {"track_mapping": MAPPING}}, "sdp_offer"),
        ({"json": {"sdp_offer": ""}}, "sdp_offer"),
        ({"json": {"sdp_offer": 5}}, "sdp_offer"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": [{"mid": "0"}]}}, "track_mapping.0.name"),
        ({"content": b""}, "sdp_offer"),
        ({"content": b"{oops"}, "not valid JSON"),
    ],
)
async def test_bad_offer_bodies_are_400_naming_the_field(http, fake, kwargs, needle):
    sid = await start(http)
    r = await http.post(W.format(sid=sid) + "/sdp_params", **kwargs)
    assert r.status_code == 400, r.text
    assert needle in r.json()["detail"]
    assert fake.offers == {}


async def test_rejected_offer_is_400_and_failed_negotiation_shows_on_poll(http, fake):
    sid = await start(http)
    url = W.format(sid=sid) + "/sdp_params"
    r = await http.post(url, json={"sdp_offer": "garbage", "track_mapping": []})
    assert r.status_code == 400 and r.json() == {"detail": "malformed SDP offer"}
    cid = (await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})).json()[
        "connection_id"]
    fake.answers[cid] = OfferRejected("track_mapping[0]: no output track 'x'")
    r = await http.get(url)
    assert r.status_code == 400 and "no output track" in r.json()["detail"]


async def test_unknown_session_is_404_on_every_session_route(http):
    base = W.format(sid="nope")
    for method, path, body in [
        ("GET", "/ice_servers", None),
        ("POST", "/sdp_params", {"sdp_offer": OFFER, "track_mapping": MAPPING}),
        ("PUT", "/sdp_params", {"sdp_offer": OFFER, "track_mapping": MAPPING}),
        ("GET", "/sdp_params", None),
        ("POST", "/ice_candidates", {"candidates": [], "is_final": True}),
        ("POST", "/connections", None),
        ("GET", "/connections/1/sdp_params", None),
    ]:
        r = await http.request(method, base + path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert isinstance(r.json()["detail"], str)


async def test_ice_candidates_are_passed_to_the_backend(http, fake):
    sid = await start(http)
    candidate = {"candidate": "candidate:1 1 udp 1 1.2.3.4 5 typ host",
                 "sdp_mid": "0", "sdp_mline_index": 0}
    r = await http.post(W.format(sid=sid) + "/ice_candidates",
                        json={"candidates": [candidate], "is_final": False})
    assert r.status_code == 202
    assert fake.candidates == [(sid, [candidate], False)]


async def test_connections_flow(http, fake):
    sid = await start(http)
    base = W.format(sid=sid)
    r = await http.post(base + "/connections")
    assert r.status_code == 201
    body = r.json()
    cid = body["connection_id"]
    assert isinstance(cid, int)
    assert body["track_map"] == {"main_video": {"kind": "video", "direction": "out", "rate": 30.0}}
    url = f"{base}/connections/{cid}/sdp_params"

    r = await http.get(url)
    assert r.status_code == 202  # registered, no offer yet
    r = await http.post(f"{base}/connections/{cid}/ice_candidates",
                        json={"candidates": [], "is_final": False})
    assert r.status_code == 202

    r = await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202 and r.json() == {"connection_id": cid}
    backend_cid = fake.latest[sid]
    r = await http.get(url)
    assert r.status_code == 202
    fake.answer(backend_cid, "v=0 a")
    r = await http.get(url)
    assert r.status_code == 200 and r.json() == {"sdp_answer": "v=0 a", "connection_id": cid}

    r = await http.put(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202 and r.json() == {"connection_id": cid}
    assert (await http.get(url)).status_code == 202
    fake.answer(fake.latest[sid], "v=0 b")
    assert (await http.get(url)).json() == {"sdp_answer": "v=0 b", "connection_id": cid}

    for bad in ("999", "x"):
        r = await http.post(f"{base}/connections/{bad}/sdp_params",
                            json={"sdp_offer": OFFER, "track_mapping": MAPPING})
        assert r.status_code == 404 and "connection" in r.json()["detail"]


# --------------------------------------------------------------------------- stop


async def test_stop_session_with_and_without_body(http, fake):
    sid = await start(http)
    r = await http.post("/stop_session", json={"session_id": sid})
    assert r.status_code == 200 and fake.stopped == [sid]
    assert r.json() == {"session_id": sid, "state": "ended"}

    sid2 = await start(http)
    r = await http.post("/stop_session")  # what JS 2.9.0 sends
    assert r.status_code == 200 and fake.stopped == [sid, sid2]

    r = await http.post("/stop_session", json={"session_id": "nope"})
    assert r.status_code == 404
    r = await http.post("/stop_session")
    assert r.status_code == 400 and "no live session" in r.json()["detail"]


async def test_stop_session_refuses_to_guess_with_two_live(http, fake):
    fake.max_sessions = 2
    _first, b = await start(http), await start(http)
    r = await http.post("/stop_session", content=b"")
    assert r.status_code == 400
    assert "2 sessions are live" in r.json()["detail"] and "session_id" in r.json()["detail"]
    assert fake.stopped == []
    r = await http.post("/stop_session", json={"session_id": b})
    assert r.status_code == 200 and fake.stopped == [b]


async def test_stop_session_bad_json(http):
    r = await http.post("/stop_session", content=b"{")
    assert r.status_code == 400


# --------------------------------------------------------------------------- CORS, headers, paths


async def test_cors_on_success_error_and_preflight(http):
    origin = {"Origin": "http://elsewhere.example"}
    r = await http.get("/health", headers=origin)
    assert r.headers["access-control-allow-origin"] == "*"
    r = await http.get("/session", headers=origin)
    assert r.status_code == 404 and r.headers["access-control-allow-origin"] == "*"
    r = await http.post("/start_session", content=b"{", headers=origin)
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"

    r = await http.options("/sessions/x/transport/webrtc/sdp_params", headers={
        **origin,
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "authorization, content-type, reactor-api-version",
    })
    assert r.status_code in (200, 204)
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-allow-headers"] == (
        "authorization, content-type, reactor-api-version")
    methods = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    assert {"GET", "POST", "PUT", "OPTIONS"} <= methods and "*" not in methods


async def test_cors_on_preflight_and_401_with_token():
    app = session_app(lambda request: FakeBackend(), server_version="1", auth_token="s3cret")
    async with client(app) as http:
        r = await http.options("/start_session", headers={
            "Origin": "http://x", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert r.status_code in (200, 204) and r.headers["access-control-allow-origin"] == "*"
        r = await http.post("/start_session", headers={"Origin": "http://x"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "*"


async def test_cors_on_unexpected_500():
    class Broken(FakeBackend):
        def live_sessions(self):
            raise RuntimeError("boom")

    app = session_app(lambda request: Broken(), server_version="1")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
    ) as http:
        r = await http.get("/health")
    assert r.status_code == 500
    assert r.headers["access-control-allow-origin"] == "*"
    assert isinstance(r.json()["detail"], str)


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


async def test_doubled_slashes(http):
    # Absolute URLs: httpx reads a relative "//start_session" as a host name.
    r = await http.post("http://test//start_session", json={})
    assert r.status_code == 200
    sid = r.json()["session_id"]
    r = await http.post(f"http://test//sessions/{sid}//transport/webrtc/sdp_params",
                        json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202
    r = await http.post("http://test//stop_session")
    assert r.status_code == 200


async def test_token_via_header_or_path_prefix():
    fake = FakeBackend()
    app = session_app(lambda request: fake, server_version="1", auth_token="s3cret")
    async with client(app) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/t/s3cret/health")).status_code == 200

        for headers in ({}, {"Authorization": "Bearer local"}, {"Authorization": "Bearer nope"},
                        {"Authorization": "s3cret"}):
            r = await http.post("/start_session", json={}, headers=headers)
            assert r.status_code == 401, headers
            assert isinstance(r.json()["detail"], str)
        assert (await http.post("/t/wrong/start_session", json={})).status_code == 401
        assert fake.sessions == {}

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
        r = await http.post("/t/s3cret/stop_session")
        assert r.status_code == 200


async def test_mounted_under_a_prefix_and_at_the_root():
    backends = {"generator": FakeBackend(), "other": FakeBackend()}

    def backend_for(request: Request):
        name = request.path_params.get("name", "generator")
        if name not in backends:
            raise UnknownSession(f"unknown model {name!r}")
        return backends[name]

    app = FastAPI()
    app.add_middleware(SessionHTTPMiddleware)
    app.include_router(session_routes(backend_for, server_version="1"), prefix="/models/{name}")
    app.include_router(session_routes(backend_for, server_version="1"))
    async with client(app) as http:
        sid = await start(http, "/models/other/")  # the doubled slash the JS client makes
        assert list(backends["other"].sessions) == [sid]
        r = await http.post(f"/models/other/sessions/{sid}/transport/webrtc/sdp_params",
                            json={"sdp_offer": OFFER, "track_mapping": MAPPING})
        assert r.status_code == 202
        r = await http.post("/models/nope/start_session")
        assert r.status_code == 404 and "nope" in r.json()["detail"]
        root_sid = await start(http)
        assert list(backends["generator"].sessions) == [root_sid]
        r = await http.post("/models/other/stop_session")
        assert r.status_code == 200 and backends["other"].stopped == [sid]
        assert backends["generator"].stopped == []


async def test_token_prefix_before_a_mount_prefix():
    fake = FakeBackend()
    app = FastAPI()
    app.add_middleware(SessionHTTPMiddleware)
    app.include_router(session_routes(lambda r: fake, server_version="1", auth_token="tok"),
                       prefix="/models/{name}")
    async with client(app) as http:
        assert (await http.post("/models/generator/start_session")).status_code == 401
        sid = await start(http, "/t/tok/models/generator/")
        assert sid in fake.sessions


# --------------------------------------------------------------------------- LocalBackend


class FakePeer:
    """Stands in for PeerSession: answers after `delay`, or fails as told."""

    instances: list[FakePeer] = []

    def __init__(self, host, settings, session_id=None, on_end=None):
        self.host, self.settings, self.id, self.on_end = host, settings, session_id, on_end
        self.ended = asyncio.Event()
        self.end_reason = None
        self.offers: list[str] = []
        self.delay = 0.0
        self.fail: Exception | None = None
        FakePeer.instances.append(self)

    async def answer(self, sdp_offer, track_mapping):
        self.offers.append(sdp_offer)
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return f"answer {len(self.offers)}"

    async def close(self, reason="client_closed"):
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()
            if self.on_end:
                self.on_end(self)


class FakeHost:
    def __init__(self, healthy=True):
        self.spec = SPEC
        self.healthy = healthy
        self.load_error = None


@pytest.fixture
def local():
    FakePeer.instances = []
    settings = WebRTCSettings(ice_servers=[
        IceServer(urls=["turn:turn.example.org:3478"], username="u", credential="p"),
        IceServer(urls="stun:stun.example.org"),
    ])
    return LocalBackend(FakeHost(), settings, offer_timeout_s=0.2, peer_factory=FakePeer)


async def settle(backend, sid, cid=None):
    for _ in range(100):
        result = backend.poll_answer(sid, cid)
        if not isinstance(result, AnswerPending):
            return result
        await asyncio.sleep(0.01)
    raise AssertionError("no answer")


async def test_local_backend_one_session_at_a_time(local):
    info = await local.create_session({"a": 1})
    assert info.state == "created" and len(info.session_id) >= 16
    with pytest.raises(ModelBusy, match="model generator is busy with another session"):
        await local.create_session({})
    assert local.live_sessions() == [info]
    await local.stop_session(info.session_id)
    assert local.get_session(info.session_id).state == "ended"
    assert local.live_sessions() == []
    await local.create_session({})


async def test_local_backend_unloaded_model_is_503():
    backend = LocalBackend(FakeHost(healthy=False), WebRTCSettings(), peer_factory=FakePeer)
    with pytest.raises(BackendError) as err:
        await backend.create_session({})
    assert err.value.status == 503


async def test_local_backend_expires_sessions_without_an_offer(local):
    info = await local.create_session({})
    await asyncio.sleep(0.35)
    assert local.live_sessions() == []
    assert local.get_session(info.session_id).state == "ended"
    with pytest.raises(UnknownSession, match="ended"):
        await local.submit_offer(info.session_id, OFFER, MAPPING)
    await local.create_session({})


async def test_local_backend_offer_answer_and_reconnect(local):
    info = await local.create_session({})
    sid = info.session_id
    assert isinstance(local.poll_answer(sid, None), AnswerPending)
    cid = await local.submit_offer(sid, OFFER, MAPPING)
    assert local.get_session(sid).state == "connecting"
    assert await settle(local, sid) == "answer 1"
    assert local.get_session(sid).state == "live"
    await asyncio.sleep(0.3)  # past the offer timeout: an answered session stays
    assert local.live_sessions() == [info]

    peer = FakePeer.instances[0]
    peer.delay = 0.05
    cid2 = await local.submit_offer(sid, OFFER, MAPPING)
    assert cid2 != cid
    assert isinstance(local.poll_answer(sid, None), AnswerPending)  # never the old answer
    assert local.poll_answer(sid, cid) == "answer 1"
    assert await settle(local, sid) == "answer 2"
    assert len(FakePeer.instances) == 1, "a reconnect keeps the same PeerSession"
    with pytest.raises(UnknownSession):
        local.poll_answer(sid, 12345)


async def test_local_backend_rejected_offer_then_expiry(local):
    FakePeer.instances = []
    info = await local.create_session({})
    sid = info.session_id
    await local.submit_offer(sid, OFFER, MAPPING)
    FakePeer.instances[0].fail = OfferRejected("bad mapping")
    await local.submit_offer(sid, OFFER, MAPPING)
    with pytest.raises(OfferRejected, match="bad mapping"):
        await settle(local, sid)
    with pytest.raises(OfferRejected):  # repeatable
        local.poll_answer(sid, None)
    with pytest.raises(OfferRejected):
        await local.submit_offer(sid, "  ", MAPPING)


async def test_local_backend_rejected_first_offer_expires(local):
    info = await local.create_session({})
    sid = info.session_id
    FakePeer.instances = []

    class Failing(FakePeer):
        async def answer(self, sdp_offer, track_mapping):
            raise OfferRejected("nope")

    local._peer_factory = Failing
    await local.submit_offer(sid, OFFER, MAPPING)
    with pytest.raises(OfferRejected):
        await settle(local, sid)
    assert local.live_sessions() == [info]
    await asyncio.sleep(0.35)
    assert local.live_sessions() == []
    assert FakePeer.instances[0].ended.is_set()


async def test_local_backend_unexpected_failure_ends_the_session(local):
    class Broken(FakePeer):
        async def answer(self, sdp_offer, track_mapping):
            raise RuntimeError("kaput")

    local._peer_factory = Broken
    info = await local.create_session({})
    await local.submit_offer(info.session_id, OFFER, MAPPING)
    with pytest.raises(BackendError, match="kaput") as err:
        await settle(local, info.session_id)
    assert err.value.status == 500
    for _ in range(50):
        if not local.live_sessions():
            break
        await asyncio.sleep(0.01)
    assert local.live_sessions() == []


async def test_local_backend_peer_ending_frees_the_slot(local):
    info = await local.create_session({})
    await local.submit_offer(info.session_id, OFFER, MAPPING)
    await settle(local, info.session_id)
    peer = FakePeer.instances[0]
    await peer.close("timeout")  # the watchdog, say
    assert local.live_sessions() == []
    assert local.get_session(info.session_id).state == "ended"
    await local.stop_session(info.session_id)  # late stop: harmless
    await local.create_session({})


async def test_local_backend_stop_closes_the_peer(local):
    info = await local.create_session({})
    await local.submit_offer(info.session_id, OFFER, MAPPING)
    peer = FakePeer.instances[0]
    await local.stop_session(info.session_id)
    assert peer.ended.is_set() and peer.end_reason == "client_closed"
    with pytest.raises(UnknownSession):
        await local.stop_session("nope")


async def test_local_backend_ice_servers(local):
    assert local.ice_servers() == [
        {"uris": ["turn:turn.example.org:3478"], "credentials": {"username": "u", "password": "p"}},
        {"uris": ["stun:stun.example.org"]},
    ]


# --------------------------------------------------------------------------- create_app / reactor run


async def test_create_app_serves_a_model_dir(monkeypatch):
    monkeypatch.setattr(devserver, "_default_peer_factory", lambda: FakePeer)
    app = create_app(GENERATOR, settings_override={"loopback_candidates": True})
    assert app.state.backend.settings.loopback_candidates is True
    async with app.router.lifespan_context(app):
        async with client(app) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
            assert (await http.get("/")).json()["model"] == "generator"
            r = await http.post("http://test//start_session", json={})
            check_descriptor(r.json())
            sid = r.json()["session_id"]
            assert (await http.post("/start_session")).status_code == 409
            url = W.format(sid=sid) + "/sdp_params"
            r = await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})
            assert r.status_code == 202
            for _ in range(100):
                r = await http.get(url)
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.01)
            assert r.json() == {"sdp_answer": "answer 1", "connection_id": r.json()["connection_id"]}
            assert (await http.post("/stop_session")).status_code == 200
            assert (await http.post("/start_session")).status_code == 200
        assert app.state.host.healthy
    assert not app.state.host.healthy  # shut down with the app


async def test_create_app_token_guards_the_index():
    app = create_app(GENERATOR, auth_token="tok")
    async with app.router.lifespan_context(app):
        async with client(app) as http:
            assert (await http.get("/")).status_code == 401
            assert (await http.get("/t/tok/")).status_code == 200
            assert (await http.get("/health")).status_code == 200


async def test_create_app_reports_a_failing_load(tmp_path):
    (tmp_path / "reactor.yaml").write_text("model: broken:Broken\nname: broken\n")
    (tmp_path / "broken.py").write_text(
        "from reactor_runtime.interface import ReactorPipeline\n"
        "class Broken(ReactorPipeline):\n"
        "    def load(self, config):\n"
        "        raise ValueError('no weights here')\n"
        "    def inference(self):\n"
        "        yield None\n"
    )
    app = create_app(tmp_path)
    with pytest.raises(Exception, match="no weights here"):
        async with app.router.lifespan_context(app):
            pass
    assert "no weights here" in str(app.state.load_error)



def test_reactor_run_starts_quickly_and_serves():
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reactor_serve.cli", "run", str(GENERATOR), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        up = None
        while time.monotonic() - started < 15:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
                up = time.monotonic() - started
                assert r.json()["model"] == "generator"
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.05)
        assert up is not None, "reactor run did not come up"
        assert up < 5.0, f"reactor run took {up:.1f} s to serve"
        r = httpx.post(f"http://127.0.0.1:{port}//start_session", json={})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert f"http://127.0.0.1:{port}/" in out


def test_reactor_run_bad_model_dir_is_an_error(tmp_path, capsys):
    from reactor_serve.cli import main

    assert main(["run", str(tmp_path / "missing")]) == 2
    assert "error" in capsys.readouterr().err
