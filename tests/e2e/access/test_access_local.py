"""API keys and tokens on `reactor run`'s app (auth required), over real HTTP: the
official Python SDK's production flow (`Reactor(model, api_key=...)`: POST /tokens,
POST /sessions, GET /sessions/{id}, WebRTC, DELETE) streaming frames, and every
refusal a 401 or 403 naming why, never a 5xx."""

import asyncio
import base64
import json
import time
from functools import partial
from types import SimpleNamespace

import httpx
import jwt as pyjwt
import pytest
from reactor_sdk import AuthError, Reactor, UnauthorizedError

from reactor_serve.access.access_control import AccessControl
from reactor_serve.access.api_keys import KeyLimits

GRADIENT = "examples/gradient"
OPERATOR = "operator-secret"
# Requests to the test's server with a timeout a loaded machine cannot run past, where
# httpx's default would end a slow answer as if it never came.
http = SimpleNamespace(**{verb: partial(getattr(httpx, verb), timeout=30)
                          for verb in ("get", "post", "delete")})


@pytest.fixture(scope="module")
def access_db(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('access') / 'access.sqlite3'}"


@pytest.fixture(scope="module")
def server(access_db):
    from conftest import DevServer

    access = AccessControl.open(access_db, key_ttl_s=0.5)
    with DevServer(GRADIENT, access=access, operator_token=OPERATOR) as served:
        served.access = access
        yield served


def new_key(server, name="alice", **limits):
    _, text = server.access.store.create(name, KeyLimits(**limits))
    return text


def mint(server, key, body=None, raw=None):
    return http.post(f"{server.url}/tokens", headers={"Reactor-API-Key": key},
                      content=raw if raw is not None else json.dumps(body).encode(),
                      timeout=30)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


async def frames(reactor, track, count, timeout=30.0):
    got = []
    reactor.track(track).on_frame(got.append)
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} frames"
        await asyncio.sleep(0.05)  # the poll interval of this bounded wait
    return got


async def test_the_official_sdk_streams_with_an_api_key(server):
    key = new_key(server)
    reactor = Reactor("gradient", api_key=key, api_url=server.url)
    await reactor.connect()
    try:
        assert len(await frames(reactor, "main_video", 5)) >= 5
        sid = reactor.session_id
        assert sid
    finally:
        await reactor.disconnect()
    # Its DELETE ended the session.
    token = mint(server, key).json()["jwt"]
    ended = http.get(f"{server.url}/sessions/{sid}", headers=bearer(token))
    assert ended.status_code in (200, 404)
    if ended.status_code == 200:
        assert ended.json()["state"] == "CLOSED"


async def test_the_official_sdk_with_a_bad_or_revoked_key_is_refused(server):
    with pytest.raises(AuthError, match="401"):
        await Reactor("gradient", api_key="rsk_" + "0" * 16 + "_" + "A" * 43,
                      api_url=server.url).connect()
    key = new_key(server, "revoked")
    server.access.store.revoke(key.split("_")[1])
    with pytest.raises(AuthError, match="revoked"):
        await Reactor("gradient", api_key=key, api_url=server.url).connect()


async def test_the_official_sdk_with_a_key_for_another_model_is_refused(server):
    key = new_key(server, "other-model", models=("webcam_style",))
    with pytest.raises(AuthError, match="403"):
        await Reactor("gradient", api_key=key, api_url=server.url).connect()


async def test_the_official_sdk_with_a_forged_jwt_is_unauthorized(server):
    forged = pyjwt.encode({"sub": "x", "jti": "y", "iat": int(time.time()),
                           "exp": int(time.time()) + 60, "iss": "reactor-serve"},
                          "not our key, though long enough for HS256", algorithm="HS256", headers={"kid": "nope"})
    with pytest.raises(UnauthorizedError):
        await Reactor("gradient", jwt=forged, api_url=server.url).connect()


def test_a_token_opens_only_its_own_keys_sessions(server):
    alice, bob = new_key(server, "alice"), new_key(server, "bob")
    alice_token = mint(server, alice).json()["jwt"]
    bob_token = mint(server, bob).json()["jwt"]
    started = http.post(f"{server.url}/sessions", headers=bearer(alice_token),
                         json={"model": {"name": "gradient"}})
    assert started.status_code == 201, started.text
    sid = started.json()["session_id"]
    try:
        assert http.get(f"{server.url}/sessions/{sid}",
                         headers=bearer(alice_token)).status_code == 200
        for method, path in [("GET", f"/sessions/{sid}"),
                             ("GET", f"/session?session_id={sid}"),
                             ("GET", f"/sessions/{sid}/transport/webrtc/ice_servers"),
                             ("POST", f"/sessions/{sid}/transport/webrtc/connections"),
                             ("POST", f"/sessions/{sid}/uploads"),
                             ("POST", f"/sessions/{sid}/viewers"),
                             ("GET", f"/sessions/{sid}/steps"),
                             ("GET", f"/clips?session_id={sid}&start=0&end=1"),
                             ("GET", f"/clips/chunks/{sid}/init.mp4"),
                             ("DELETE", f"/sessions/{sid}")]:
            refused = httpx.request(method, f"{server.url}{path}", headers=bearer(bob_token),
                                    json={}, timeout=30)
            assert refused.status_code == 403, (method, path, refused.text)
            assert "does not grant this session" in refused.json()["detail"]
        stop = http.post(f"{server.url}/stop_session", headers=bearer(bob_token),
                          json={"session_id": sid})
        assert stop.status_code == 403
        # A token bound to the session (as the SDK mints to adopt one) opens it...
        bound = mint(server, alice, {"authorization_details": [{
            "type": "session", "resources": {"models": {"all": True},
                                             "sessions": {"bind": [sid]}}}]})
        assert bound.status_code == 200, bound.text
        bound_token = bound.json()["jwt"]
        assert http.get(f"{server.url}/sessions/{sid}",
                         headers=bearer(bound_token)).status_code == 200
        # ...but starts nothing.
        refused = http.post(f"{server.url}/sessions", headers=bearer(bound_token),
                             json={"model": {"name": "gradient"}})
        assert refused.status_code == 403 and "may not start" in refused.json()["detail"]
        # Bob cannot bind Alice's session.
        stolen = mint(server, bob, {"authorization_details": [{
            "type": "session", "resources": {"models": {"all": True},
                                             "sessions": {"bind": [sid]}}}]})
        assert stolen.status_code == 403
    finally:
        http.delete(f"{server.url}/sessions/{sid}", headers=bearer(alice_token))


def test_a_scoped_token_acts_only_on_sessions_it_started(server):
    key = new_key(server, "scoped")
    scoped = {"authorization_details": [{"type": "session",
                                         "resources": {"models": {"match": ["gradient"]}},
                                         "constraints": {"max_sessions": 1}}]}
    first = mint(server, key, scoped).json()["jwt"]
    second = mint(server, key, scoped).json()["jwt"]
    started = http.post(f"{server.url}/sessions", headers=bearer(first),
                         json={"model": {"name": "gradient"}})
    assert started.status_code == 201, started.text
    sid = started.json()["session_id"]
    try:
        assert http.get(f"{server.url}/sessions/{sid}", headers=bearer(second)).status_code == 403
        # max_sessions 1: the token has had its one session.
        again = http.post(f"{server.url}/sessions", headers=bearer(first),
                           json={"model": {"name": "gradient"}})
        assert again.status_code == 403 and "at most 1" in again.json()["detail"]
    finally:
        http.delete(f"{server.url}/sessions/{sid}", headers=bearer(first))


def test_a_revoked_keys_tokens_stop_working(server):
    key = new_key(server, "to-revoke")
    token = mint(server, key).json()["jwt"]
    assert http.post(f"{server.url}/sessions", headers=bearer(token),
                      json={"model": {"name": "wrong"}}).status_code == 400
    server.access.store.revoke(key.split("_")[1])
    # Past the server's key cache (key_ttl_s=0.5), the duration the product is configured
    # with: a loaded machine can only make the wait longer than it.
    time.sleep(0.6)
    refused = http.post(f"{server.url}/sessions", headers=bearer(token),
                         json={"model": {"name": "gradient"}})
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def _b64(data):
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def hostile_tokens(valid):
    header, payload, signature = valid.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    now = int(time.time())
    return {
        "alg none": f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': 'x'})}.{payload}.",
        "RS256 header": f"{_b64({'alg': 'RS256', 'typ': 'JWT', 'kid': 'x'})}.{payload}.{signature}",
        "forged signature": f"{header}.{payload}.{signature[:-4]}AAAA",
        "tampered payload": f"{header}.{_b64({**claims, 'sub': '0' * 16})}.{signature}",
        "truncated": valid[: len(valid) // 2],
        "oversized": valid + "A" * 10_000,
        "not a jwt": "hello",
        "unknown kid": f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': 'ffff'})}.{payload}.{signature}",
        "expired": pyjwt.encode({**claims, "iat": now - 100, "exp": now - 50}, "k" * 32,
                                algorithm="HS256", headers={"kid": "ffff"}),
        "lone surrogate": "eyJ\udc80.x.y",
        "empty": "",
    }


def test_hostile_tokens_are_401_naming_why(server):
    key = new_key(server, "hostile")
    valid = mint(server, key).json()["jwt"]
    for label, token in hostile_tokens(valid).items():
        headers = {"Authorization": "Bearer " + token.encode("utf-8", "surrogateescape")
                   .decode("latin-1", "replace")} if token else {}
        try:
            answer = http.post(f"{server.url}/sessions", headers=headers,
                                json={"model": {"name": "gradient"}}, timeout=30)
        except UnicodeEncodeError:
            continue  # httpx refuses to send it at all
        assert answer.status_code in (401, 431), (label, answer.status_code, answer.text)
        if answer.status_code == 401:
            assert answer.json()["detail"], label
            assert answer.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("body, words", [
    ({"authorization_details": {"type": "session"}}, "authorization_details"),
    ({"authorization_details": [{"type": "account"}]}, "type"),
    ({"authorization_details": [{"type": "session", "resources": {}}]}, "resources.models"),
    ({"authorization_details": [{"type": "session",
                                 "resources": {"models": {"match": ["gradient"]}},
                                 "constraints": {"max_session_duration_seconds": 0}}]},
     "max_session_duration_seconds"),
    ({"authorization_details": [{"type": "session",
                                 "resources": {"models": {"match": ["gradient"]}},
                                 "constraints": {"max_session_duration_seconds": 86_401}}]},
     "max_session_duration_seconds"),
    ({"authorization_details": [{"type": "session",
                                 "resources": {"models": {"match": ["gradient"]}},
                                 "constraints": {"max_sessions": 10 ** 6}}]}, "max_sessions"),
    ({"expires_after": "soon"}, "expires_after"),
    ({"expires_after": -5}, "expires_after"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_token_requests_are_403_naming_the_field(server, body, words):
    key = new_key(server, "requests")
    answer = mint(server, key, body)
    assert answer.status_code == 403, answer.text
    assert words in answer.json()["detail"]


@pytest.mark.parametrize("raw", [b"[", b'{"a":' * 500, b"NaN", b'"\\ud800"', b"7",
                                 b'{"expires_after": ' + b"9" * 5000 + b"}"])
def test_malformed_token_bodies_are_400(server, raw):
    answer = mint(server, new_key(server, "raw"), raw=raw)
    assert answer.status_code == 400, answer.text


def test_token_lifetime_is_capped_by_the_server(server):
    answer = mint(server, new_key(server, "lifetime"), {"expires_after": 10 ** 9})
    assert answer.status_code == 200
    claims = pyjwt.decode(answer.json()["jwt"], options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 6 * 3600 == answer.json()["expires_in"]
    header = pyjwt.get_unverified_header(answer.json()["jwt"])
    assert header["alg"] == "HS256" and header["kid"]


def test_public_paths_and_pages_need_no_token(server):
    assert http.get(f"{server.url}/health").status_code == 200
    page = http.get(f"{server.url}/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert http.get(f"{server.url}/openapi.json").status_code == 401


def start(server, token):
    return http.post(f"{server.url}/sessions", headers=bearer(token),
                      json={"model": {"name": "gradient"}}, timeout=30)


def delete_and_settle(server, token, sid):
    assert http.delete(f"{server.url}/sessions/{sid}", headers=bearer(token),
                        timeout=30).status_code == 200
    # The end reaches the usage ledger's database on its thread.
    assert server.access.usage_ledger().flush()


def test_concurrent_sessions_are_held_to_the_keys_quota(server):
    key = new_key(server, "one-at-a-time", max_concurrent=1)
    token = mint(server, key).json()["jwt"]
    first = start(server, token)
    assert first.status_code == 201, first.text
    assert server.access.usage_ledger().flush()
    refused = start(server, token)
    assert refused.status_code == 429, refused.text
    assert "max_concurrent" in refused.json()["detail"]
    assert int(refused.headers["retry-after"]) >= 1
    delete_and_settle(server, token, first.json()["session_id"])
    again = start(server, token)
    assert again.status_code == 201, again.text
    delete_and_settle(server, token, again.json()["session_id"])


def test_session_starts_are_held_to_the_keys_rate(server):
    key = new_key(server, "two-a-minute", starts_per_minute=2)
    token = mint(server, key).json()["jwt"]
    for _ in range(2):
        started = start(server, token)
        assert started.status_code == 201, started.text
        delete_and_settle(server, token, started.json()["session_id"])
    refused = start(server, token)
    assert refused.status_code == 429 and "starts_per_minute" in refused.json()["detail"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60


@pytest.mark.parametrize("key_limit, token_limit", [(3, None), (100, 3), (3, 100)])
async def test_a_session_ends_at_the_lower_of_the_keys_and_the_tokens_limit(
        server, key_limit, token_limit):
    from reactor_serve.client import connect

    key = new_key(server, "short", max_session_s=key_limit)
    body = None if token_limit is None else {"authorization_details": [{
        "type": "session", "resources": {"models": {"match": ["gradient"]}},
        "constraints": {"max_session_duration_seconds": token_limit}}]}
    token = mint(server, key, body).json()["jwt"]
    started = time.monotonic()
    client = await connect(server.url, token=token)
    try:
        warning = await client.next_message("session_limit", scope="application", after=0,
                                            timeout=60)
        # The lower limit is the one the server applies: its warning says so, whatever
        # time a loaded machine took to deliver it.
        assert 0 < warning["data"]["seconds_left"] <= 3
        assert await client.wait_closed(timeout=60) == "limit"
        # Not cut short: a lower bound only, the configured limit, which load can only
        # lengthen.
        assert 2.5 < time.monotonic() - started
    finally:
        await client.close()
    assert server.access.usage_ledger().flush()


def test_usage_is_reported_to_the_operator_per_key(server):
    key = new_key(server, "metered")
    key_id = key.split("_")[1]
    token = mint(server, key).json()["jwt"]
    # The session's time as the client can bound it: at least from the start's answer
    # to sending the stop, at most from sending the start to the stop's answer (and
    # the ledger's flush). Bounds, not one figure: the requests' own trips take what a
    # loaded machine makes them take.
    began = time.monotonic()
    started = start(server, token)
    opened = time.monotonic()
    assert started.status_code == 201
    time.sleep(1.0)  # a session of some length; nothing is asserted on this figure
    stopping = time.monotonic()
    delete_and_settle(server, token, started.json()["session_id"])
    ended = time.monotonic()
    refused = http.get(f"{server.url}/usage", params={"key": key_id})
    assert refused.status_code == 403
    answer = http.get(f"{server.url}/usage", params={"key": key_id},
                       headers={"X-Operator-Token": OPERATOR})
    assert answer.status_code == 200, answer.text
    [row] = answer.json()["usage"]
    assert row["key_id"] == key_id and row["model"] == "gradient" and row["sessions"] == 1
    total = row["waiting_s"] + row["ready_s"] + row["orphaned_s"]
    # The report rounds each figure to the millisecond.
    assert stopping - opened - 0.002 <= total <= ended - began + 0.002, (
        stopping - opened, total, ended - began)
    assert row["replica_s"] == pytest.approx(total, abs=0.01)
    for params in ({"from": "yesterday"}, {"from": "nan"}, {"key": "../x"},
                   {"from": "2030-01-01", "to": "2020-01-01"}, {"to": "9" * 50}):
        bad = http.get(f"{server.url}/usage", params=params,
                        headers={"X-Operator-Token": OPERATOR})
        assert bad.status_code == 400, (params, bad.text)


def test_repeated_bad_keys_from_one_address_are_slowed_then_refused(server):
    # A server of its own would be cleaner; the throttle is per address and this
    # test runs last in the module (it blocks 127.0.0.1 for a minute).
    bad = "rsk_" + "1" * 16 + "_" + "B" * 43
    started = time.monotonic()
    statuses = [mint(server, bad).status_code for _ in range(21)]
    assert statuses[0] == 401 and statuses[-1] == 429
    # Answers were held back: a lower bound only, the delays the throttle is
    # configured to add, which load can only lengthen.
    assert time.monotonic() - started > 1.0
    blocked = mint(server, bad)
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
