"""The `SessionBackend` contract (sessions/contract.py, docs/protocol.md) as seen by clients,
against both real servers: `reactor run` (a subprocess) and the Ray Serve ingress.

Every case runs once per server and asserts the same behaviour over real HTTP and real
aiortc peers on loopback. One server per parameter serves the whole module; both run
the gradient example with the same reconnect grace. Each case ends what it started (stop
with `{"session_id"}`), so the single slot of each server is free for the next case.
Nothing here asserts a speed: waits are bounded only so a broken server fails instead
of hanging.
"""

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from conftest import RAY_GROUP, ReactorRun
from paths import ROOT

from reactor_serve.client import ClientState, connect
from reactor_serve.client.peer import ClientPeer
from reactor_serve.rtc.host_candidates import HostCandidatePolicy

pytestmark = pytest.mark.timeout(180)

GRADIENT = ROOT / "examples" / "gradient"
# The reconnect grace the servers are configured with. A case resumes an orphan within
# it (noticing the drop, gathering a new peer's candidates and offering, all on a loaded
# machine), so it must be far longer than that takes; the case that waits past it waits
# for the resulting end, never for a fixed instant.
GRACE_S = 20
# Bounds on waits (not speeds): how long a broken server gets before the case fails.
ANSWER_WAIT_S = 60.0
STATE_WAIT_S = 60.0
# The gradient's mean pixel is about 127 at brightness 1 and about 25 at 0.2.
BRIGHT = 80.0
DARK = 60.0


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    kind: str
    base: str
    root: str
    run: ReactorRun | None = None

    def log(self) -> str:
        return self.run.output()[-6000:] if self.run is not None else ""


# The Serve case asks for the test session's Ray Serve only once it runs, so it names
# the Ray tests' worker group itself (tests/conftest.py groups the others by fixture).
@pytest.fixture(scope="module", params=[
    "reactor_run", pytest.param("serve", marks=pytest.mark.xdist_group(RAY_GROUP)),
])
def server(request, tmp_path_factory):
    """`reactor run` on a copy of the gradient example whose config sets the grace,
    or the gradient on the test session's Serve with the same setting."""
    if request.param == "reactor_run":
        model = tmp_path_factory.mktemp("contract") / "gradient"
        shutil.copytree(GRADIENT, model, ignore=shutil.ignore_patterns("__pycache__"))
        with open(model / "config.yml", "a") as config:
            config.write(f"\nwebrtc:\n  reconnect_grace_s: {GRACE_S}\n")
        run = ReactorRun(model)
        try:
            yield Server("reactor_run", run.url, run.url, run)
        finally:
            run.stop()
    else:
        ray_serve = request.getfixturevalue("ray_serve")
        url = ray_serve.deploy("contract", {"operator_token": "op", "models": [
            {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1,
             "warm_spares": 0, "cpus_per_replica": 0.5,
             "webrtc": {"loopback_candidates": True, "reconnect_grace_s": GRACE_S}},
        ]})
        try:
            yield Server("serve", f"{url}/models/gradient", url)
        finally:
            ray_serve.delete("contract")


# The servers offer 127.0.0.1 candidates; so do our peers.
LOOPBACK = HostCandidatePolicy(loopback_only=True)


class Tracker:
    """What a case started: peers, clients, session ids; all ended after the case."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.peers: list[ClientPeer] = []
        self.clients: list = []
        self.sids: list[str] = []

    async def cleanup(self) -> None:
        for client in self.clients:
            await client.close()
        for peer in self.peers:
            await peer.close()
        async with httpx.AsyncClient(timeout=30) as http:
            for sid in self.sids:
                await http.post(f"{self.server.base}/stop_session", json={"session_id": sid})
            for sid in self.sids:
                deadline = time.monotonic() + STATE_WAIT_S
                while time.monotonic() < deadline:
                    reply = await http.get(f"{self.server.base}/session",
                                           params={"session_id": sid})
                    if reply.status_code == 404 or reply.json().get("state") == "ended":
                        break
                    await asyncio.sleep(0.1)  # poll interval of a bounded wait for the end


@pytest.fixture
async def track(server):
    tracker = Tracker(server)
    yield tracker
    await tracker.cleanup()


# --------------------------------------------------------------------------- helpers


def shown(reply: httpx.Response) -> str:
    return f"{reply.request.method} {reply.request.url} -> {reply.status_code} {reply.text[:500]}"


def transport(server: Server, sid: str) -> str:
    return f"{server.base}/sessions/{sid}/transport/webrtc"


async def start(http: httpx.AsyncClient, server: Server, track: Tracker) -> dict:
    reply = await http.post(f"{server.base}/start_session", json={})
    assert reply.status_code == 200, shown(reply)
    descriptor = reply.json()
    assert isinstance(descriptor["session_id"], str) and descriptor["session_id"]
    track.sids.append(descriptor["session_id"])
    return descriptor


async def describe(http: httpx.AsyncClient, server: Server, sid: str) -> httpx.Response:
    return await http.get(f"{server.base}/session", params={"session_id": sid})


async def state_of(http: httpx.AsyncClient, server: Server, sid: str) -> dict:
    reply = await describe(http, server, sid)
    assert reply.status_code == 200, shown(reply)
    return reply.json()


async def wait_state(http, server, sid, wanted, *, forbidden=(), timeout=STATE_WAIT_S) -> dict:
    """Poll the descriptor until its state is `wanted`; fail on a `forbidden` one."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        body = await state_of(http, server, sid)
        if not seen or seen[-1] != body["state"]:
            seen.append(body["state"])
        if body["state"] == wanted:
            return body
        assert body["state"] not in forbidden, f"session went {seen}, wanted {wanted!r}: {body}"
        assert time.monotonic() < deadline, f"session went {seen}, never {wanted!r}: {body}"
        await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline


async def poll_answer(http, url: str, connection_id: int, statuses: list | None = None) -> str:
    """GET `url` until 200; only 202 may come before. Returns the SDP answer."""
    deadline = time.monotonic() + ANSWER_WAIT_S
    while True:
        reply = await http.get(url)
        if statuses is not None:
            statuses.append(reply.status_code)
        if reply.status_code == 200:
            body = reply.json()
            assert isinstance(body.get("sdp_answer"), str) and body["sdp_answer"].startswith("v=0"), body
            assert body.get("connection_id") == connection_id, (body.get("connection_id"), connection_id)
            return body["sdp_answer"]
        assert reply.status_code == 202, shown(reply)
        assert time.monotonic() < deadline, f"no answer within {ANSWER_WAIT_S} s: {shown(reply)}"
        await asyncio.sleep(0.1)  # poll interval of a wait with a generous deadline


def flat_signal(http, server: Server, sid: str, method: str = "POST", statuses: list | None = None):
    """docs/protocol.md's flat flow: POST (or PUT, a reconnect) the offer, poll the answer."""
    url = f"{transport(server, sid)}/sdp_params"

    async def signal(sdp_offer, track_mapping):
        reply = await http.request(method, url, json={
            "sdp_offer": sdp_offer, "client_info": {"sdk": "contract-test"},
            "track_mapping": track_mapping})
        if statuses is not None:
            statuses.append(reply.status_code)
        assert reply.status_code == 202, shown(reply)
        connection_id = reply.json()["connection_id"]
        assert isinstance(connection_id, int), reply.json()
        return await poll_answer(http, url, connection_id, statuses)

    return signal


async def open_peer(http, server, track, descriptor, method="POST", statuses=None) -> ClientPeer:
    peer = ClientPeer(descriptor["capabilities"], host_candidates=LOOPBACK)
    track.peers.append(peer)
    signal = flat_signal(http, server, descriptor["session_id"], method, statuses)
    await peer.connect(signal, timeout=ANSWER_WAIT_S)
    return peer


async def frames(peer: ClientPeer, count: int = 5, timeout: float = 60.0) -> list:
    """`count` frames received from now on."""
    start_at = peer.frames_received
    await peer.wait_for(lambda: peer.frames_received >= start_at + count, timeout,
                        f"{count} video frames")
    return list(peer.video["main_video"])[-count:]


def mean(frame) -> float:
    return float(np.asarray(frame.image).mean())


async def pictures(peer: ClientPeer, count: int = 5) -> list:
    """`count` frames the model made, from its first on: until it has made one, a
    session shows black (all zeros), for as many frames as a busy machine takes."""
    deadline = time.monotonic() + STATE_WAIT_S
    while not np.asarray((await frames(peer, 1))[-1].image).any():
        assert time.monotonic() < deadline, "the model's first picture never came (only black)"
    return await frames(peer, count)


async def darken(peer: ClientPeer) -> None:
    """set_brightness 0.2 and wait until the picture shows it."""
    normal = mean((await pictures(peer, 3))[-1])
    assert normal > BRIGHT, f"the gradient should be bright before (mean {normal:.1f})"
    peer.send_command("set_brightness", {"brightness": 0.2})
    # The pictures say when the command applied, however many frames that took.
    deadline = time.monotonic() + STATE_WAIT_S
    while mean((await frames(peer, 1))[-1]) >= DARK:
        assert time.monotonic() < deadline, "the picture did not darken after set_brightness 0.2"


def session_ended(peer: ClientPeer) -> list[dict]:
    return [m["data"]["data"] for m in peer.messages
            if m.get("scope") == "runtime" and (m.get("data") or {}).get("type") == "sessionEnded"]


async def a_real_offer() -> str:
    """A well-formed SDP offer (for requests on ids that must 404 whatever the body)."""
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("video", direction="recvonly")
        pc.createDataChannel("data")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


def http_client(user_agent: str = "contract-test/1.0") -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=30, headers={"User-Agent": user_agent})


# --------------------------------------------------------------------------- cases


async def test_flat_flow_offer_202_poll_200_then_frames_and_the_states(server, track):
    async with http_client() as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        assert descriptor["state"] == "created"
        created = await state_of(http, server, sid)
        assert created["session_id"] == sid and created["state"] == "created", created
        ice = await http.get(f"{transport(server, sid)}/ice_servers")
        assert ice.status_code == 200 and isinstance(ice.json()["ice_servers"], list), shown(ice)

        statuses: list[int] = []
        peer = await open_peer(http, server, track, descriptor, statuses=statuses)
        # The offer: exactly 202; the polls: 202 while pending, then one 200.
        assert statuses[0] == 202 and statuses[-1] == 200, statuses
        assert set(statuses[1:-1]) <= {202}, statuses
        got = await pictures(peer, 10)
        assert mean(got[-1]) > BRIGHT
        await wait_state(http, server, sid, "streaming", forbidden=("ended",))

        stop = await http.post(f"{server.base}/stop_session", json={"session_id": sid})
        assert stop.status_code == 200, shown(stop)
        ended = await wait_state(http, server, sid, "ended")
        assert ended["end_reason"] == "client_closed", ended
        assert "end_message" in ended, ended
        # An ended session takes no offer.
        again = await http.put(f"{transport(server, sid)}/sdp_params", json={
            "sdp_offer": await a_real_offer(), "track_mapping": []})
        assert again.status_code == 404, shown(again)


async def test_get_session_without_an_id_is_400_and_names_none(server, track):
    async with http_client() as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        await open_peer(http, server, track, descriptor)
        for url in (f"{server.base}/session", f"{server.base}/session?session_id="):
            reply = await http.get(url)
            assert reply.status_code in (400, 404), shown(reply)
            assert sid not in reply.text, shown(reply)
        reply = await http.get(f"{server.base}/session")
        assert reply.status_code == 400, shown(reply)
        assert "session_id" not in reply.json() and "detail" in reply.json(), reply.json()


@pytest.mark.parametrize("made_up", [
    "unknown",                       # well-formed, never minted
    "not a session id",              # spaces
    "x" * 300,                       # too long
    "<script>alert(1)</script>",
    "sess%00ion",
    "..",
])
async def test_unknown_and_malformed_ids_are_404(server, made_up):
    sid = secrets.token_urlsafe(16) if made_up == "unknown" else made_up
    offer = {"sdp_offer": await a_real_offer(), "track_mapping": []}
    from urllib.parse import quote

    base = f"{server.base}/sessions/{quote(sid, safe='')}/transport/webrtc"
    async with http_client() as http:
        replies = [
            await http.get(f"{server.base}/session", params={"session_id": sid}),
            await http.post(f"{server.base}/stop_session", json={"session_id": sid}),
            await http.get(f"{base}/ice_servers"),
            await http.post(f"{base}/sdp_params", json=offer),
            await http.put(f"{base}/sdp_params", json=offer),
            await http.get(f"{base}/sdp_params"),
            await http.post(f"{base}/ice_candidates", json={"candidates": [], "is_final": True}),
            await http.post(f"{base}/connections"),
            await http.get(f"{base}/connections/1/sdp_params"),
        ]
    for reply in replies:
        assert reply.status_code == 404, shown(reply)
        assert "detail" in reply.json(), shown(reply)


async def test_a_cut_transport_orphans_and_an_offer_within_the_grace_resumes_with_state(
    server, track
):
    client = await connect(server.base, reconnect=False, timeout=ANSWER_WAIT_S)
    track.clients.append(client)
    sid = client.session_id
    track.sids.append(sid)
    await darken(client.peer)
    async with http_client() as http:
        # The network drops: the client's peer connection goes away, no stop_session.
        await client.peer.pc.close()
        await wait_state(http, server, sid, "orphaned", forbidden=("ended",))

        resumed = await open_peer(http, server, track, {"session_id": sid,
                                                       "capabilities": client.descriptor["capabilities"]},
                                  method="PUT")
        after = await frames(resumed, 10)
        assert all(mean(f) < DARK for f in after), [round(mean(f)) for f in after]
        body = await wait_state(http, server, sid, "streaming", forbidden=("ended",))
        assert body["session_id"] == sid


async def test_after_the_grace_an_orphan_ends_with_timeout_and_frees_the_slot(server, track):
    client = await connect(server.base, reconnect=False, timeout=ANSWER_WAIT_S)
    track.clients.append(client)
    sid = client.session_id
    track.sids.append(sid)
    await frames(client.peer, 3)
    async with http_client() as http:
        await client.peer.pc.close()
        await wait_state(http, server, sid, "orphaned", forbidden=("ended",))
        ended = await wait_state(http, server, sid, "ended", timeout=GRACE_S + STATE_WAIT_S)
        assert ended["end_reason"] == "timeout", ended
        assert ended["end_message"], ended
        late = await http.put(f"{transport(server, sid)}/sdp_params", json={
            "sdp_offer": await a_real_offer(), "track_mapping": []})
        assert late.status_code == 404, shown(late)

        # The slot is free: a new session streams.
        descriptor = await start(http, server, track)
        peer = await open_peer(http, server, track, descriptor)
        assert mean((await pictures(peer, 5))[-1]) > BRIGHT
        await wait_state(http, server, descriptor["session_id"], "streaming")


async def test_stop_session_naming_the_session_ends_it_with_client_closed(server, track):
    client = await connect(server.base, reconnect=False, timeout=ANSWER_WAIT_S)
    track.clients.append(client)
    sid = client.session_id
    track.sids.append(sid)
    await frames(client.peer, 3)
    async with http_client() as http:
        stop = await http.post(f"{server.base}/stop_session", json={"session_id": sid})
        assert stop.status_code == 200, shown(stop)
        ended = await wait_state(http, server, sid, "ended")
        assert ended["end_reason"] == "client_closed", ended
    await client.peer.wait_for(lambda: session_ended(client.peer), STATE_WAIT_S,
                               "the server's sessionEnded")
    told = session_ended(client.peer)[0]
    assert told["reason"] == "client_closed" and "detected_by" not in told, told
    assert await client.wait_closed(STATE_WAIT_S) == "client_closed"
    assert client.state == ClientState.ENDED


async def test_hijack_attempts_fail(server, track):
    async with http_client("victim/1.0") as victim, http_client("Mallory/1.0") as mallory:
        descriptor = await start(victim, server, track)
        sid = descriptor["session_id"]
        peer = await open_peer(victim, server, track, descriptor)
        await frames(peer, 3)

        # No route tells another client the id.
        routes = [f"{server.base}/session", f"{server.base}/health", f"{server.base}/",
                  f"{server.base}/sessions", f"{server.root}/", f"{server.root}/models",
                  f"{server.root}/session", f"{server.root}/health", f"{server.base}/openapi.json"]
        for url in routes:
            for headers in ({}, {"Accept": "application/json"}):
                reply = await mallory.get(url, headers=headers)
                assert sid not in reply.text, shown(reply)
        assert (await mallory.get(f"{server.base}/session")).status_code == 400

        # A stop naming no session, from another client, ends nothing and names nothing.
        stop = await mallory.post(f"{server.base}/stop_session")
        assert stop.status_code == 200, shown(stop)
        assert sid not in stop.text, shown(stop)
        # A negative check (the stop ended nothing): a busy machine can only make it
        # pass more easily.
        await frames(peer, 10)
        assert (await state_of(victim, server, sid))["state"] == "streaming"
        # Nor did it arm anything: a drop right after still only orphans the session.
        await peer.pc.close()
        await wait_state(victim, server, sid, "orphaned", forbidden=("ended",))
        resumed = await open_peer(victim, server, track, descriptor, method="PUT")
        await frames(resumed, 3)
        await wait_state(victim, server, sid, "streaming", forbidden=("ended",))

        # Made-up ids get nowhere.
        guess = secrets.token_urlsafe(16)
        offer = {"sdp_offer": await a_real_offer(), "track_mapping": []}
        for reply in (
            await mallory.post(f"{transport(server, guess)}/sdp_params", json=offer),
            await mallory.put(f"{transport(server, guess)}/sdp_params", json=offer),
            await mallory.get(f"{transport(server, guess)}/sdp_params"),
            await mallory.post(f"{transport(server, guess)}/ice_candidates",
                               json={"candidates": [], "is_final": True}),
            await mallory.get(f"{server.base}/session", params={"session_id": guess}),
            await mallory.post(f"{server.base}/stop_session", json={"session_id": guess}),
        ):
            assert reply.status_code == 404, shown(reply)
            assert sid not in reply.text, shown(reply)
        await frames(resumed, 3)
        assert (await state_of(victim, server, sid))["state"] == "streaming"


async def test_unnamed_stop_then_closing_the_peer_ends_the_session_at_once(server, track):
    """JS SDK 2.9.0's disconnect(): stop_session with no body, then it closes its peer
    connection. The session ends (client_closed), it is not kept for a reconnect."""
    async with http_client("sdk-like/2.9.0") as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        peer = await open_peer(http, server, track, descriptor)
        await frames(peer, 3)
        stop = await http.post(f"{server.base}/stop_session")
        assert stop.status_code == 200, shown(stop)
        assert sid not in stop.text, shown(stop)
        await peer.close()
        ended = await wait_state(http, server, sid, "ended", forbidden=("orphaned",))
        assert ended["end_reason"] == "client_closed", ended


async def test_a_malformed_candidate_is_400_and_the_session_keeps_working(server, track):
    async with http_client() as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        peer = await open_peer(http, server, track, descriptor)
        await frames(peer, 3)
        url = f"{transport(server, sid)}/ice_candidates"
        for body in (
            {"candidates": [{"candidate": "candidate:this is not a candidate",
                             "sdpMid": "0", "sdpMLineIndex": 0}]},
            {"candidates": [42]},
            {"candidates": [{"candidate": ["a list"]}]},
        ):
            reply = await http.post(url, json=body)
            assert reply.status_code == 400, shown(reply)
            assert reply.json().get("detail"), shown(reply)
        good = await http.post(url, json={"candidates": [{
            "candidate": "candidate:1 1 udp 2130706431 127.0.0.1 9 typ host",
            "sdpMid": "0", "sdpMLineIndex": 0}], "is_final": False})
        assert good.status_code == 202, shown(good)
        # Still streaming, still obeying commands.
        await darken(peer)
        assert (await state_of(http, server, sid))["state"] == "streaming"


async def test_the_connections_flow(server, track):
    async with http_client() as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        base = transport(server, sid)
        statuses: list[int] = []

        async def signal(sdp_offer, track_mapping):
            registered = await http.post(f"{base}/connections")
            assert registered.status_code == 201, shown(registered)
            body = registered.json()
            cid = body["connection_id"]
            assert isinstance(cid, int) and body["track_map"]["main_video"]["direction"] == "out", body
            offer = await http.post(f"{base}/connections/{cid}/sdp_params", json={
                "sdp_offer": sdp_offer, "track_mapping": track_mapping})
            statuses.append(offer.status_code)
            assert offer.status_code == 202 and offer.json()["connection_id"] == cid, shown(offer)
            return await poll_answer(http, f"{base}/connections/{cid}/sdp_params", cid, statuses)

        peer = ClientPeer(descriptor["capabilities"], host_candidates=LOOPBACK)
        track.peers.append(peer)
        await peer.connect(signal, timeout=ANSWER_WAIT_S)
        assert statuses[0] == 202 and statuses[-1] == 200 and set(statuses[1:-1]) <= {202}, statuses
        assert mean((await pictures(peer, 5))[-1]) > BRIGHT
        await wait_state(http, server, sid, "streaming", forbidden=("ended",))
        unregistered = await http.get(f"{base}/connections/4242/sdp_params")
        assert unregistered.status_code == 404, shown(unregistered)


# --------------------------------------------------------------------------- uploads


async def test_uploads_belong_to_a_connected_session_and_go_with_it(server, track):
    upload = {"name": "notes.txt", "size": 11, "mime_type": "text/plain"}
    async with http_client() as http:
        descriptor = await start(http, server, track)
        sid = descriptor["session_id"]
        early = await http.post(f"{server.base}/sessions/{sid}/uploads", json=upload)
        assert early.status_code == 400 and "not connected yet" in early.text, shown(early)
        await open_peer(http, server, track, descriptor)

        reserved = await http.post(f"{server.base}/sessions/{sid}/uploads", json=upload)
        assert reserved.status_code == 201, shown(reserved)
        url = reserved.json()["presigned_url"]
        assert url.startswith(server.base + "/uploads/"), url
        short = await http.put(url, content=b"hello")
        assert short.status_code == 400 and "11" in short.text, shown(short)
        written = await http.put(url, content=b"hello world", headers={"content-type": "text/plain"})
        assert written.status_code == 200, shown(written)
        again = await http.put(url, content=b"hello world")
        assert again.status_code == 409, shown(again)

        too_big = await http.post(f"{server.base}/sessions/{sid}/uploads",
                                  json={**upload, "size": 10**12})
        assert too_big.status_code == 413, shown(too_big)
        forged = await http.put(f"{server.base}/uploads/{secrets.token_hex(4)}-0000-4000-8000-"
                                f"{secrets.token_hex(6)}", content=b"x")
        assert forged.status_code == 404, shown(forged)
        pending = (await http.post(f"{server.base}/sessions/{sid}/uploads", json=upload)).json()

        stop = await http.post(f"{server.base}/stop_session", json={"session_id": sid})
        assert stop.status_code == 200, shown(stop)
        await wait_state(http, server, sid, "ended")
        # The session's uploads ended with it: a late PUT, and a late reservation, fail.
        late = await http.put(pending["presigned_url"], content=b"hello world")
        assert late.status_code == 404, shown(late)
        after = await http.post(f"{server.base}/sessions/{sid}/uploads", json=upload)
        assert after.status_code == 404, shown(after)


async def test_another_sessions_upload_cannot_be_written(server, track):
    upload = {"name": "a.bin", "size": 3, "mime_type": "application/octet-stream"}
    async with http_client() as http:
        first = await start(http, server, track)
        await open_peer(http, server, track, first)
        reserved = await http.post(f"{server.base}/sessions/{first['session_id']}/uploads",
                                   json=upload)
        assert reserved.status_code == 201, shown(reserved)
        await http.post(f"{server.base}/stop_session", json={"session_id": first["session_id"]})
        await wait_state(http, server, first["session_id"], "ended")
        second = await start(http, server, track)
        await open_peer(http, server, track, second)
        # The first session's id means nothing in the second's: 404, nothing written.
        stolen = await http.put(reserved.json()["presigned_url"], content=b"abc")
        assert stolen.status_code == 404, shown(stolen)
        own = await http.post(f"{server.base}/sessions/{second['session_id']}/uploads", json=upload)
        assert own.status_code == 201, shown(own)
        assert (await http.put(own.json()["presigned_url"], content=b"abc")).status_code == 200
