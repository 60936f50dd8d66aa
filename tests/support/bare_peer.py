"""A bare aiortc client of a `PeerSession`, on 127.0.0.1: one recvonly video track and
the "data" and "control" channels, speaking whatever its first frame says (wire v1
protobuf, as the official Python SDK does, or v0 JSON), chunked when it declares
data-channel chunking. It counts the video frames it decodes and keeps every message
the server sends, decoded as v1 where they are bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription

from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, data_pb2
from reactor_serve.protocol.wire_version import Wire
from reactor_serve.rtc import dc_chunking

__all__ = ["BarePeer", "V1_PING", "open_bare_peer", "wait_for"]


def _v1_ping() -> bytes:
    ping = control_pb2.ControlClientMessage(kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    ping.ping.SetInParent()
    return ping.SerializeToString()


V1_PING = _v1_ping()


CONNECT_S = 60.0


async def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline


@dataclass
class BarePeer:
    pc: RTCPeerConnection
    data: Any
    control: Any
    replies: dict[str, list[Any]] = field(default_factory=lambda: {"data": [], "control": []})
    frames: int = 0
    receiving: asyncio.Future[None] | None = None
    # Both sides declared chunking: every message goes as frames (rtc/dc_chunking.py).
    chunked: bool = False
    answer_sdp: str = ""
    # Frames of the server's that broke the framing.
    broken: list[str] = field(default_factory=list)

    def send(self, label: str, message: str | bytes, frame_bytes: int = dc_chunking.FRAME_BYTES) -> None:
        """One message on channel `label`, framed on a chunked connection."""
        channel = getattr(self, label)
        parts = dc_chunking.frames(message, frame_bytes) if self.chunked else [message]
        for part in parts:
            channel.send(part)

    async def close(self) -> None:
        if self.receiving is not None:
            self.receiving.cancel()
        await self.pc.close()


async def open_bare_peer(
    peer: Any, first_frame: bytes | str = V1_PING, chunking: int | None = None,
    *, video_frames: int = 3,
) -> BarePeer:
    """Connect to `peer` (a PeerSession), send `first_frame` on "control" (a v1 ping
    unless told otherwise), and return once the session took that wire and
    `video_frames` frames arrived (0 for a stepped session, which streams nothing).
    `chunking`: declare data-channel chunking with that max-message-size."""
    pc = RTCPeerConnection()
    video = pc.addTransceiver("video", direction="recvonly")
    client = BarePeer(pc, pc.createDataChannel("data"), pc.createDataChannel("control"))
    for label, kind in (("data", data_pb2.DataServerMessage),
                        ("control", control_pb2.ControlServerMessage)):
        reassembler = dc_chunking.Reassembler(64 * 1024 * 1024)

        def keep(raw: Any, label: str = label, kind: Any = kind,
                 reassembler: dc_chunking.Reassembler = reassembler) -> None:
            if client.chunked:
                try:
                    raw = reassembler.push(raw)
                except dc_chunking.ChunkingError as exc:
                    client.broken.append(str(exc))
                    return
                if raw is None:
                    return
            client.replies[label].append(kind.FromString(raw) if isinstance(raw, bytes) else raw)

        getattr(client, label).on("message", keep)

    async def receive() -> None:
        while True:
            await video.receiver.track.recv()
            client.frames += 1

    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    if chunking is not None:
        # What the official SDK writes into its offer's text; aiortc knows nothing of it.
        offer = dc_chunking.with_chunking(offer, chunking)
    answer = await peer.answer(offer, [
        {"mid": video.mid, "name": "main_video", "kind": "video", "direction": "recvonly"},
    ])
    client.answer_sdp = answer
    client.chunked = chunking is not None and dc_chunking.offered_limit(answer) is not None
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    client.receiving = asyncio.ensure_future(receive())
    # ICE, DTLS and the first frames on a loaded machine: a wait for each, bounded only
    # to fail with a message.
    await wait_for(lambda: client.data.readyState == client.control.readyState == "open",
                   CONNECT_S, "both channels open")
    client.send("control", first_frame)
    wire = Wire.V1 if isinstance(first_frame, bytes) else Wire.V0
    await wait_for(lambda: peer.wire is wire, CONNECT_S, f"the session to take wire {wire.name}")
    await wait_for(lambda: client.frames >= video_frames, CONNECT_S, "video")
    return client
