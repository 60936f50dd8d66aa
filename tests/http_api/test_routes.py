"""The session HTTP API (docs/protocol.md): its HTTP shape over a small in-test backend
implementing `SessionBackend` (no WebRTC), then `reactor run`'s app with the real
SeatedSessionBackend.

Each middleware's own rules are tested in middleware/; here is what needs the whole
stack: the routes mounted under a prefix or a root path, behind every middleware."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgi_calls import client
from fake_backend import (
    CANDIDATE,
    CLIENT,
    GENERATOR,
    MAPPING,
    OFFER,
    FakeBackend,
    W,
    detail,
    fake,  # noqa: F401 (fixtures)
    http,  # noqa: F401 (fixtures)
    start,
)
from fastapi import FastAPI, Request

from reactor_serve.http_api.routes import (
    add_session_middleware,
    session_app,
    session_routes,
)
from reactor_serve.protocol.errors import (
    ModelBusy,
    ModelUnavailable,
    OfferRejected,
    UnknownSession,
)
from reactor_serve.sessions.contract import ClientIdentity

# --------------------------------------------------------------------------- start / descriptor


def check_descriptor(d: dict[str, Any]) -> None:
    """The checks the JS client makes before connect() succeeds (docs/protocol.md)."""
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


@pytest.mark.parametrize("kwargs", [{}, {"content": b""}, {"json": {}}, {"content": b"  \n"},
                                    {"json": {"extra_args": None}}])
async def test_start_session_accepts_empty_bodies(http, fake, kwargs):
    r = await http.post("/start_session", **kwargs)
    assert r.status_code == 200, r.text
    d = r.json()
    check_descriptor(d)
    assert d["model"]["name"] == "generator"
    assert d["server_info"]["server_version"] == "9.9.9"
    assert d["state"] == "created"
    assert "end_reason" not in d
    assert d["capabilities"]["tracks"] == [
        {"name": "main_video", "kind": "video", "direction": "recvonly"}
    ]
    assert fake.sessions[d["session_id"]].extra_args == {}


async def test_start_session_passes_extra_args_and_the_client(http, fake):
    r = await http.post("/start_session", json={"extra_args": {"seed": 3}, "model": "x"},
                        headers={"Origin": "http://page.example", "User-Agent": "ua/1"})
    assert r.status_code == 200
    sid = r.json()["session_id"]
    assert fake.sessions[sid].extra_args == {"seed": 3}
    assert fake.clients[sid] == ClientIdentity.of("127.0.0.1", "http://page.example", "ua/1")


DEEP = b'{"extra_args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b"null", "got null"),
        (b'"text"', "got a string"),
        (b"\xff\xfe{", "not valid UTF-8"),
        (b'{"extra_args": 5}', "extra_args: must be an object"),
        (b'{"extra_args": [1]}', "extra_args: must be an object"),
        (b'{"extra_args": {"a": NaN}}', "NaN"),
        (b'{"extra_args": {"a": -Infinity}}', "-Infinity"),
        (b'{"extra_args": {"a": 1e999}}', "out of range"),
        (b'{"extra_args": {"a": ' + b"9" * 5000 + b"}}", "longer than 40 digits"),
        (b'{"extra_args": {"a": "\\ud800"}}', "extra_args.a: contains a lone UTF-16 surrogate"),
        (DEEP, "nests deeper than 32"),
        (b'{"extra_args": ' + b'{"a": ' * 20 + b"1" + b"}" * 20 + b"}", "extra_args: nests deeper than 16"),
        (json.dumps({"extra_args": {"a": "x" * 17_000}}).encode(), "the limit is 16384"),
    ],
)
async def test_start_session_bad_bodies_are_400_naming_the_problem(http, fake, body, needle):
    r = await http.post("/start_session", content=body,
                        headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert needle in detail(r)
    assert fake.calls == []


@pytest.mark.parametrize("error, status", [
    (ModelBusy("model generator is busy", retry_after_s=2.2), 409),
    (ModelUnavailable("model generator is loading", retry_after_s=10), 503),
    (UnknownSession("gone", retry_after_s=0.1), 404),
])
async def test_backend_errors_keep_their_status_and_retry_after(http, fake, error, status):
    fake.raise_next = error
    r = await http.post("/start_session", json={})
    assert r.status_code == status
    assert detail(r) == str(error)
    assert r.headers["retry-after"] == str(max(1, int(-(-error.retry_after_s // 1))))


async def test_no_retry_after_when_the_backend_names_none(http, fake):
    await start(http)
    r = await http.post("/start_session", json={})
    assert r.status_code == 409 and "busy" in detail(r)
    assert "retry-after" not in r.headers


async def test_a_backend_bug_is_a_logged_500_with_cors(http, fake, caplog):
    fake.raise_next = RuntimeError("boom")
    r = await http.post("/start_session", json={}, headers={"Origin": "http://x"})
    assert r.status_code == 500
    assert detail(r) == "internal server error"  # the bug's text stays in the log
    assert r.headers["access-control-allow-origin"] == "*"
    assert "boom" in caplog.text


# --------------------------------------------------------------------------- get / stop: private


async def test_get_session_wants_an_id_and_never_discloses_one(http, fake):
    sid = await start(http)
    r = await http.get("/session")
    assert r.status_code == 400 and "session_id" in detail(r)
    assert sid not in r.text
    assert fake.called("get_session") == []

    r = await http.get("/session", params={"session_id": sid})
    assert r.status_code == 200
    check_descriptor(r.json())
    assert r.json()["session_id"] == sid and r.json()["state"] == "created"
    r = await http.get("/session", params={"session_id": "nope"})
    assert r.status_code == 404


@pytest.mark.parametrize("sid", ["x" * 10_000, "a b", "../../etc", "ü", "a\x00b", ""])
async def test_odd_session_ids_are_404_without_asking_the_backend(http, fake, sid):
    r = await http.get("/session", params={"session_id": sid})
    assert r.status_code == 404 and detail(r) == "unknown session"
    r = await http.post("/stop_session", json={"session_id": sid})
    assert r.status_code == 404
    assert fake.calls == []


async def test_an_ended_session_says_why(http, fake):
    sid = await start(http)
    info = fake.sessions[sid]
    info.state, info.end_reason, info.end_message = "ended", "error", "run() raised ValueError"
    r = await http.get("/session", params={"session_id": sid})
    assert r.status_code == 200
    check_descriptor(r.json())
    assert r.json()["state"] == "ended"
    assert r.json()["end_reason"] == "error"
    assert r.json()["end_message"] == "run() raised ValueError"


async def test_stop_session_by_id(http, fake):
    sid = await start(http)
    r = await http.post("/stop_session", json={"session_id": sid})
    assert r.status_code == 200 and r.json() == {"session_id": sid, "state": "ended"}
    assert fake.called("stop_session") == [(sid,)]
    r = await http.post("/stop_session", json={"session_id": "nope"})
    assert r.status_code == 404


@pytest.mark.parametrize("kwargs", [{}, {"content": b""}, {"json": {}},
                                    {"json": {"session_id": None}}])
async def test_stop_session_naming_none_asks_the_backend_by_client(http, fake, kwargs):
    sid = await start(http)
    r = await http.post("/stop_session", **kwargs)  # what JS 2.9.0 sends
    assert r.status_code == 200
    assert r.json() == {"state": "stopping", "matched": 1}
    assert sid not in r.text
    assert fake.called("stop_unnamed") == [(CLIENT,)]
    assert fake.called("stop_session") == []


async def test_stop_session_naming_none_matches_only_that_client(http, fake):
    fake.max_sessions = 2
    await start(http)
    r = await http.post("/stop_session", headers={"User-Agent": "someone else"})
    assert r.status_code == 200 and r.json() == {"state": "stopping", "matched": 0}


@pytest.mark.parametrize("body, needle", [
    (b"{", "not valid JSON"),
    (b'{"session_id": 5}', "session_id: must be a string"),
    (b'{"session_id": ["a"]}', "session_id: must be a string"),
    (b"[]", "JSON object"),
])
async def test_stop_session_bad_bodies(http, fake, body, needle):
    r = await http.post("/stop_session", content=body)
    assert r.status_code == 400 and needle in detail(r)
    assert fake.calls == []


async def test_health(http, fake):
    r = await http.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": "generator", "live_sessions": 0}
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
    assert fake.called("submit_offer")[-1][-1] is None  # a flat offer names no connection

    r = await http.get(url)
    assert r.status_code == 202
    assert r.json() == {"status": "queued", "position": 1, "eta_s": 3}
    fake.pending_status = {}
    r = await http.get(url)
    assert r.status_code == 202 and r.json() == {"status": "pending"}

    fake.answers[cid] = "v=0 answer-1"
    r = await http.get(url)
    assert r.status_code == 200
    assert r.json() == {"sdp_answer": "v=0 answer-1", "connection_id": cid}


async def test_put_reconnect_never_returns_the_old_answer(http, fake):
    sid = await start(http)
    url = W.format(sid=sid) + "/sdp_params"
    first = (await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})).json()
    fake.answers[first["connection_id"]] = "v=0 old"
    assert (await http.get(url)).json()["sdp_answer"] == "v=0 old"

    r = await http.put(url, json={"sdp_offer": OFFER + "a=x\r\n", "track_mapping": MAPPING})
    assert r.status_code == 202
    second = r.json()["connection_id"]
    assert second != first["connection_id"]
    r = await http.get(url)
    assert r.status_code == 202, "a poll after a re-offer must not see the old answer"
    fake.answers[second] = "v=0 new"
    r = await http.get(url)
    assert r.status_code == 200 and r.json() == {"sdp_answer": "v=0 new", "connection_id": second}


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"json": {"track_mapping": MAPPING}}, "sdp_offer: required"),
        ({"json": {"sdp_offer": ""}}, "sdp_offer: not an SDP offer"),
        ({"json": {"sdp_offer": "hello"}}, "must start with 'v=0'"),
        ({"json": {"sdp_offer": 5}}, "sdp_offer: must be a string, got 5"),
        ({"json": {"sdp_offer": "v=0" + "x" * 70_000}}, "the limit is 65536"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": {"mid": "0"}}}, "track_mapping: must be an array"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": [{"mid": "0"}]}}, "track_mapping[0].name: required"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": [5]}}, "track_mapping[0]: must be an object"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": [{**MAPPING[0], "kind": "k" * 300}]}},
         "track_mapping[0].kind: longer than 256"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": MAPPING * 33}}, "the limit is 32"),
        ({"json": {"sdp_offer": OFFER, "track_mapping": [{**MAPPING[0], "name": 7}]}},
         "track_mapping[0].name: must be a string"),
        ({"content": b""}, "request body required"),
        ({"content": b"{oops"}, "not valid JSON"),
        ({"content": b'{"sdp_offer": "v=0\\udfff"}'}, "sdp_offer: contains a lone"),
    ],
)
async def test_bad_offer_bodies_are_400_naming_the_field(http, fake, kwargs, needle):
    sid = await start(http)
    for method in ("POST", "PUT"):
        r = await http.request(method, W.format(sid=sid) + "/sdp_params", **kwargs)
        assert r.status_code == 400, r.text
        assert needle in detail(r)
    assert fake.called("submit_offer") == []


async def test_track_mapping_mid_may_be_a_number(http, fake):
    sid = await start(http)
    r = await http.post(W.format(sid=sid) + "/sdp_params",
                        json={"sdp_offer": OFFER, "track_mapping": [{**MAPPING[0], "mid": 0}]})
    assert r.status_code == 202
    assert fake.called("submit_offer")[0][2] == MAPPING


async def test_rejected_offer_is_400_and_failed_negotiation_shows_on_poll(http, fake):
    sid = await start(http)
    url = W.format(sid=sid) + "/sdp_params"
    r = await http.post(url, json={"sdp_offer": "v=0\r\n", "track_mapping": []})
    assert r.status_code == 400 and r.json() == {"detail": "malformed SDP offer: no m-line"}
    cid = (await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})).json()[
        "connection_id"]
    fake.answers[cid] = OfferRejected("track_mapping[0]: no output track 'x'")
    r = await http.get(url)
    assert r.status_code == 400 and "no output track" in detail(r)


async def test_unknown_session_is_404_on_every_session_route(http):
    for sid in ("nope", "x" * 10_000, "%00", "%C3%BC", "a.b~c-d_e"):
        base = W.format(sid=sid)
        for method, path, body in [
            ("GET", "/ice_servers", None),
            ("POST", "/sdp_params", {"sdp_offer": OFFER, "track_mapping": MAPPING}),
            ("PUT", "/sdp_params", {"sdp_offer": OFFER, "track_mapping": MAPPING}),
            ("GET", "/sdp_params", None),
            ("POST", "/ice_candidates", {"candidates": [], "is_final": True}),
            ("POST", "/connections", None),
            ("GET", "/connections/1/sdp_params", None),
            ("POST", "/connections/1/sdp_params", {"sdp_offer": OFFER, "track_mapping": MAPPING}),
            ("POST", "/connections/1/ice_candidates", {"candidates": []}),
        ]:
            r = await http.request(method, base + path, json=body)
            assert r.status_code == 404, (sid[:20], method, path, r.text)
            detail(r)


async def test_ice_candidates_are_checked_normalised_and_passed_on(http, fake):
    sid = await start(http)
    r = await http.post(W.format(sid=sid) + "/ice_candidates", json={
        "candidates": [
            {"candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0},
            {"candidate": CANDIDATE, "sdp_mid": "1", "sdp_mline_index": 1,
             "usernameFragment": "abcd"},
            CANDIDATE,
            {"candidate": ""},
        ],
        "is_final": False,
    })
    assert r.status_code == 202 and r.json() == {}
    assert fake.candidates == [(sid, None, [
        {"candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0},
        {"candidate": CANDIDATE, "sdpMid": "1", "sdpMLineIndex": 1, "usernameFragment": "abcd"},
        {"candidate": CANDIDATE, "sdpMid": None, "sdpMLineIndex": None},
        {"candidate": "", "sdpMid": None, "sdpMLineIndex": None},
    ], False)]


@pytest.mark.parametrize("body, needle", [
    ({"candidates": [{"candidate": CANDIDATE, "sdpMLineIndex": "abc"}]},
     "candidates[0].sdpMLineIndex: must be an integer from 0 to 1023, got string 'abc'"),
    ({"candidates": [{"candidate": CANDIDATE, "sdpMLineIndex": -1}]}, "candidates[0].sdpMLineIndex"),
    ({"candidates": [{"candidate": CANDIDATE, "sdp_mline_index": 10**30}]},
     "candidates[0].sdp_mline_index"),
    ({"candidates": [{"candidate": CANDIDATE, "sdpMLineIndex": True}]}, "candidates[0].sdpMLineIndex"),
    ({"candidates": [{"candidate": CANDIDATE, "sdpMLineIndex": 0.5}]}, "candidates[0].sdpMLineIndex"),
    ({"candidates": [CANDIDATE, {"candidate": CANDIDATE, "sdpMid": 3}]}, "candidates[1].sdpMid"),
    ({"candidates": [{"candidate": CANDIDATE, "sdpMid": "m" * 300}]}, "candidates[0].sdpMid: longer"),
    ({"candidates": [{"candidate": 5}]}, "candidates[0].candidate: must be a string"),
    ({"candidates": [CANDIDATE, "garbage"]}, "candidates[1].candidate: not an ICE candidate"),
    ({"candidates": [CANDIDATE.replace("typ", "type")]}, "candidates[0].candidate: not an ICE"),
    ({"candidates": [CANDIDATE.replace("54321", "port")]}, "port must be a number"),
    ({"candidates": [CANDIDATE.replace("generation 0", "generation x")]}, "generation must be"),
    ({"candidates": [CANDIDATE + " é"]}, "printable ASCII"),
    ({"candidates": [CANDIDATE + " x" * 600]}, "candidates[0].candidate: longer than 1024"),
    ({"candidates": [CANDIDATE] * 65}, "65 in one request, the limit is 64"),
    ({"candidates": [None]}, "candidates[0]: must be an object or a string, got null"),
    ({"candidates": {"candidate": CANDIDATE}}, "candidates: must be an array"),
    ({"candidates": [], "is_final": "yes"}, "is_final: must be a boolean"),
])
async def test_malformed_candidates_are_400_naming_the_field(http, fake, body, needle):
    sid = await start(http)
    for path in ("/ice_candidates", "/connections/1/ice_candidates"):
        r = await http.post(W.format(sid=sid) + path, json=body)
        assert r.status_code == 400, r.text
        assert needle in detail(r)
    assert fake.called("add_ice_candidates") == []


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
    assert r.status_code == 202 and r.json() == {"status": "awaiting_offer"}
    r = await http.post(f"{base}/connections/{cid}/ice_candidates",
                        json={"candidates": [CANDIDATE], "is_final": True})
    assert r.status_code == 202
    assert fake.candidates[-1][1] == cid and fake.candidates[-1][3] is True

    r = await http.post(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202 and r.json() == {"connection_id": cid}
    assert fake.called("submit_offer")[-1] == (sid, OFFER, MAPPING, cid)
    assert (await http.get(url)).status_code == 202
    fake.answers[cid] = "v=0 a"
    r = await http.get(url)
    assert r.status_code == 200 and r.json() == {"sdp_answer": "v=0 a", "connection_id": cid}

    r = await http.put(url, json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202 and r.json() == {"connection_id": cid}
    assert (await http.get(url)).status_code == 202

    # Unregistered: the backend says so; not a connection id at all: 404 before it.
    r = await http.post(f"{base}/connections/999/sdp_params",
                        json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 404 and "connection" in detail(r)
    calls = len(fake.calls)
    for bad in ("x", "-1", "1" * 12, "1.0"):
        r = await http.post(f"{base}/connections/{bad}/sdp_params",
                            json={"sdp_offer": OFFER, "track_mapping": MAPPING})
        assert r.status_code == 404 and "connection" in detail(r)
    assert len(fake.calls) == calls


async def test_routes_keep_no_state_between_requests(fake):
    # Two apps over one backend stand for two ingress replicas: any request may land on
    # either, so whatever one app learnt, the other must not need.
    apps = [session_app(lambda request: fake, server_version="1") for _ in range(2)]
    async with client(apps[0]) as a, client(apps[1]) as b:
        sid = await start(a)
        base = W.format(sid=sid)
        cid = (await b.post(base + "/connections")).json()["connection_id"]
        r = await a.post(f"{base}/connections/{cid}/sdp_params",
                         json={"sdp_offer": OFFER, "track_mapping": MAPPING})
        assert r.status_code == 202
        fake.answers[cid] = "v=0 x"
        r = await b.get(f"{base}/connections/{cid}/sdp_params")
        assert r.json() == {"sdp_answer": "v=0 x", "connection_id": cid}
        assert (await b.get(base + "/sdp_params")).json()["connection_id"] == cid
        assert (await a.post("/stop_session", json={"session_id": sid})).status_code == 200


# --------------------------------------------------------------------------- methods


async def test_methods_not_allowed_and_unknown_paths_are_4xx(http):
    for method, path in [("DELETE", "/start_session"), ("GET", "/start_session"),
                         ("PATCH", W.format(sid="a") + "/sdp_params"), ("GET", "/nothing/here")]:
        r = await http.request(method, path)
        assert r.status_code in (404, 405), (method, path)
        assert r.headers["access-control-allow-origin"] == "*"


# --------------------------------------------------------------------------- the stack, mounted


async def test_mounted_under_a_prefix_and_at_the_root():
    backends = {"generator": FakeBackend(), "other": FakeBackend()}

    def backend_for(request: Request):
        name = request.path_params.get("name", "generator")
        if name not in backends:
            raise UnknownSession(f"unknown model {name!r}")
        return backends[name]

    app = FastAPI()
    add_session_middleware(app, auth_token="tok")
    app.include_router(session_routes(backend_for, server_version="1"), prefix="/models/{name}")
    app.include_router(session_routes(backend_for, server_version="1"))
    async with client(app) as http:
        assert (await http.post("/models/other/start_session")).status_code == 401
        assert (await http.get("/models/other/health")).status_code == 200  # public
        sid = await start(http, "/t/tok/models/other/")  # the doubled slash the JS client makes
        assert list(backends["other"].sessions) == [sid]
        r = await http.post(f"/t/tok/models/other/sessions/{sid}/transport/webrtc/sdp_params",
                            json={"sdp_offer": OFFER, "track_mapping": MAPPING})
        assert r.status_code == 202
        r = await http.post("/t/tok/models/nope/start_session")
        assert r.status_code == 404 and "nope" in detail(r)
        root_sid = await start(http, "/t/tok")
        assert list(backends["generator"].sessions) == [root_sid]
        r = await http.post("/t/tok/models/other/stop_session", json={"session_id": sid})
        assert r.status_code == 200
        assert backends["other"].sessions[sid].state == "ended"
        assert backends["generator"].sessions[root_sid].state == "created"


async def test_behind_a_root_path(fake):
    # A Serve route prefix arrives as root_path, with the path including it.
    app = session_app(lambda request: fake, server_version="1", auth_token="tok")
    async with client(app, root_path="/web") as http:
        r = await http.post("http://test/web/t/tok//start_session", json={})
        assert r.status_code == 200, r.text
        assert (await http.post("http://test/web/start_session", json={})).status_code == 401


# --------------------------------------------------------------------------- reactor run's app


async def test_create_app_serves_the_protocol_with_the_real_backend():
    from reactor_serve.local.app import create_app

    app = create_app(GENERATOR, settings_override={"loopback_candidates": True})
    async with app.router.lifespan_context(app):
        async with client(app) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
            r = await http.post("http://test//start_session", json={})
            assert r.status_code == 200, r.text
            check_descriptor(r.json())
            sid = r.json()["session_id"]
            r = await http.post("/start_session")
            assert r.status_code == 409
            r = await http.get("/session")
            assert r.status_code == 400 and sid not in r.text
            r = await http.get("/session", params={"session_id": sid})
            assert r.status_code == 200 and r.json()["session_id"] == sid
            url = W.format(sid=sid) + "/sdp_params"
            r = await http.get(url)
            assert r.status_code == 202
            r = await http.post(W.format(sid=sid) + "/ice_candidates",
                                json={"candidates": [{"candidate": CANDIDATE,
                                                      "sdpMLineIndex": "abc"}]})
            assert r.status_code == 400 and "sdpMLineIndex" in detail(r)
            r = await http.post("/stop_session", json={"session_id": sid})
            assert r.status_code == 200
            r = await http.get("/session", params={"session_id": sid})
            assert r.status_code == 200 and r.json()["state"] == "ended"
            assert isinstance(r.json()["end_reason"], str)
            r = await http.post("/start_session")
            assert r.status_code == 200
            other = r.json()["session_id"]
            r = await http.post("/stop_session")  # names none; nothing lost its transport
            assert r.status_code == 200 and "session_id" not in r.json()
            await http.post("/stop_session", json={"session_id": other})


async def test_create_app_token_guards_the_index_and_docs():
    from reactor_serve.local.app import create_app

    app = create_app(GENERATOR, auth_token="tok")
    async with app.router.lifespan_context(app):
        async with client(app) as http:
            for path in ("/", "/docs", "/openapi.json", "/session?session_id=x"):
                assert (await http.get(path)).status_code == 401, path
            assert (await http.get("/t/tok/")).status_code == 200
            assert (await http.get("/t/tok/openapi.json")).status_code == 200
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/_web/player.js")).status_code == 200
