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

# Bounds the whole test only as a last resort: each wait inside names what it awaited.
pytestmark = pytest.mark.timeout(600)

GRADIENT = "examples/gradient"


# Servers, media and reconnects on a loaded machine: waits are for what the frames and
# messages show, bounded only to fail with a message.
DEADLINE_S = 60.0
# Below this mean the frame is the black the server sends before the model's first
# frame of a connection; the gradient at the dimmest brightness these tests set is
# well above it.
BLACK = 5.0
# Tests that count reconnects of another cause: a loaded machine may hold the server's
# stats back past the default silence timeout, and the reconnect that would start is
# not the one they look for (the silence itself has its own test).
PATIENT = {"silence_timeout_s": DEADLINE_S}


def mean(frame):
    return float(np.asarray(frame.image).mean())


async def frame_where(client, predicate, what, timeout=DEADLINE_S):
    """The first frame from now on whose mean pixel satisfies `predicate`."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no frame showed {what}"
        frame = await client.next_frame(timeout=remaining)
        if predicate(mean(frame)):
            return frame


async def painted_from_now(client, count=5):
    """`count` frames the model painted, received from now on (so none from before a
    reconnect, and not the black a new connection may show before the model's first
    frame reaches it)."""
    frames = [await frame_where(client, lambda m: m > BLACK, "the model's picture")]
    while len(frames) < count:
        frame = await client.next_frame(timeout=DEADLINE_S)
        if mean(frame) > BLACK:
            frames.append(frame)
    return frames


async def darken(client):
    """Set the gradient's brightness to 0.2 and wait until the picture shows it;
    returns the mean pixel before and after."""
    # Until the model's first frame, the client sees black: on a loaded machine, for
    # more than a few frames.
    normal = mean(await frame_where(client, lambda m: m > 60, "the gradient at full brightness"))
    client.send_command("set_brightness", {"brightness": 0.2})
    dark = mean(await frame_where(client, lambda m: BLACK < m < normal * 0.4,
                                  "the picture darkened after set_brightness 0.2"))
    return normal, dark


def session_ended_messages(client):
    return [m["data"]["data"] for m in client.peer.messages
            if m.get("scope") == "runtime" and m["data"].get("type") == "sessionEnded"]


def hold_reconnects(client) -> asyncio.Event:
    """Make the client's reconnect attempts wait, before their own pause, until the
    returned event is set."""
    supervisor = client._supervisor
    pause = supervisor._sleep
    release = asyncio.Event()

    async def held(seconds):
        await release.wait()
        await pause(seconds)

    supervisor._sleep = held
    return release


async def describe(url, session_id):
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        return await http.get(f"{url}/session", params={"session_id": session_id})


async def test_cut_transport_reconnects_by_itself_and_the_model_keeps_its_state(reactor_run):
    run = reactor_run(GRADIENT)
    states = []
    client = await connect(run.url, reconnect=ReconnectPolicy(**PATIENT),
                           on_state=lambda state, detail: states.append((state, detail)))
    try:
        assert client.state == ClientState.STREAMING
        normal, _ = await darken(client)
        old_pc = client.peer.pc
        # The network drops: the peer connection goes away underneath the client,
        # with no stop_session.
        await old_pc.close()
        await client.peer.wait_for(lambda: client.reconnects >= 1 or client.closed, DEADLINE_S,
                                   "a reconnect")
        assert not client.closed, f"the session ended instead: {session_ended_messages(client)}"
        assert client.state == ClientState.STREAMING
        assert client.peer.pc is not old_pc
        reconnecting = [d for s, d in states if s == ClientState.RECONNECTING]
        assert reconnecting and reconnecting[0]["attempt"] == 1, states
        assert states[-1] == (ClientState.STREAMING, {"reconnects": 1}), states
        # The same session, and the model kept its state: the model's frames on the new
        # connection are still dark.
        after = await painted_from_now(client, 10)
        assert all(mean(f) < normal * 0.4 for f in after), [round(mean(f)) for f in after]
        assert (await describe(run.url, client.session_id)).json()["state"] == "streaming"
        # Commands go over the new connection.
        client.send_command("set_brightness", {"brightness": 1.0})
        await frame_where(client, lambda m: m > normal * 0.8,
                          "the picture brightened over the new connection")
        assert session_ended_messages(client) == []
    finally:
        await client.close()
    # close() stopped the session by its id, and did not reconnect.
    assert client.state == ClientState.ENDED and client.end_reason == "client_closed"
    assert client.reconnects == 1
    body = (await describe(run.url, client.session_id)).json()
    assert body["state"] == "ended" and body.get("end_reason") == "client_closed", body
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        assert (await http.get(f"{run.url}/health")).json()["live_sessions"] == 0


async def test_a_silent_data_channel_counts_as_a_lost_transport(reactor_run):
    # The connection still looks fine to ICE, but nothing arrives (a stalled path):
    # with stats expected every second, the client reconnects on its own.
    run = reactor_run(GRADIENT)
    # The silence timeout is the product's setting under test: the test waits for the
    # state it leads to, never for a time.
    client = await connect(run.url, reconnect=ReconnectPolicy(silence_timeout_s=2.0))
    try:
        normal, _ = await darken(client)
        await client.peer.wait_for(lambda: client.peer.stats_seen, DEADLINE_S,
                                   "the server's stats")
        old_pc = client.peer.pc
        reconnects = client.reconnects
        client.peer._on_message = lambda raw, channel=None: None  # drop everything inbound
        await client.wait_state(ClientState.RECONNECTING, timeout=DEADLINE_S)
        del client.peer._on_message
        await client.peer.wait_for(
            lambda: client.reconnects > reconnects or client.closed, DEADLINE_S,
            "a reconnect after the silence")
        assert not client.closed, session_ended_messages(client)
        assert client.peer.pc is not old_pc
        after = await painted_from_now(client, 10)
        assert all(mean(f) < normal * 0.4 for f in after), [round(mean(f)) for f in after]
    finally:
        await client.close()


async def test_a_stop_by_another_request_is_reported_as_session_ended(reactor_run):
    run = reactor_run(GRADIENT)
    states = []
    client = await connect(run.url, reconnect=ReconnectPolicy(**PATIENT),
                           on_state=lambda state, detail: states.append((state, detail)))
    try:
        await client.next_frame(timeout=DEADLINE_S)
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            reply = await http.post(f"{run.url}/stop_session",
                                    json={"session_id": client.session_id})
            assert reply.status_code == 200
        assert await client.wait_closed(timeout=DEADLINE_S) == "client_closed"
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
        await client.peer.wait_for(lambda: client.peer.stats_seen, DEADLINE_S,
                                   "the server's stats")
        run.process.send_signal(signal.SIGKILL)
        run.process.wait(DEADLINE_S)
        # Which way the client found the end is in its message ("refuses connections",
        # not giving up on an unreachable network), so the wait itself is not timed.
        reason = await client.wait_closed(timeout=DEADLINE_S)
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
    client = await connect(run.url, reconnect=ReconnectPolicy(first_delay_s=1.0, **PATIENT))
    try:
        await client.next_frame(timeout=DEADLINE_S)
        # The reconnect's pause lasts until the session is stopped: its offer comes after
        # the stop however long the stop takes, which is what this test is about.
        stopped = hold_reconnects(client)
        await client.peer.pc.close()
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            reply = await http.post(f"{run.url}/stop_session",
                                    json={"session_id": client.session_id})
            assert reply.status_code == 200
        stopped.set()
        reason = await client.wait_closed(timeout=DEADLINE_S)
        assert reason == "client_closed"
        [ended] = session_ended_messages(client)
        assert ended["reason"] == "client_closed"
        assert client.reconnects == 0
    finally:
        await client.close()


async def test_close_during_a_reconnect_stops_the_session_and_does_not_come_back(reactor_run):
    run = reactor_run(GRADIENT)
    client = await connect(run.url, reconnect=ReconnectPolicy(first_delay_s=1.5, **PATIENT))
    await client.next_frame(timeout=DEADLINE_S)
    # The first attempt waits for the close, so the close lands during the reconnect
    # however slowly this test gets to it.
    closed = hold_reconnects(client)
    await client.peer.pc.close()
    await client.wait_state(ClientState.RECONNECTING, timeout=DEADLINE_S)
    await client.close()
    closed.set()
    assert client.state == ClientState.ENDED and client.end_reason == "client_closed"
    # A negative check: nothing may reconnect after the close. A busy machine can only
    # make an attempt come later, never make one appear.
    await asyncio.sleep(2.0)
    assert client.reconnects == 0
    assert client.peer.pc is None or client.peer.pc.connectionState == "closed"
    body = (await describe(run.url, client.session_id)).json()
    assert body["state"] == "ended", body
