"""Fuzz the session HTTP API of a real `reactor run` app: every route gets a generated
corpus of hostile requests, and every answer must be a 4xx (or a success), never a
5xx; afterwards a normal client still starts a session and receives video.

The app is `create_app("examples/gradient")` with the real SeatedSessionBackend, served
in-process through httpx's ASGITransport (the WebRTC of the final check runs over
loopback UDP as usual).

For benchmarks: `fuzz_corpus(sid, cid)` is the corpus, `FUZZ_CASES` its size, and
`await fuzz_app(app)` runs it against a started app and returns a `FuzzReport`
(`cases`, `five_xx`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from paths import ROOT

from reactor_serve.local.app import create_app

GRADIENT = ROOT / "examples" / "gradient"
W = "/sessions/{sid}/transport/webrtc"
CANDIDATE = "candidate:1 1 udp 2122260223 192.168.1.2 54321 typ host generation 0"
SDP_HEAD = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"

__all__ = ["FUZZ_CASES", "FuzzCase", "FuzzReport", "fuzz_app", "fuzz_corpus"]


@dataclass(frozen=True)
class FuzzCase:
    method: str
    path: str
    content: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    label: str = ""


@dataclass
class FuzzReport:
    cases: int = 0
    # (status or exception, case label) of every answer >= 500
    five_xx: list[tuple[str, str]] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    # Session ids that a case happened to start (a body the server accepted).
    started: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- corpus

_JSON = (("content-type", "application/json"),)

# Bodies that are wrong whatever the route.
GENERIC_BODIES: dict[str, bytes] = {
    "empty": b"",
    "whitespace": b" \r\n\t ",
    "not json": b"hello, server",
    "truncated": b'{"sdp_offer": "v=0',
    "null": b"null",
    "true": b"true",
    "number": b"42",
    "string": b'"start"',
    "array": b"[]",
    "array of objects": b'[{"session_id": "x"}]',
    "deep arrays 100k": b"[" * 100_000 + b"]" * 100_000,
    "deep objects 100k": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "deep unclosed 100k": b"[" * 100_000,
    "huge int": b'{"extra_args": {"n": ' + b"7" * 5000 + b"}}",
    "huge negative int": b'{"session_id": -' + b"7" * 4301 + b"}",
    "huge float": b'{"is_final": 1e400}',
    "NaN": b'{"extra_args": {"x": NaN}}',
    "Infinity": b'{"sdp_offer": Infinity}',
    "-Infinity": b'{"candidates": [-Infinity]}',
    "lone high surrogate": b'{"session_id": "\\ud800"}',
    "lone low surrogate key": b'{"\\udc00": 1}',
    "surrogate in offer": b'{"sdp_offer": "v=0\\r\\n\\ud83d"}',
    "utf-8 encoded surrogate": b'{"session_id": "\xed\xa0\x80"}',
    "invalid utf-8": b'{"session_id": "\xff\xfe"}',
    "utf-16": '{"session_id": "x"}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"extra_args": {}}',
    "nul bytes": b'{"session_id": "a\x00b"}',
    "duplicate keys": b'{"session_id": 1, "session_id": "x", "extra_args": 1, "extra_args": {}}',
    "300 KiB": b'{"pad": "' + b"x" * (300 * 1024) + b'"}',
    "many keys": b"{" + b",".join(b'"k%d": %d' % (i, i) for i in range(20_000)) + b"}",
    "wide array": b'{"candidates": [' + b",".join([b"[]"] * 60_000) + b"]}",
}

# Values of the wrong type, size or shape for any one field.
WRONG_VALUES: dict[str, Any] = {
    "null": None,
    "true": True,
    "zero": 0,
    "negative": -1,
    "big int": 10**30,
    "float": 1.5,
    "empty string": "",
    "string": "abc",
    "long string": "x" * 70_000,
    "control chars": "\x00\x01\x1b[31m",
    "unicode": "ü€😀",
    "empty array": [],
    "array": [None, 1, "a"],
    "empty object": {},
    "object": {"a": {"b": [1, 2, {"c": None}]}},
    "deep object": json.loads('{"a":' * 30 + "1" + "}" * 30),
}

ODD_SESSION_IDS = [
    "x" * 10_000, "%00", "..", "%2e%2e", "%2F", "a%20b", "ü", "%F0%9F%98%80", "${jndi:x}",
    "-", "null", "0", "a" * 129, "%ff%fe",
]
ODD_CONNECTION_IDS = ["x", "-1", "0", "1.5", "1e3", "9" * 30, "%00", "ü", "1" * 10]


def _body(value: Any) -> bytes:
    return json.dumps(value).encode()


def _bad_candidates() -> dict[str, Any]:
    good = {"candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0}
    return {
        "sdpMLineIndex abc": [{**good, "sdpMLineIndex": "abc"}],
        "sdpMLineIndex negative": [{**good, "sdpMLineIndex": -5}],
        "sdpMLineIndex huge": [{**good, "sdpMLineIndex": 10**40}],
        "sdpMLineIndex float": [{**good, "sdpMLineIndex": 0.5}],
        "sdpMLineIndex list": [{**good, "sdpMLineIndex": [0]}],
        "sdp_mline_index abc": [{**good, "sdp_mline_index": "abc", "sdpMLineIndex": None}],
        "sdpMid number": [{**good, "sdpMid": 0}],
        "sdpMid object": [{**good, "sdpMid": {"a": 1}}],
        "sdpMid long": [{**good, "sdpMid": "m" * 5000}],
        "candidate number": [{**good, "candidate": 7}],
        "candidate garbage": [{**good, "candidate": "garbage"}],
        "candidate short": [{**good, "candidate": "candidate:1 1 udp"}],
        "candidate bad port": [{**good, "candidate": CANDIDATE.replace("54321", "99999999999")}],
        "candidate bad component": [{**good, "candidate": CANDIDATE.replace(" 1 udp", " x udp")}],
        "candidate no typ": [{**good, "candidate": CANDIDATE.replace("typ", "tip")}],
        "candidate bad rport": [{**good, "candidate": CANDIDATE + " raddr 1.2.3.4 rport x"}],
        "candidate unicode": [{**good, "candidate": CANDIDATE.replace("host", "hôst")}],
        "candidate 2 KiB": [{**good, "candidate": CANDIDATE + " a b" * 700}],
        "candidate nul": [{**good, "candidate": CANDIDATE + "\x00"}],
        "ufrag object": [{**good, "usernameFragment": {}}],
        "null entry": [None],
        "number entry": [5],
        "nested arrays": [[[CANDIDATE]]],
        "65 candidates": [good] * 65,
        "10000 candidates": [good] * 10_000,
        "candidates object": {"candidate": CANDIDATE},
        "candidates string": CANDIDATE,
    }


def _bad_track_mappings() -> dict[str, Any]:
    good = {"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}
    return {
        "object": good,
        "strings": ["0", "main_video"],
        "nulls": [None],
        "missing name": [{"mid": "0"}],
        "mid float": [{**good, "mid": 0.5}],
        "mid huge": [{**good, "mid": 10**20}],
        "name object": [{**good, "name": {"x": 1}}],
        "kind long": [{**good, "kind": "k" * 10_000}],
        "unknown track": [{**good, "name": "nope"}],
        "odd direction": [{**good, "direction": "both"}],
        "33 entries": [good] * 33,
        "100000 entries": [good] * 100_000,
    }


# SDP offers that pass the HTTP checks (they start with v=0) but are not usable: the
# backend must reject them as 4xx, at once or when polled.
JUNK_OFFERS = {
    "only version": "v=0",
    "version line": "v=0\r\n",
    "no media": SDP_HEAD,
    "garbage lines": "v=0\r\nthis is not sdp\r\n\x7f\r\n",
    "bad m-line": SDP_HEAD + "m=video x UDP/TLS/RTP/SAVPF 96\r\n",
    "media without ice": SDP_HEAD + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\n"
                         "a=rtpmap:96 VP8/90000\r\na=mid:0\r\na=recvonly\r\n",
    "unicode": "v=0\r\ns=ünïcödé\r\n",
    "long line": "v=0\r\na=" + "x" * 60_000 + "\r\n",
}


def fuzz_corpus(sid: str, cid: int) -> list[FuzzCase]:
    """Every hostile case, for a live session `sid` with a registered connection `cid`."""
    base = W.format(sid=sid)
    conn = f"{base}/connections/{cid}"
    # route -> (method, path, the body fields it reads)
    body_routes = [
        ("POST", "/start_session", ("extra_args", "generation")),
        ("POST", "/stop_session", ("session_id",)),
        ("POST", f"{base}/sdp_params", ("sdp_offer", "track_mapping", "client_info")),
        ("PUT", f"{base}/sdp_params", ("sdp_offer", "track_mapping", "client_info")),
        ("POST", f"{base}/ice_candidates", ("candidates", "is_final")),
        ("POST", f"{base}/connections", ()),
        ("POST", f"{conn}/sdp_params", ("sdp_offer", "track_mapping", "client_info")),
        ("PUT", f"{conn}/sdp_params", ("sdp_offer", "track_mapping", "client_info")),
        ("POST", f"{conn}/ice_candidates", ("candidates", "is_final")),
        ("POST", f"/sessions/{sid}/uploads", ("name", "size", "mime_type")),
        ("POST", "/sessions", ("model", "extra_args", "extra_configs", "supported_transports")),
    ]
    get_routes = [
        "/session", "/health", f"{base}/ice_servers", f"{base}/sdp_params",
        f"{conn}/sdp_params", "/", "/docs", "/openapi.json", "/_web/player.js",
        "/doctor", "/_web/doctor.js", f"/clips?session_id={sid}&start=0&end=1",
        f"/clips/chunks/{sid}/c1-init.mp4", f"/sessions/{sid}/steps", f"/sessions/{sid}/steps/1",
        f"/sessions/{sid}/steps/1/main_video.mp4", f"/sessions/{sid}",
    ]
    cases: list[FuzzCase] = []

    # Every body route x every generic body.
    for method, path, _ in body_routes:
        for label, content in GENERIC_BODIES.items():
            cases.append(FuzzCase(method, path, content, _JSON, f"{method} {path}: {label}"))

    # Every field of every body route x every wrong value.
    for method, path, fields in body_routes:
        for name in fields:
            for label, value in WRONG_VALUES.items():
                body: dict[str, Any] = {name: value}
                if name in ("track_mapping", "client_info"):
                    body["sdp_offer"] = SDP_HEAD  # reach the field past sdp_offer
                if path == "/sessions" and name != "model":
                    body["model"] = {"name": "gradient"}  # reach the field past model
                cases.append(FuzzCase(method, path, _body(body), _JSON,
                                      f"{method} {path}: {name} = {label}"))

    # Candidates, track mappings and offers that are wrong in detail.
    for path in (f"{base}/ice_candidates", f"{conn}/ice_candidates"):
        for label, candidates in _bad_candidates().items():
            cases.append(FuzzCase("POST", path, _body({"candidates": candidates}), _JSON,
                                  f"POST {path}: {label}"))
    for method, path in (("POST", f"{base}/sdp_params"), ("PUT", f"{conn}/sdp_params")):
        for label, mapping in _bad_track_mappings().items():
            body = {"sdp_offer": SDP_HEAD, "track_mapping": mapping}
            cases.append(FuzzCase(method, path, _body(body), _JSON, f"{method} {path}: {label}"))
        for label, offer in JUNK_OFFERS.items():
            cases.append(FuzzCase(method, path, _body({"sdp_offer": offer}), _JSON,
                                  f"{method} {path}: offer {label}"))
            cases.append(FuzzCase("GET", path, None, (), f"GET {path} after offer {label}"))
    cases.append(FuzzCase("POST", "/start_session",
                          _body({"extra_args": {"k%d" % i: "v" * 100 for i in range(200)}}),
                          _JSON, "extra_args 20 KiB"))

    # Odd path parameters on every session route.
    for odd in ODD_SESSION_IDS:
        odd_base = W.format(sid=odd)
        for method, path in [
            ("GET", f"{odd_base}/ice_servers"), ("GET", f"{odd_base}/sdp_params"),
            ("POST", f"{odd_base}/sdp_params"), ("PUT", f"{odd_base}/sdp_params"),
            ("POST", f"{odd_base}/ice_candidates"), ("POST", f"{odd_base}/connections"),
            ("GET", f"{odd_base}/connections/1/sdp_params"),
            ("POST", f"{odd_base}/connections/1/ice_candidates"),
            ("GET", f"/session?session_id={odd}"),
        ]:
            content = _body({"sdp_offer": SDP_HEAD, "candidates": []}) if method != "GET" else None
            cases.append(FuzzCase(method, path, content, _JSON, f"{method} sid {odd[:20]!r}"))
        cases.append(FuzzCase("POST", "/stop_session", _body({"session_id": odd}), _JSON,
                              f"stop sid {odd[:20]!r}"))
        cases.append(FuzzCase("POST", f"/sessions/{odd}/uploads",
                              _body({"name": "a", "size": 1, "mime_type": "a/b"}), _JSON,
                              f"upload sid {odd[:20]!r}"))
        cases.append(FuzzCase("PUT", f"/uploads/{odd}", b"x", (), f"PUT upload {odd[:20]!r}"))
        for method in ("GET", "DELETE"):
            cases.append(FuzzCase(method, f"/sessions/{odd}", None, (),
                                  f"{method} session {odd[:20]!r}"))
        cases.append(FuzzCase("GET", f"/clips?session_id={odd}&start=0&end=1", None, (),
                              f"GET clips sid {odd[:20]!r}"))
        cases.append(FuzzCase("GET", f"/clips/chunks/{odd}/c1-init.mp4", None, (),
                              f"GET clip segment sid {odd[:20]!r}"))
    # Step numbers and file names that are no step's.
    for step in ("0", "-1", "01", "1e3", "9" * 40, "x", "%00"):
        cases.append(FuzzCase("GET", f"/sessions/{sid}/steps/{step}", None, (), f"GET step {step[:20]!r}"))
    for name in ("result.json", "x.mp4", "..%2Fresult.json", "a" * 300 + ".mp4", "main_video.mp4%00"):
        cases.append(FuzzCase("GET", f"/sessions/{sid}/steps/1/{name}", None, (),
                              f"GET step file {name[:20]!r}"))
    # Clip markers and segment names that are no clip's.
    for marker in ("", "nan", "inf", "-1", "1e309", "9" * 400, "0x10", "1.5.5", "%00", "１"):
        cases.append(FuzzCase("GET", f"/clips?session_id={sid}&start={marker}&end=1", None, (),
                              f"GET clips start {marker[:20]!r}"))
        cases.append(FuzzCase("GET", f"/clips?session_id={sid}&start=0&end={marker}", None, (),
                              f"GET clips end {marker[:20]!r}"))
    for segment in ("c1-init.mp4", "c1-00000.m4s", "c9999999999-init.mp4", "..", "%2e%2e%2fetc",
                    "c1-init.mp4%00", "x" * 3000, "c1-" + "0" * 400 + ".m4s"):
        cases.append(FuzzCase("GET", f"/clips/chunks/{sid}/{segment}", None, (),
                              f"GET clip segment {segment[:20]!r}"))
    for odd in ODD_CONNECTION_IDS:
        for method, suffix in [("GET", "sdp_params"), ("POST", "sdp_params"),
                               ("PUT", "sdp_params"), ("POST", "ice_candidates")]:
            content = _body({"sdp_offer": SDP_HEAD}) if method != "GET" else None
            cases.append(FuzzCase(method, f"{base}/connections/{odd}/{suffix}", content, _JSON,
                                  f"{method} cid {odd[:20]!r} {suffix}"))

    # Upload bodies of every size against ids never issued, and lying lengths.
    never = "00000000-0000-4000-8000-000000000000"
    for label, content in (("empty", b""), ("a byte", b"x"), ("200 KiB", b"x" * 200_000),
                           ("2 MiB", b"x" * 2_000_000)):
        cases.append(FuzzCase("PUT", f"/uploads/{never}", content, (), f"PUT never issued {label}"))
    # Lengths no HTTP client sends for a 1-byte body (real clients refuse to send one
    # that is a number and wrong; this corpus also runs over real HTTP).
    for length in ("-1", "abc", "1e3", "99999999999999999999999"):
        cases.append(FuzzCase("PUT", f"/uploads/{never}", b"x", (("content-length", length),),
                              f"PUT never issued content-length {length!r}"))

    # Odd queries and paths.
    for query in ("session_id", "session_id=", "session_id=a&session_id=b", "x=" + "y" * 5000,
                  "session_id=%00", "session_id=" + "%ff" * 10):
        cases.append(FuzzCase("GET", f"/session?{query}", None, (), f"GET /session?{query[:20]}"))
    for path in ("//", "///start_session", "/t/", "/t//start_session", "/t/x/../health",
                 "/sessions", "/sessions/", f"{base}", f"{base}/", f"{base}/nope",
                 "/_web/", "/_web/../../etc/passwd", "/_web/x.py", "/" + "a/" * 2000):
        cases.append(FuzzCase("GET", path, None, (), f"GET {path[:30]}"))
        cases.append(FuzzCase("POST", path, b"{}", _JSON, f"POST {path[:30]}"))

    # Methods a route does not have, and odd headers.
    for method in ("DELETE", "PATCH", "TRACE"):
        for _, path, _ in body_routes:
            cases.append(FuzzCase(method, path, None, (), f"{method} {path}"))
        for path in get_routes:
            cases.append(FuzzCase(method, path, None, (), f"{method} {path}"))
    for path in get_routes:
        cases.append(FuzzCase("PUT", path, b"{}", _JSON, f"PUT {path}"))
    for headers in (
        (("content-type", "text/plain"),),
        (("content-type", "multipart/form-data; boundary=x"),),
        (("content-type", "application/x-www-form-urlencoded"),),
        (("authorization", "Bearer " + "t" * 5000),),
        (("authorization", "Bearer"),),
        (("content-length", "abc"),),
        (("content-length", "99999999999999999999999"),),
        (("reactor-api-version", "\x01"),),
        (("origin", "null"),),
    ):
        for method, path, _ in body_routes[:3]:
            cases.append(FuzzCase(method, path, b'{"extra_args": {}}', headers,
                                  f"{method} {path} with {headers[0][0]}"))
    return cases


FUZZ_CASES = len(fuzz_corpus("s", 1))


# --------------------------------------------------------------------------- running


async def run_corpus(http: httpx.AsyncClient, cases: list[FuzzCase]) -> FuzzReport:
    """Send every case; count statuses; keep any 5xx (or exception) with its label."""
    report = FuzzReport()
    for case in cases:
        report.cases += 1
        try:
            r = await http.request(case.method, case.path, content=case.content,
                                   headers=dict(case.headers))
        except httpx.HTTPError as exc:
            report.five_xx.append((type(exc).__name__, case.label))
            continue
        report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
        if r.status_code >= 500:
            report.five_xx.append((str(r.status_code), f"{case.label}: {r.text[:200]}"))
        elif case.path in ("/start_session", "/sessions") and r.status_code in (200, 201):
            report.started.append(r.json()["session_id"])
    return report


def _client(app: Any, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    # raise_app_exceptions=False: an exception escaping the app is a 500 like any other.
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://fuzz", timeout=30, headers=headers,
    )


async def fuzz_app(app: Any, headers: dict[str, str] | None = None) -> FuzzReport:
    """Run the whole corpus against a started app (its lifespan entered): a session is
    started and a connection registered first, so the session routes see a live id;
    whatever the corpus started is stopped afterwards. `headers` go with every request
    (a token, where the app requires one)."""
    async with _client(app, headers) as http:
        r = await http.post("/start_session", json={})
        assert r.status_code == 200, r.text
        sid = r.json()["session_id"]
        r = await http.post(W.format(sid=sid) + "/connections")
        assert r.status_code == 201, r.text
        cid = r.json()["connection_id"]
        report = await run_corpus(http, fuzz_corpus(sid, cid))
        for started in [sid, *report.started]:
            r = await http.post("/stop_session", json={"session_id": started})
            assert r.status_code < 500, r.text
    return report


# --------------------------------------------------------------------------- a real client


async def connect_and_receive(http: httpx.AsyncClient) -> str:
    """Start a session and stream from it as a real aiortc client; returns its id."""
    from reactor_serve.client.peer import ClientPeer

    r = await http.post("/start_session", json={})
    assert r.status_code == 200, r.text
    descriptor = r.json()
    sid = descriptor["session_id"]
    url = W.format(sid=sid) + "/sdp_params"

    async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
        r = await http.post(url, json={"sdp_offer": sdp_offer, "track_mapping": track_mapping})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 60
        while True:
            r = await http.get(url)
            if r.status_code == 200:
                return r.json()["sdp_answer"]
            assert r.status_code == 202, r.text
            assert time.monotonic() < deadline, "no SDP answer to the offer"
            await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline

    peer = ClientPeer(descriptor["capabilities"])
    try:
        await peer.connect(signal, timeout=60)
        await peer.wait_for(lambda: peer.frames_received > 0, 60, "a video frame")
    finally:
        await peer.close()
    return sid


@pytest.fixture
async def app():
    app = create_app(GRADIENT, settings_override={"loopback_candidates": True})
    async with app.router.lifespan_context(app):
        yield app


def test_the_corpus_covers_every_route():
    cases = fuzz_corpus("s", 1)
    assert FUZZ_CASES == len(cases) > 900
    paths = {c.path.split("?")[0] for c in cases}
    for route in ("/start_session", "/stop_session", "/session", "/health", "/doctor",
                  "/sessions/s/transport/webrtc/sdp_params",
                  "/sessions/s/transport/webrtc/ice_candidates",
                  "/sessions/s/transport/webrtc/ice_servers",
                  "/sessions/s/transport/webrtc/connections",
                  "/sessions/s/transport/webrtc/connections/1/sdp_params",
                  "/sessions/s/transport/webrtc/connections/1/ice_candidates",
                  "/clips", "/clips/chunks/s/c1-init.mp4", "/sessions/s/steps",
                  "/sessions/s/steps/1", "/sessions/s/steps/1/main_video.mp4",
                  "/sessions", "/sessions/s"):
        assert route in paths, route


async def test_no_input_gets_a_5xx_and_the_server_still_serves(app):
    report = await fuzz_app(app)
    assert report.cases == FUZZ_CASES
    assert report.five_xx == [], "\n".join(f"{s}: {label}" for s, label in report.five_xx)
    # The corpus reached the routes, not just a 404 wall: bodies were read and refused.
    assert report.statuses.get(400, 0) > 500 and report.statuses.get(404, 0) > 50
    assert report.statuses.get(413, 0) > 0
    async with _client(app) as http:
        sid = await connect_and_receive(http)
        assert (await http.post("/stop_session", json={"session_id": sid})).status_code == 200


async def test_bad_candidates_before_an_offer_do_not_block_later_clients(app):
    async with _client(app) as http:
        r = await http.post("/start_session", json={})
        sid = r.json()["session_id"]
        base = W.format(sid=sid)
        for label, candidates in _bad_candidates().items():
            r = await http.post(f"{base}/ice_candidates", json={"candidates": candidates})
            assert r.status_code in (400, 413), (label, r.text)
        # Well-formed but useless ones are taken (and kept for the offer).
        odd = [{"candidate": CANDIDATE.replace("192.168.1.2", "203.0.113.9"), "sdpMid": "9",
                "sdpMLineIndex": 7}, {"candidate": ""}]
        r = await http.post(f"{base}/ice_candidates", json={"candidates": odd, "is_final": True})
        assert r.status_code == 202, r.text
        r = await http.post("/stop_session", json={"session_id": sid})
        assert r.status_code == 200
        # The slot is free: a new client starts and streams.
        sid = await connect_and_receive(http)
        assert (await http.post("/stop_session", json={"session_id": sid})).status_code == 200


async def test_an_abandoned_session_with_bad_candidates_still_ends_and_frees_the_slot(app):
    # Without a stop: only the offer timeout may end it, and then the slot is free. The
    # test waits for the freed slot, not for an instant past the timeout.
    app.state.backend._offer_timeout_s = 0.3  # noqa: SLF001 (shortened for the test)
    async with _client(app) as http:
        sid = (await http.post("/start_session", json={})).json()["session_id"]
        r = await http.post(W.format(sid=sid) + "/ice_candidates",
                            json={"candidates": [{"candidate": CANDIDATE, "sdpMLineIndex": "abc"}]})
        assert r.status_code == 400
        deadline = time.monotonic() + 60
        while True:
            r = await http.post("/start_session", json={})
            if r.status_code == 200:
                break
            assert r.status_code == 409, r.text
            assert time.monotonic() < deadline, "the abandoned session never freed the slot"
            await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline
        await http.post("/stop_session", json={"session_id": r.json()["session_id"]})


# --------------------------------------------------------------------------- with API keys


@pytest.fixture
async def access_app(tmp_path):
    from reactor_serve.access.access_control import AccessControl

    access = AccessControl.open(f"sqlite:///{tmp_path / 'access.sqlite3'}")
    app = create_app(GRADIENT, settings_override={"loopback_candidates": True}, access=access)
    async with app.router.lifespan_context(app):
        yield app


async def _token(app: Any) -> str:
    _, key = app.state.access.store.create("fuzz")
    async with _client(app) as http:
        r = await http.post("/tokens", headers={"Reactor-API-Key": key}, content=b"null")
        assert r.status_code == 200, r.text
        return r.json()["jwt"]


async def test_with_auth_required_the_corpus_gets_no_5xx(access_app):
    token = await _token(access_app)
    report = await fuzz_app(access_app, {"Authorization": f"Bearer {token}"})
    assert report.five_xx == [], "\n".join(f"{s}: {label}" for s, label in report.five_xx)
    assert report.statuses.get(400, 0) > 500


async def test_without_a_token_every_session_route_is_401_and_nothing_5xx(access_app):
    async with _client(access_app) as http:
        report = await run_corpus(http, fuzz_corpus("s", 1))
    assert report.five_xx == [], "\n".join(f"{s}: {label}" for s, label in report.five_xx)
    # What answers without a token: health, pages and static files, uploads' PUT
    # (their URL is the credential), and paths that are no route.
    assert report.statuses.get(401, 0) > 0.8 * report.cases
    assert not report.started


TOKEN_BODIES: dict[str, bytes] = {
    **GENERIC_BODIES,
    "details not a list": _body({"authorization_details": {"type": "session"}}),
    "two details": _body({"authorization_details": [{"type": "session"}] * 2}),
    "detail a string": _body({"authorization_details": ["session"]}),
    "models match not a list": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"match": "gradient"}}}]}),
    "models all false": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"all": False}}}]}),
    "65 models": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"match": ["m"] * 65}}}]}),
    "bind not ids": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"all": True}, "sessions": {"bind": [1]}}}]}),
    "bind unknown": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"all": True},
                                          "sessions": {"bind": ["nobody"]}}}]}),
    "max_sessions bool": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"all": True}},
         "constraints": {"max_sessions": True}}]}),
    "duration float": _body({"authorization_details": [
        {"type": "session", "resources": {"models": {"all": True}},
         "constraints": {"max_session_duration_seconds": 1.5}}]}),
    "expires_after 5000 digits": b'{"expires_after": 1' + b"0" * 5000 + b"}",
    "expires_after NaN": b'{"expires_after": NaN}',
}


async def test_hostile_token_requests_get_4xx_naming_the_problem(access_app):
    _, key = access_app.state.access.store.create("fuzz-tokens")
    async with _client(access_app) as http:
        for label, content in TOKEN_BODIES.items():
            r = await http.post("/tokens", headers={"Reactor-API-Key": key, **dict(_JSON)},
                                content=content)
            if label in ("empty", "whitespace", "null"):
                # No body is the unscoped request fetch_jwt sends as `null`.
                assert r.status_code == 200, (label, r.text)
                continue
            assert 400 <= r.status_code < 500, (label, r.status_code, r.text)
            assert r.json()["detail"], label
        for label, key_text in (("empty", ""), ("junk", "hello"), ("long", "rsk_" + "a" * 5000),
                                ("unknown", "rsk_" + "0" * 16 + "_" + "A" * 43)):
            r = await http.post("/tokens", headers={"Reactor-API-Key": key_text},
                                content=b"null")
            assert r.status_code == 401, (label, r.text)
