"""A client pausing and resuming the video it receives: the server stops sending the
track (the client decodes nothing more) and sends again on resume; a new connection
starts with every track flowing. On wire v1 and v0, over real aiortc on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest
from bare_peer import open_bare_peer, wait_for

from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.peer_session import PeerSession

V0_PING = json.dumps({"type": "notification", "event": "ping", "data": {}})


def v1(event: str) -> bytes:
    message = control_pb2.ControlClientMessage(kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    getattr(message, event).name = "main_video"
    return message.SerializeToString()


def v0(event: str) -> str:
    return json.dumps({"type": "notification", "event": event, "data": {"name": "main_video"}})


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


# Server, aiortc and the test share a loaded machine: waits are for a condition,
# bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def counting_sends(peer):
    """The server's main_video track of the current connection, and [how many frames
    its encoder has taken since] (what the server sends), made to count them."""
    [track] = [t for t in peer._pc_tracks if getattr(t, "name", None) == "main_video"]
    taken = [0]
    recv = track.recv

    async def counted():
        frame = await recv()
        taken[0] += 1
        return frame

    track.recv = counted
    return track, taken


async def sends_nothing_while_paused(track, taken) -> int:
    """Once the server has the pause, how many frames its encoder took in a while.
    Counted where they are sent, so frames still in flight to the client (which a
    loaded machine delivers late) do not count."""
    await wait_for(lambda: track.paused, DEADLINE_S, "the server to pause the track")
    # The frame offered before the pause may still be on its way to the encoder.
    await wait_for(lambda: not track._fresh.is_set(), DEADLINE_S,
                   "the encoder to take the last frame offered before the pause")
    start = taken[0]
    # A negative check: a busy machine can only send less in it, never more.
    await asyncio.sleep(1.5)
    return taken[0] - start


@pytest.mark.parametrize("first, message", [(None, v1), (V0_PING, v0)], ids=["v1", "v0"])
async def test_a_paused_track_stops_and_resumes(host_of, gradient_dir, first, message):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = await open_bare_peer(peer, *(() if first is None else (first,)))
    try:
        track, taken = counting_sends(peer)
        # The count sees the frames the server sends, so a zero later means something.
        await wait_for(lambda: taken[0] >= 3, DEADLINE_S, "frames sent before the pause")
        client.control.send(message("pause_track"))
        assert await sends_nothing_while_paused(track, taken) == 0
        client.control.send(message("resume_track"))
        start = client.frames
        await wait_for(lambda: client.frames >= start + 10, DEADLINE_S, "video after resume_track")
        assert client.replies["control"] == []  # notifications: nothing answers them
    finally:
        await client.close()
    # A new connection, as after a reconnect, sends every track again.
    again = await open_bare_peer(peer, *(() if first is None else (first,)))
    try:
        start = again.frames
        await wait_for(lambda: again.frames >= start + 5, DEADLINE_S, "video on the new connection")
    finally:
        await again.close()
        await peer.close()
