"""The Python client survives a lost transport and always says why its session ended.

Against real `reactor run` subprocesses (and one Serve replica), over loopback WebRTC.
The server side these rely on (docs/protocol.md, "Reconnect"): a session whose transport is
lost without `stop_session` stays `orphaned` for its reconnect grace and a new offer
resumes it; `GET /session?session_id=` answers an ended session with `state: "ended"`,
`end_reason` and `end_message`.
"""

import asyncio
import signal
import time

import httpx
import numpy as np
import pytest

from reactor_serve.client import ClientState, ReconnectPolicy, connect

pytestmark = pytest.mark.timeout(120)

GRADIENT = "examples/gradient"


def mean(frame):
    return float(np.asarray(frame.image).mean())


async def frames_from_now(client, count=5, timeout=15.0):
    """`count` frames received from now on (so none from before a reconnect)."""
    frames = []
    for _ in range(count):
        frames.append(await client.next_frame(timeout=timeout))
    return frames


async def darken(client):
    """Set the gradient's brightness to 0.2 and wait until the picture shows it;
    returns the mean pixel before and after."""
    # Until the model's first frame, the client sees black: on a loaded machine, for
    # more than a few frames.
    deadline = time.monotonic() + 30
    while (normal := mean(await client.next_frame())) <= 60:
        assert time.monotonic() < deadline, f"the gradient stayed black (mean {normal:.1f})"
    client.send_command("set_brightness", {"brightness": 0.2})
    for _ in range(90):
        dark = mean(await client.next_frame())
        if dark < normal * 0.4:
            return normal, dark
    raise AssertionError("the picture did not darken after set_brightness 0.2")


def session_ended_messages(client):
    return [m["data"]["data"] for m in client.peer.messages
            if m.get("scope") == "runtime" and m["data"].get("type") == "sessionEnded"]


async def describe(url, session_id):
    async with httpx.AsyncClient() as http:
        return await http.get(f"{url}/session", params={"session_id": session_id})


async def test_cut_transport_reconnects_by_itself_and_the_model_keeps_its_state(reactor_run):
    run = reactor_run(GRADIENT)
    states = []
    client = await connect(run.url, on_state=lambda state, detail: states.append((state, detail)))
    try:
        assert client.state == ClientState.STREAMING
        normal, _ = await darken(client)
        old_pc = client.peer.pc
        # The network drops: the peer connection goes away underneath the client,
        # with no stop_session.
        await old_pc.close()
        await client.peer.wait_for(lambda: client.reconnects >= 1 or client.closed, 30,
                                   "a reconnect")
        assert not client.closed, f"the session ended instead: {session_ended_messages(client)}"
        assert client.state == ClientState.STREAMING
        assert client.peer.pc is not old_pc
        reconnecting = [d for s, d in states if s == ClientState.RECONNECTING]
        assert reconnecting and reconnecting[0]["attempt"] == 1, states
        assert states[-1] == (ClientState.STREAMING, {"reconnects": 1}), states
        # The same session, and the model kept its state: frames of the new connection
        # are still dark.
        after = await frames_from_now(client, 10)
        assert all(mean(f) < normal * 0.4 for f in after), [round(mean(f)) for f in after]
        assert (await describe(run.url, client.session_id)).json()["state"] == "streaming"
        # Commands go over the new connection.
        client.send_command("set_brightness", {"brightness": 1.0})
        for _ in range(90):
            if mean(await client.next_frame()) > normal * 0.8:
                break
        else:
            raise AssertionError("the picture did not brighten over the new connection")
        assert session_ended_messages(client) == []
    finally:
        await client.close()
    # close() stopped the session by its id, and did not reconnect.
    assert client.state == ClientState.ENDED and client.end_reason == "client_closed"
    assert client.reconnects == 1
    body = (await describe(run.url, client.session_id)).json()
    assert body["state"] == "ended" and body.get("end_reason") == "client_closed", body
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{run.url}/health")).json()["live_sessions"] == 0


async def test_a_silent_data_channel_counts_as_a_lost_transport(reactor_run):
    # The connection still looks fine to ICE, but nothing arrives (a stalled path):
    # with stats expected every second, the client reconnects on its own.
    run = reactor_run(GRADIENT)
    client = await connect(run.url, reconnect=ReconnectPolicy(silence_timeout_s=2.0))
    try:
        normal, _ = await darken(client)
        await client.peer.wait_for(lambda: client.peer.stats_seen, 10, "the server's stats")
        old_pc = client.peer.pc
        client.peer._on_message = lambda raw, channel=None: None  # drop everything inbound
        await client.wait_state(ClientState.RECONNECTING, timeout=15)
        del client.peer._on_message
        await client.peer.wait_for(lambda: client.reconnects >= 1 or client.closed, 30,
                                   "a reconnect")
        assert not client.closed, session_ended_messages(client)
        assert client.peer.pc is not old_pc
        after = await frames_from_now(client, 10)
        assert all(mean(f) < normal * 0.4 for f in after), [round(mean(f)) for f in after]
    finally:
        await client.close()


async def test_a_stop_by_another_request_is_reported_as_session_ended(reactor_run):
    run = reactor_run(GRADIENT)
    states = []
    client = await connect(run.url, on_state=lambda state, detail: states.append((state, detail)))
    try:
        await client.next_frame()
        async with httpx.AsyncClient() as http:
            reply = await http.post(f"{run.url}/stop_session",
                                    json={"session_id": client.session_id})
            assert reply.status_code == 200
        assert await client.wait_closed(timeout=15) == "client_closed"
        assert [m["reason"] for m in session_ended_messages(client)] == ["client_closed"]
        assert client.state == ClientState.ENDED
        assert states[-1][0] == ClientState.ENDED and states[-1][1]["reason"] == "client_closed"
        # The server ended it on purpose: no attempt to get it back.
        assert client.reconnects == 0
        assert ClientState.RECONNECTING not in [s for s, _ in states]
    finally:
        await client.close()


async def test_a_killed_server_is_reported_as_the_end_of_the_session(reactor_run):
    # Nobody is left to send sessionEnded: the client notices the silence, finds the
    # server gone, and says so instead of hanging.
    run = reactor_run(GRADIENT)
    client = await connect(run.url)
    try:
        await client.peer.wait_for(lambda: client.peer.stats_seen, 10, "the server's stats")
        run.process.send_signal(signal.SIGKILL)
        run.process.wait(10)
        # Bounded well below the 30 s the client would try for an unreachable network.
        reason = await client.wait_closed(timeout=20)
        assert reason == "error"
        [ended] = session_ended_messages(client)
        assert ended["reason"] == "error" and ended["detected_by"] == "client"
        assert "refuses connections" in ended["message"], ended
        assert client.state == ClientState.ENDED and client.reconnects == 0
        with pytest.raises(ConnectionError):
            client.send_command("set_brightness", {"brightness": 1.0})
    finally:
        await client.close()


async def test_an_offer_on_an_ended_session_ends_the_client_with_the_servers_reason(reactor_run):
    # The session ends while the client is away (its transport cut and the session
    # stopped before it comes back): the reconnect learns why from the server.
    run = reactor_run(GRADIENT)
    client = await connect(run.url, reconnect=ReconnectPolicy(first_delay_s=1.0))
    try:
        await client.next_frame()
        await client.peer.pc.close()
        async with httpx.AsyncClient() as http:
            await http.post(f"{run.url}/stop_session", json={"session_id": client.session_id})
        reason = await client.wait_closed(timeout=20)
        assert reason == "client_closed"
        [ended] = session_ended_messages(client)
        assert ended["reason"] == "client_closed"
        assert client.reconnects == 0
    finally:
        await client.close()


async def test_close_during_a_reconnect_stops_the_session_and_does_not_come_back(reactor_run):
    run = reactor_run(GRADIENT)
    client = await connect(run.url, reconnect=ReconnectPolicy(first_delay_s=1.5))
    await client.next_frame()
    await client.peer.pc.close()
    await client.wait_state(ClientState.RECONNECTING, timeout=10)
    await client.close()
    assert client.state == ClientState.ENDED and client.end_reason == "client_closed"
    await asyncio.sleep(2.0)  # past the first attempt it would have made
    assert client.reconnects == 0
    assert client.peer.pc is None or client.peer.pc.connectionState == "closed"
    body = (await describe(run.url, client.session_id)).json()
    assert body["state"] == "ended", body
