"""A bare aiortc client of a `PeerSession`, on 127.0.0.1: one recvonly video track and
the "data" and "control" channels, speaking whatever its first frame says (wire v1
protobuf, as the official Python SDK does, or v0 JSON). It counts the video frames it
decodes and keeps every frame the server sends, decoded as v1 where they are bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription

from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, data_pb2
from reactor_serve.protocol.wire_version import Wire

__all__ = ["BarePeer", "V1_PING", "open_bare_peer", "wait_for"]


def _v1_ping() -> bytes:
    ping = control_pb2.ControlClientMessage(kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    ping.ping.SetInParent()
    return ping.SerializeToString()


V1_PING = _v1_ping()


async def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@dataclass
class BarePeer:
    pc: RTCPeerConnection
    data: Any
    control: Any
    replies: dict[str, list[Any]] = field(default_factory=lambda: {"data": [], "control": []})
    frames: int = 0
    receiving: asyncio.Future[None] | None = None

    async def close(self) -> None:
        if self.receiving is not None:
            self.receiving.cancel()
        await self.pc.close()


async def open_bare_peer(peer: Any, first_frame: bytes | str = V1_PING) -> BarePeer:
    """Connect to `peer` (a PeerSession), send `first_frame` on "control" (a v1 ping
    unless told otherwise), and return once the session took that wire and video
    arrives."""
    pc = RTCPeerConnection()
    video = pc.addTransceiver("video", direction="recvonly")
    client = BarePeer(pc, pc.createDataChannel("data"), pc.createDataChannel("control"))
    for label, kind in (("data", data_pb2.DataServerMessage),
                        ("control", control_pb2.ControlServerMessage)):
        def keep(raw: Any, label: str = label, kind: Any = kind) -> None:
            client.replies[label].append(kind.FromString(raw) if isinstance(raw, bytes) else raw)

        getattr(client, label).on("message", keep)

    async def receive() -> None:
        while True:
            await video.receiver.track.recv()
            client.frames += 1

    await pc.setLocalDescription(await pc.createOffer())
    answer = await peer.answer(pc.localDescription.sdp, [
        {"mid": video.mid, "name": "main_video", "kind": "video", "direction": "recvonly"},
    ])
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    client.receiving = asyncio.ensure_future(receive())
    await wait_for(lambda: client.data.readyState == client.control.readyState == "open", 15,
                   "both channels open")
    client.control.send(first_frame)
    wire = Wire.V1 if isinstance(first_frame, bytes) else Wire.V0
    await wait_for(lambda: peer.wire is wire, 10, f"the session to take wire {wire.name}")
    await wait_for(lambda: client.frames >= 3, 15, "video")
    return client
