"""A client that declares data-channel chunking, as the official SDK does: the answer
declares it back, and every message both ways goes as frames, over real aiortc on
127.0.0.1. Messages split over several frames arrive whole; one past our limit, or a
frame that breaks the framing, is dropped and the session goes on."""

from __future__ import annotations

import pytest
from bare_peer import open_bare_peer, wait_for

from reactor_serve.protocol.channel_codec import MAX_MESSAGE_BYTES
from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, data_pb2
from reactor_serve.rtc import dc_chunking
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.peer_session import PeerSession


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


# The server and aiortc share a loaded machine with the test: waits are for a
# condition, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def command(request_id: str, **data) -> bytes:
    message = data_pb2.DataClientMessage(request_id=request_id, kind=common_pb2.MESSAGE_KIND_REQUEST)
    message.command.type = "set_brightness"
    message.command.data.update(data)
    return message.SerializeToString()


def answered(client, request_id):
    return [r for label in ("data", "control") for r in client.replies[label]
            if not isinstance(r, str) and r.request_id == request_id]


async def test_a_chunked_connection_frames_every_message_both_ways(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = await open_bare_peer(peer, chunking=64 * 1024 * 1024)
    try:
        assert client.chunked
        assert dc_chunking.offered_limit(client.answer_sdp) == MAX_MESSAGE_BYTES

        schema = control_pb2.ControlClientMessage(request_id="ctrl_1")
        schema.request_schema.SetInParent()
        client.send("control", schema.SerializeToString())
        await wait_for(lambda: answered(client, "ctrl_1"), DEADLINE_S, "the schema")
        [reply] = answered(client, "ctrl_1")
        assert reply.WhichOneof("payload") == "model_schema"

        # A command in many small frames arrives whole and is applied.
        padded = command("data_1", brightness=0.5, note="x" * 30_000)
        client.send("data", padded, frame_bytes=1024)
        await wait_for(lambda: answered(client, "data_1"), DEADLINE_S, "the framed command's answer")
        [reply] = answered(client, "data_1")
        assert reply.error.code == "BAD_REQUEST" and "note" in reply.error.message

        client.send("data", command("data_2", brightness=0.5), frame_bytes=8)
        await wait_for(lambda: answered(client, "data_2"), DEADLINE_S, "the small-framed command")
        assert answered(client, "data_2")[0].WhichOneof("payload") is None
        await wait_for(lambda: host.model.state.brightness == 0.5, DEADLINE_S, "the brightness")

        # Past our limit, and frames that break the framing: dropped, nothing ends.
        ignored = peer.inbound.counters.ignored
        client.send("data", command("data_3", note="y" * (MAX_MESSAGE_BYTES + 10)))
        client.data.send("a text frame")
        client.data.send(b"\x80bad version")
        client.send("data", command("data_4", brightness=1.5))
        await wait_for(lambda: answered(client, "data_4"), DEADLINE_S, "a command after the junk")
        assert answered(client, "data_3") == []
        assert peer.inbound.counters.ignored == ignored + 3
        assert client.broken == []
        start = client.frames
        await wait_for(lambda: client.frames >= start + 5, DEADLINE_S, "video after the junk")
    finally:
        await client.close()
        await peer.close()


async def test_a_client_that_does_not_declare_chunking_gets_plain_messages(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = await open_bare_peer(peer)
    try:
        assert not client.chunked and dc_chunking.offered_limit(client.answer_sdp) is None
        client.data.send(command("data_1", brightness=0.25))
        await wait_for(lambda: answered(client, "data_1"), DEADLINE_S, "the command's answer")
        assert answered(client, "data_1")[0].WhichOneof("payload") is None
    finally:
        await client.close()
        await peer.close()
