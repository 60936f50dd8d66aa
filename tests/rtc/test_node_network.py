"""Media across a network, on real servers: host candidates advertised with a node's
announced address and bound within its UDP port range (`reactor run` and a Serve
replica), a port range too small for one more session, and relay-only sessions
through a real coturn with TURN REST credentials minted per session."""

import asyncio
import shutil
import time

import httpx
import pytest
from aioice.stun import TransactionFailed
from aiortc import RTCConfiguration, RTCPeerConnection
from coturn_server import TURN_SECRET, coturn, free_udp_range, relay_model  # noqa: F401 (fixtures)
from paths import ROOT

from reactor_serve.client import connect
from reactor_serve.client.peer import ClientPeer
from reactor_serve.client.signalling import (
    SessionRefused,
    fetch_ice_servers,
    offer_signal,
    start_session,
)
from reactor_serve.rtc.host_candidates import HostCandidatePolicy
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.rtc.turn_credentials import mint_turn_credentials

# A guard against hangs only: servers, Ray Serve and coturn start slowly on a loaded machine.
pytestmark = pytest.mark.timeout(480)

GRADIENT = ROOT / "examples" / "gradient"
ANNOUNCED = "203.0.113.7"  # TEST-NET-3: never routed, so only the advertisement can use it
LOOPBACK = HostCandidatePolicy(loopback_only=True)
# Bounds on waits (not speeds): how long a broken server gets before the case fails.
WAIT_S = 60.0
# The same for a Ray Serve replica, which starts slower still.
SERVE_WAIT_S = 120.0


def candidates(sdp: str) -> list[dict]:
    """The `a=candidate` lines of an SDP: address, port and type."""
    found = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            found.append({"address": parts[4], "port": int(parts[5]), "type": parts[7]})
    return found


def assert_announced_in_range(sdp: str, port_range: tuple[int, int]) -> None:
    found = candidates(sdp)
    hosts = [c for c in found if c["type"] == "host"]
    assert hosts, found
    for candidate in hosts:
        assert candidate["address"] == ANNOUNCED, found
        assert port_range[0] <= candidate["port"] <= port_range[1], (port_range, found)
    # The connection line names the default candidate: the announced one too.
    assert f"c=IN IP4 {ANNOUNCED}" in sdp


async def frames_arrive(count_frames, at_least: int = 10) -> None:
    start = count_frames()
    deadline = time.monotonic() + WAIT_S
    while count_frames() - start < at_least:
        assert time.monotonic() < deadline, f"only {count_frames() - start} frames arrived"
        await asyncio.sleep(0.05)  # the poll interval; the deadline is the bound


# --------------------------------------------------------------------------- announced address


async def test_reactor_run_announces_its_address_on_ports_of_its_range(reactor_run, monkeypatch):
    port_range = free_udp_range(20)
    monkeypatch.setenv("REACTOR_ANNOUNCED_ADDRESS", ANNOUNCED)
    monkeypatch.setenv("REACTOR_UDP_PORT_RANGE", f"{port_range[0]}-{port_range[1]}")
    run = reactor_run(GRADIENT)
    # The client sends its checks to 203.0.113.7 in vain, but aiortc's answerer also
    # checks from its real socket: the client learns it as a peer-reflexive candidate
    # and the session connects anyway.
    client = await connect(run.url)
    try:
        assert_announced_in_range(client.peer.pc.remoteDescription.sdp, port_range)
        await frames_arrive(lambda: client.peer.frames_received)
        # The client on this machine kept to loopback (its own connection's policy).
        offered = candidates(client.peer.pc.localDescription.sdp)
        assert offered and {c["address"] for c in offered} == {"127.0.0.1"}, offered
    finally:
        await client.close()


def test_what_a_policy_binds():
    interfaces = ["10.0.0.5", "fd00::2"]
    assert HostCandidatePolicy().bind_addresses(interfaces) == interfaces
    assert LOOPBACK.bind_addresses(interfaces) == ["127.0.0.1"]
    assert HostCandidatePolicy(announced_address=ANNOUNCED).bind_addresses(interfaces) == ["0.0.0.0"]
    assert HostCandidatePolicy(announced_address="2001:db8::7").bind_addresses(interfaces) == ["::"]
    assert HostCandidatePolicy(True, "2001:db8::7").bind_addresses(interfaces) == ["::1"]
    assert HostCandidatePolicy.from_settings(WebRTCSettings()) is None
    relay = WebRTCSettings(loopback_candidates=True, ice_transport_policy="relay",
                           ice_servers=[{"urls": "turn:127.0.0.1:3478", "secret": "s"}])
    assert HostCandidatePolicy.from_settings(relay) is None
    assert HostCandidatePolicy.from_settings(
        WebRTCSettings(loopback_candidates=True, udp_port_range="50000-50009")
    ) == HostCandidatePolicy(True, None, (50000, 50009))


async def test_policies_are_per_connection_not_per_process():
    """Two peer connections of one process, one loopback-only: the other still
    gathers as aioice does (every interface but loopback)."""

    async def offered(policy):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTransceiver("video", direction="recvonly")
            pc.createDataChannel("data")
            if policy is not None:
                policy.apply(pc)
            await pc.setLocalDescription(await pc.createOffer())
            return candidates(pc.localDescription.sdp)
        finally:
            await pc.close()

    loopback, default = await asyncio.gather(offered(LOOPBACK), offered(None))
    assert loopback and {c["address"] for c in loopback} == {"127.0.0.1"}, loopback
    assert "127.0.0.1" not in {c["address"] for c in default}, default
    port_range = free_udp_range(5)
    ranged = await offered(HostCandidatePolicy(port_range=port_range))
    assert ranged == [] or all(port_range[0] <= c["port"] <= port_range[1] for c in ranged), ranged


async def test_a_malformed_node_variable_fails_reactor_run_at_start(reactor_run, monkeypatch):
    monkeypatch.setenv("REACTOR_UDP_PORT_RANGE", "fifty-thousand")
    with pytest.raises(RuntimeError) as caught:
        reactor_run(GRADIENT)
    assert "exited with" in str(caught.value)
    assert "REACTOR_UDP_PORT_RANGE='fifty-thousand'" in str(caught.value), str(caught.value)


async def test_a_serve_replica_announces_its_address_on_ports_of_its_range(ray_serve, coturn):
    port_range = free_udp_range(20)
    url = ray_serve.deploy("announced", {
        # App-wide servers: the ingress mints each session's TURN credentials.
        "ice_servers": [{"urls": [f"stun:127.0.0.1:{coturn.port}"]},
                        {"urls": [coturn.url], "secret": TURN_SECRET}],
        "models": [
            {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1,
             "warm_spares": 0, "cpus_per_replica": 0.5,
             # Not loopback: the replica binds the wildcard address, as on a NATed node.
             "webrtc": {"announced_address": ANNOUNCED,
                        "udp_port_range": f"{port_range[0]}-{port_range[1]}"}},
        ]})
    model = f"{url}/models/gradient"
    try:
        client = await connect(model)
        try:
            answer = client.peer.pc.remoteDescription.sdp
            assert_announced_in_range(answer, port_range)
            # The replica minted its own credentials: coturn gave it a relay.
            assert "relay" in {c["type"] for c in candidates(answer)}, answer
            await frames_arrive(lambda: client.peer.frames_received)
        finally:
            await client.close()
        minted = []
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            for _ in range(2):
                deadline = time.monotonic() + SERVE_WAIT_S
                while (reply := await http.post(f"{model}/start_session", json={})).status_code != 200:
                    assert time.monotonic() < deadline, f"no session on the replica: {reply.text}"
                    await asyncio.sleep(0.2)  # the poll interval; the deadline is the bound
                sid = reply.json()["session_id"]
                stun, turn_server = await fetch_ice_servers(http, model, sid)
                await http.post(f"{model}/stop_session", json={"session_id": sid})
                assert stun == {"uris": [f"stun:127.0.0.1:{coturn.port}"]}
                assert turn_server["uris"] == [coturn.url] and sid not in str(turn_server)
                minted.append(turn_server["credentials"])
        assert minted[0]["username"] != minted[1]["username"]
        # What the ingress handed out is what coturn takes.
        await coturn.allocate(minted[1]["username"], minted[1]["password"])
    finally:
        ray_serve.delete("announced")


# --------------------------------------------------------------------------- port range


async def test_a_full_port_range_refuses_the_next_offer_and_the_live_session_goes_on(
    reactor_run, monkeypatch
):
    # Two servers on one node share its one-port range: the first session takes it.
    port = free_udp_range(1)[0]
    monkeypatch.setenv("REACTOR_UDP_PORT_RANGE", f"{port}-{port}")
    first_server, second_server = reactor_run(GRADIENT), reactor_run(GRADIENT)
    first = await connect(first_server.url)
    live_closed = False
    try:
        assert {c["port"] for c in candidates(first.peer.pc.remoteDescription.sdp)} == {port}
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            descriptor = await start_session(http, second_server.url)
            sid = descriptor["session_id"]
            peer = ClientPeer(descriptor["capabilities"], host_candidates=LOOPBACK)
            try:
                with pytest.raises(SessionRefused) as caught:
                    await peer.connect(offer_signal(http, second_server.url, sid, "POST", WAIT_S),
                                       timeout=WAIT_S)
                assert caught.value.status == 503, caught.value
                assert f"udp_port_range {port}-{port}" in str(caught.value), caught.value
                poll = await http.get(
                    f"{second_server.url}/sessions/{sid}/transport/webrtc/sdp_params")
                assert poll.status_code == 503 and int(poll.headers["Retry-After"]) >= 1, poll.text

                # The live session never noticed.
                await frames_arrive(lambda: first.peer.frames_received, at_least=20)
                assert not first.closed

                # Its end frees the port: the refused session's next offer gets it.
                await first.close()
                live_closed = True
                deadline = time.monotonic() + WAIT_S
                while True:
                    try:
                        await peer.connect(
                            offer_signal(http, second_server.url, sid, "POST", WAIT_S),
                            timeout=WAIT_S)
                        break
                    except SessionRefused as exc:
                        assert exc.status == 503, exc
                        assert time.monotonic() < deadline, f"the port was not freed: {exc}"
                        await asyncio.sleep(0.5)  # the retry interval; the deadline is the bound
                assert {c["port"] for c in candidates(peer.pc.remoteDescription.sdp)} == {port}
                await frames_arrive(lambda: peer.frames_received)
            finally:
                await peer.close()
    finally:
        if not live_closed:
            await first.close()


# --------------------------------------------------------------------------- relay only, coturn


async def test_relay_only_answers_relay_candidates_and_streams_through_coturn(
    reactor_run, relay_model, coturn
):
    run = reactor_run(relay_model)
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        descriptor = await start_session(http, run.url)
        sid = descriptor["session_id"]
        ice = await fetch_ice_servers(http, run.url, sid)
        assert [s["uris"] for s in ice] == [[coturn.url]]
        username = ice[0]["credentials"]["username"]
        # An upper bound read after the minting: a slow machine only widens it.
        assert int(username.split(":")[0]) <= time.time() + 600 and sid not in username
        # The client is relay-only too: every packet both ways goes through coturn,
        # on the credentials the route minted for this session.
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice,
                          ice_transport_policy="relay")
        try:
            await peer.connect(offer_signal(http, run.url, sid, "POST", WAIT_S), timeout=WAIT_S)
            answer = candidates(peer.pc.remoteDescription.sdp)
            offer = candidates(peer.pc.localDescription.sdp)
            assert answer and {c["type"] for c in answer} == {"relay"}, answer
            assert offer and {c["type"] for c in offer} == {"relay"}, offer
            await frames_arrive(lambda: peer.frames_received)
        finally:
            await peer.close()

        # A second session gets credentials of its own.
        await http.post(f"{run.url}/stop_session", json={"session_id": sid})
        deadline = time.monotonic() + WAIT_S
        while (reply := await http.post(f"{run.url}/start_session", json={})).status_code == 409:
            assert time.monotonic() < deadline, f"the stopped session kept the model: {reply.text}"
            await asyncio.sleep(0.2)  # the poll interval; the deadline is the bound
        other = reply.json()["session_id"]
        again = await fetch_ice_servers(http, run.url, other)
        assert again[0]["credentials"]["username"] != username
        await http.post(f"{run.url}/stop_session", json={"session_id": other})


async def test_coturn_takes_minted_credentials_and_refuses_wrong_or_expired_ones(coturn):
    # 60 s is the shortest TTL allowed; the allocation comes right after the minting.
    good = mint_turn_credentials(TURN_SECRET, 60, "good")
    await coturn.allocate(good.username, good.credential)
    wrong_secret = mint_turn_credentials("not-the-secret", 60, "wrong")
    expired = mint_turn_credentials(TURN_SECRET, 60, "expired", now=time.time() - 120)
    tampered = mint_turn_credentials(TURN_SECRET, 60, "tampered")
    for username, password in (
        (wrong_secret.username, wrong_secret.credential),
        (expired.username, expired.credential),
        # A later expiry on a credential minted for an earlier one.
        (f"{tampered.expires_at + 86400}:tampered", tampered.credential),
    ):
        with pytest.raises(TransactionFailed) as caught:
            await coturn.allocate(username, password)
        assert "401" in str(caught.value), (username, caught.value)


async def test_a_port_range_and_an_announced_address_keep_stun_and_turn_candidates(
    reactor_run, coturn, tmp_path, monkeypatch
):
    """The host-candidate policy replaces aioice's host gathering only: the STUN
    server still yields a server-reflexive candidate for the announced host
    candidate, and the TURN server a relayed one."""
    model = tmp_path / "gradient"
    shutil.copytree(GRADIENT, model, ignore=shutil.ignore_patterns("__pycache__"))
    with open(model / "config.yml", "a") as config:
        config.write(
            "\nwebrtc:\n  ice_servers:\n"
            f"    - urls: [\"stun:127.0.0.1:{coturn.port}\"]\n"
            f"    - urls: [\"{coturn.url}\"]\n"
            f"      secret: {TURN_SECRET}\n"
        )
    port_range = free_udp_range(20)
    monkeypatch.setenv("REACTOR_ANNOUNCED_ADDRESS", ANNOUNCED)
    monkeypatch.setenv("REACTOR_UDP_PORT_RANGE", f"{port_range[0]}-{port_range[1]}")
    run = reactor_run(model)
    client = await connect(run.url)
    try:
        answer = client.peer.pc.remoteDescription.sdp
        assert_announced_in_range(answer, port_range)
        found = candidates(answer)
        assert {c["type"] for c in found} == {"host", "srflx", "relay"}, found
        srflx = [line for line in answer.splitlines() if " typ srflx " in line]
        assert all(f"raddr {ANNOUNCED} " in line for line in srflx), srflx
        await frames_arrive(lambda: client.peer.frames_received)
    finally:
        await client.close()
