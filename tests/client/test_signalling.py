"""The HTTP half of connecting, against scripted server answers (httpx.MockTransport):
answers, refusals with and without a JSON `detail`, queued offers, stale answers, and
polls that run out of time on a fake clock."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
import pytest

from reactor_serve.client.signalling import (
    SessionOver,
    SessionRefused,
    check_session,
    checked_json,
    fetch_ice_servers,
    host_candidates_for,
    http_client,
    join_url,
    offer_signal,
    start_session,
    watch_signal,
    watch_url,
)

BASE = "http://model.test/models/gradient"
TRACKS = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def server(handle: Callable[[httpx.Request], httpx.Response]) -> tuple[httpx.AsyncClient, list]:
    """An HTTP client whose every request `handle` answers; the requests, in order."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handle(request)

    return httpx.AsyncClient(transport=httpx.MockTransport(record)), seen


def answers(*responses: httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
    queue = list(responses)
    return lambda request: queue.pop(0)


def body_of(request: httpx.Request) -> dict[str, Any]:
    return json.loads(request.content)


# ---- checked_json -----------------------------------------------------------------


async def test_a_good_answer_is_its_json_body():
    http, _ = server(answers(httpx.Response(200, json={"session_id": "s1"})))
    async with http:
        assert checked_json(await http.get(f"{BASE}/session"), 200) == {"session_id": "s1"}


async def test_an_expected_empty_answer_is_an_empty_body():
    http, _ = server(answers(httpx.Response(202)))
    async with http:
        assert checked_json(await http.post(f"{BASE}/x"), 202) == {}


async def test_a_4xx_names_the_request_the_status_and_the_servers_detail():
    http, _ = server(answers(httpx.Response(429, json={"detail": "the model is busy"})))
    async with http:
        response = await http.post(f"{BASE}/start_session")
    with pytest.raises(SessionRefused) as refused:
        checked_json(response, 200)
    assert refused.value.status == 429
    assert str(refused.value) == "POST /models/gradient/start_session: 429 the model is busy"


async def test_a_5xx_without_json_carries_the_servers_text():
    http, _ = server(answers(httpx.Response(502, text="<html>Bad Gateway</html>")))
    async with http:
        response = await http.get(f"{BASE}/session")
    with pytest.raises(SessionRefused) as refused:
        checked_json(response, 200)
    assert refused.value.status == 502
    assert str(refused.value) == "GET /models/gradient/session: 502 <html>Bad Gateway</html>"


async def test_an_unexpected_success_status_is_a_refusal_too():
    http, _ = server(answers(httpx.Response(200, json={"sdp_answer": "v=0"})))
    async with http:
        response = await http.post(f"{BASE}/sdp_params")
    with pytest.raises(SessionRefused) as refused:
        checked_json(response, 202)
    assert refused.value.status == 200


# ---- starting, ICE servers, asking about a session ----------------------------------


async def test_start_session_sends_the_extra_args_and_returns_the_descriptor():
    http, seen = server(answers(httpx.Response(200, json={"session_id": "s1"}),
                                httpx.Response(200, json={"session_id": "s2"})))
    async with http:
        assert await start_session(http, BASE + "/", {"seed": 3}) == {"session_id": "s1"}
        assert await start_session(http, BASE) == {"session_id": "s2"}
    assert [r.url.path for r in seen] == ["/models/gradient/start_session"] * 2
    assert body_of(seen[0]) == {"extra_args": {"seed": 3}} and body_of(seen[1]) == {}


async def test_fetch_ice_servers_reads_the_sessions_list():
    servers = [{"uris": ["stun:stun.test:3478"]}]
    http, seen = server(answers(httpx.Response(200, json={"ice_servers": servers}),
                                httpx.Response(200, json={})))
    async with http:
        assert await fetch_ice_servers(http, BASE, "s1") == servers
        assert await fetch_ice_servers(http, BASE, "s1") == []
    assert seen[0].url.path == "/models/gradient/sessions/s1/transport/webrtc/ice_servers"


async def test_check_session_returns_a_live_sessions_descriptor_and_names_it():
    http, seen = server(answers(httpx.Response(200, json={"state": "streaming"})))
    async with http:
        assert await check_session(http, BASE, "s1") == {"state": "streaming"}
    assert seen[0].url.params["session_id"] == "s1"


async def test_check_session_raises_the_servers_end_reason():
    ended = {"state": "ended", "end_reason": "timeout", "end_message": "no reconnect in 30 s"}
    http, _ = server(answers(httpx.Response(200, json=ended),
                             httpx.Response(200, json={"state": "ended"})))
    async with http:
        with pytest.raises(SessionOver) as over:
            await check_session(http, BASE, "s1")
        assert (over.value.reason, over.value.message) == ("timeout", "no reconnect in 30 s")
        with pytest.raises(SessionOver) as over:
            await check_session(http, BASE, "s1")
        assert (over.value.reason, over.value.message) == ("unknown", None)


async def test_check_session_of_an_unknown_session_is_over_with_the_404s_words():
    http, _ = server(answers(httpx.Response(404, json={"detail": "no session s1"}),
                             httpx.Response(404, text="not found")))
    async with http:
        with pytest.raises(SessionOver) as over:
            await check_session(http, BASE, "s1")
        assert (over.value.reason, over.value.message) == ("error", "no session s1")
        with pytest.raises(SessionOver) as over:
            await check_session(http, BASE, "s1")
        assert over.value.message == "404 not found"


async def test_check_session_leaves_other_failures_to_the_caller():
    http, _ = server(answers(httpx.Response(503, text="restarting")))
    async with http:
        assert await check_session(http, BASE, "s1") == {}


# ---- the owner's offer --------------------------------------------------------------


async def test_a_queued_offer_reports_its_position_then_returns_the_answer():
    clock = FakeClock()
    http, seen = server(answers(
        httpx.Response(202, json={"connection_id": 4}),
        httpx.Response(202, json={"status": "queued", "position": 2}),
        httpx.Response(202, json={"status": "queued", "position": 1}),
        httpx.Response(202),
        httpx.Response(200, json={"sdp_answer": "v=0 answer", "connection_id": 4}),
    ))
    queued: list[dict[str, Any]] = []
    async with http:
        signal = offer_signal(http, BASE, "s1", "POST", 10.0, on_queue=queued.append,
                              clock=clock, sleep=clock.sleep)
        assert await signal("v=0 offer", TRACKS) == "v=0 answer"
    assert queued == [{"status": "queued", "position": 2}, {"status": "queued", "position": 1},
                      {}]
    offer = seen[0]
    assert offer.method == "POST"
    assert offer.url.path == "/models/gradient/sessions/s1/transport/webrtc/sdp_params"
    assert body_of(offer) == {"sdp_offer": "v=0 offer", "track_mapping": TRACKS,
                              "client_info": {"sdk": "reactor-serve-python"}}
    # The owner's polls name no connection, and back off from a fast start.
    assert all(r.method == "GET" and not r.url.params for r in seen[1:])
    assert clock.slept == pytest.approx([0.02, 0.03, 0.045])


async def test_a_reconnect_offers_with_put_and_skips_a_stale_answer():
    clock = FakeClock()
    http, seen = server(answers(
        httpx.Response(202, json={"connection_id": 7}),
        httpx.Response(200, json={"sdp_answer": "old", "connection_id": 6}),
        httpx.Response(200, json={"sdp_answer": "new"}),
    ))
    async with http:
        signal = offer_signal(http, BASE, "s1", "PUT", 10.0, clock=clock, sleep=clock.sleep)
        assert await signal("v=0", TRACKS) == "new"
    assert seen[0].method == "PUT"


async def test_a_refused_offer_raises_with_the_servers_reason():
    http, _ = server(answers(httpx.Response(404, json={"detail": "session s1 has ended"})))
    async with http:
        signal = offer_signal(http, BASE, "s1", "PUT", 10.0)
        with pytest.raises(SessionRefused) as refused:
            await signal("v=0", TRACKS)
    assert refused.value.status == 404 and "session s1 has ended" in str(refused.value)


async def test_a_failing_poll_raises_instead_of_polling_on():
    clock = FakeClock()
    http, seen = server(answers(httpx.Response(202, json={"connection_id": 1}),
                                httpx.Response(500, text="Internal Server Error")))
    async with http:
        signal = offer_signal(http, BASE, "s1", "POST", 10.0, clock=clock, sleep=clock.sleep)
        with pytest.raises(SessionRefused) as refused:
            await signal("v=0", TRACKS)
    assert refused.value.status == 500 and len(seen) == 2


async def test_no_answer_in_time_is_a_refusal():
    clock = FakeClock()
    http, _ = server(lambda request: httpx.Response(
        202, json={"connection_id": 1} if request.method == "POST" else {"status": "pending"}
    ))
    async with http:
        signal = offer_signal(http, BASE, "s1", "POST", 3.0, clock=clock, sleep=clock.sleep)
        with pytest.raises(SessionRefused, match=r"no SDP answer within 3 s"):
            await signal("v=0", TRACKS)
    assert sum(clock.slept) >= 3.0
    assert max(clock.slept) == 1.0  # the backoff's cap


# ---- the viewer's offer -------------------------------------------------------------


async def test_a_viewer_offers_at_its_link_and_polls_for_its_connection():
    clock = FakeClock()
    http, seen = server(answers(
        httpx.Response(202, json={"connection_id": 12}),
        httpx.Response(202, json={"status": "pending"}),
        httpx.Response(200, json={"sdp_answer": "viewer answer", "connection_id": 12}),
    ))
    offered: list[int | None] = []
    link = watch_url(BASE, "tok/en")
    async with http:
        signal = watch_signal(http, link, 10.0, on_offered=offered.append,
                              clock=clock, sleep=clock.sleep)
        assert await signal("v=0", TRACKS) == "viewer answer"
    assert offered == [12]
    assert seen[0].method == "POST"
    assert seen[0].url.raw_path == b"/models/gradient/watch/tok%2Fen/sdp_params"
    assert body_of(seen[0])["client_info"] == {"sdk": "reactor-serve-python", "viewer": True}
    assert [r.url.params.get("connection_id") for r in seen[1:]] == ["12", "12"]


async def test_a_viewer_without_an_answer_in_time_is_told_so():
    clock = FakeClock()
    http, _ = server(lambda request: httpx.Response(
        202, json={"connection_id": 1} if request.method == "POST" else {}
    ))
    async with http:
        signal = watch_signal(http, watch_url(BASE, "t"), 2.0, clock=clock, sleep=clock.sleep)
        with pytest.raises(SessionRefused, match=r"no SDP answer for the viewer within 2 s"):
            await signal("v=0", TRACKS)


# ---- URLs, the HTTP client, host candidates ------------------------------------------


def test_join_url_puts_exactly_one_slash_between():
    assert join_url("http://h:1/", "/session") == "http://h:1/session"
    assert join_url("http://h:1/t/abc", "models") == "http://h:1/t/abc/models"


async def test_http_client_carries_the_token_only_when_there_is_one():
    async with http_client("s3cret") as with_token, http_client(None) as without:
        assert with_token.headers["Authorization"] == "Bearer s3cret"
        assert "Authorization" not in without.headers


@pytest.mark.parametrize("url, loopback_only, loopback", [
    ("http://127.0.0.1:8080", None, True),
    ("http://localhost:8080/models/x", None, True),
    ("http://192.0.2.10:8080", None, False),
    ("http://192.0.2.10:8080", True, True),
    ("http://127.0.0.1:8080", False, False),
])
def test_host_candidates_are_loopback_only_for_a_server_on_this_machine(url, loopback_only, loopback):
    policy = host_candidates_for(url, loopback_only)
    assert (policy is not None) is loopback
    if policy is not None:
        assert policy.loopback_only
