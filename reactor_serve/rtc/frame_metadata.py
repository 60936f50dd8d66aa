"""Per-frame metadata (`a=x-reactor-frame-metadata`): a frame id, a capture time and
the sender's bytes, carried at the end of each encoded video frame.

A peer declares it with a session-level line, `a=x-reactor-frame-metadata:1`; the
answer mirrors the line when it takes it up, and only then does either side add
trailers. The trailer follows the codec's bytes of one whole encoded frame:

    [encoded frame][FrameMetadata protobuf][u32 little-endian protobuf length]["RXMT"]

It is not an RTP header extension: the packetizer splits the frame, trailer and all,
into packets as usual, and the receiver reassembles the frame and takes the trailer
off before decoding. A frame is read as stamped when it ends in "RXMT", is at least
eight bytes long and holds the length it declares; anything else is a plain frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from reactor_serve.protocol.wire_v1.frame_metadata_pb2 import FrameMetadata
from reactor_serve.rtc.session_attributes import (
    session_attribute,
    with_session_attribute,
)

__all__ = [
    "ATTRIBUTE",
    "MARK",
    "FrameStamp",
    "append_trailer",
    "offered",
    "split_trailer",
    "splits_h264",
    "with_frame_metadata",
]

ATTRIBUTE = "x-reactor-frame-metadata"
VERSION = "1"
MARK = b"RXMT"
_LENGTH = struct.Struct("<I")
_TAIL = _LENGTH.size + len(MARK)


@dataclass(frozen=True)
class FrameStamp:
    """One frame's metadata: the sender's frame id (0: none), when it was captured in
    the sender's microseconds (None: unstamped) and the bytes it attached (None: none)."""

    frame_id: int = 0
    capture_time_us: int | None = None
    user_data: bytes | None = None


def offered(sdp: str) -> bool:
    """Whether `sdp` declares per-frame metadata in the version this side speaks."""
    declared = session_attribute(sdp, ATTRIBUTE)
    return declared is not None and declared.split(" ", 1)[0] == VERSION


def with_frame_metadata(sdp: str) -> str:
    """`sdp` (an answer, ours) declaring per-frame metadata."""
    return with_session_attribute(sdp, ATTRIBUTE, VERSION)


def append_trailer(frame: bytes, stamp: FrameStamp) -> bytes:
    """`frame` (one whole encoded frame) with `stamp`'s trailer after it."""
    message = FrameMetadata(
        frame_id=stamp.frame_id,
        capture_time_us=stamp.capture_time_us or 0,
        user_data=stamp.user_data or b"",
    ).SerializeToString()
    return b"".join((frame, message, _LENGTH.pack(len(message)), MARK))


def split_trailer(data: bytes) -> tuple[bytes, FrameStamp | None]:
    """The encoded frame and its stamp; `(data, None)` for a frame with no trailer, or
    one whose trailer does not parse (it is then left on, as the codec's bytes)."""
    if len(data) < _TAIL or not data.endswith(MARK):
        return data, None
    (length,) = _LENGTH.unpack_from(data, len(data) - _TAIL)
    if len(data) < _TAIL + length:
        return data, None
    start = len(data) - _TAIL - length
    message = FrameMetadata()
    try:
        message.ParseFromString(data[start: len(data) - _TAIL])
    except DecodeError:
        return data, None
    return data[:start], FrameStamp(
        frame_id=message.frame_id,
        capture_time_us=message.capture_time_us or None,
        user_data=message.user_data or None,
    )


def splits_h264(frame: bytes, stamped: bytes) -> bool:
    """Whether an H264 packetizer would cut `stamped` (`frame` with its trailer) at a
    start code inside the trailer: such a trailer does not reach the receiver whole.

    Annex B marks NAL units with 00 00 01; the trailer's bytes (with the frame's last
    two before them) must not contain it."""
    return b"\x00\x00\x01" in stamped[max(0, len(frame) - 2):]
