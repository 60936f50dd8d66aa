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


async def quiet(client, seconds: float) -> int:
    """How many frames arrived in `seconds`, once those in flight are through."""
    await asyncio.sleep(0.5)
    start = client.frames
    await asyncio.sleep(seconds)
    return client.frames - start


@pytest.mark.parametrize("first, message", [(None, v1), (V0_PING, v0)], ids=["v1", "v0"])
async def test_a_paused_track_stops_and_resumes(host_of, gradient_dir, first, message):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = await open_bare_peer(peer, *(() if first is None else (first,)))
    try:
        client.control.send(message("pause_track"))
        assert await quiet(client, 1.5) == 0
        client.control.send(message("resume_track"))
        start = client.frames
        await wait_for(lambda: client.frames >= start + 10, 15, "video after resume_track")
        assert client.replies["control"] == []  # notifications: nothing answers them
    finally:
        await client.close()
    # A new connection, as after a reconnect, sends every track again.
    again = await open_bare_peer(peer, *(() if first is None else (first,)))
    try:
        start = again.frames
        await wait_for(lambda: again.frames >= start + 5, 15, "video on the new connection")
    finally:
        await again.close()
        await peer.close()
