"""Data-channel chunking (`a=x-reactor-dc-chunking`): messages larger than one SCTP
message, as the official clients frame them.

A client declares it with a session-level line in its offer, before the first `m=`
line: `a=x-reactor-dc-chunking:1 max-message-size=67108864` (version 1; parameters
`key=value`, separated by `;` or spaces; unknown keys ignored; no `max-message-size`
means 256 KiB). The answer mirrors it with the answerer's own `max-message-size`, and
from then on every message on that connection's channels, both ways and whatever its
size, travels as one or more binary frames:

    byte 0: bit 0 MORE (more frames of this message follow), bit 1 TEXT (the message
            was text), bits 2-7 the version, 0
    then:   the next slice of the message

An empty frame, a version other than 0, a frame that is not binary, or a TEXT flag
that changes inside a message is a protocol error: the partial message is dropped.
A message past the receiver's limit is skipped to its last frame and dropped whole.
"""

from __future__ import annotations

import logging
from typing import Any

from reactor_serve.rtc.session_attributes import (
    session_attribute,
    with_session_attribute,
)

__all__ = [
    "ATTRIBUTE",
    "FRAME_BYTES",
    "ChunkedChannel",
    "ChunkingError",
    "Reassembler",
    "with_chunking",
    "frames",
    "offered_limit",
]

log = logging.getLogger(__name__)

ATTRIBUTE = "x-reactor-dc-chunking"
VERSION = "1"
# Frame size, header included: what native senders use.
FRAME_BYTES = 64 * 1024
# What a peer that declares chunking without a max-message-size takes.
DEFAULT_LIMIT = 256 * 1024
_MORE = 0x01
_TEXT = 0x02
_VERSION_BITS = 0xFC


class ChunkingError(ValueError):
    """A frame that breaks the framing; the message it belonged to is dropped."""


def offered_limit(sdp: str) -> int | None:
    """The max-message-size of a peer whose SDP declares chunking (version 1), or None
    when it does not (no line, another version, a line that does not parse)."""
    declared = session_attribute(sdp, ATTRIBUTE)
    if declared is None:
        return None
    version, _, parameters = declared.partition(" ")
    if version != VERSION:
        return None
    limit = DEFAULT_LIMIT
    for parameter in parameters.replace(";", " ").split():
        key, equals, value = parameter.partition("=")
        if key == "max-message-size":
            # At most 12 digits: a terabyte is past any limit, and no huge int.
            if not equals or not value.isdigit() or len(value) > 12 or int(value) < 1:
                return None
            limit = int(value)
    return limit


def with_chunking(sdp: str, max_message_size: int) -> str:
    """`sdp` (an answer, ours) declaring chunking with `max_message_size`, before its
    first media section."""
    return with_session_attribute(sdp, ATTRIBUTE, f"{VERSION} max-message-size={max_message_size}")


def frames(message: str | bytes, frame_bytes: int = FRAME_BYTES) -> list[bytes]:
    """The frames of one message."""
    if isinstance(message, str):
        return _frames(message.encode("utf-8"), True, frame_bytes)
    return _frames(bytes(message), False, frame_bytes)


def _frames(data: bytes, text: bool, frame_bytes: int) -> list[bytes]:
    flags = _TEXT if text else 0
    step = frame_bytes - 1
    if not data:
        return [bytes([flags])]
    return [
        bytes([flags | (_MORE if start + step < len(data) else 0)]) + data[start:start + step]
        for start in range(0, len(data), step)
    ]


class Reassembler:
    """One channel's inbound frames back into messages, up to `limit` bytes each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._text: bool | None = None
        self._skipping = False

    def push(self, frame: str | bytes) -> str | bytes | None:
        """The message `frame` completes, or None while more frames are due (or a
        message past the limit is being skipped). Raises ChunkingError for a frame
        that breaks the framing, forgetting the message it was part of."""
        if not isinstance(frame, (bytes, bytearray)):
            self._reset()
            raise ChunkingError("a text frame on a chunked channel: every frame is binary")
        if not frame:
            self._reset()
            raise ChunkingError("an empty frame on a chunked channel")
        header = frame[0]
        if header & _VERSION_BITS:
            self._reset()
            raise ChunkingError(f"a frame of chunking version {header >> 2}; only 0 is known")
        text = bool(header & _TEXT)
        if self._text is not None and text != self._text:
            self._reset()
            raise ChunkingError("the TEXT flag changed inside a message")
        self._text = text
        more = bool(header & _MORE)
        if not self._skipping:
            self._size += len(frame) - 1
            if self._size > self.limit:
                self._skipping = True
                self._parts = []
            else:
                self._parts.append(bytes(frame[1:]))
        if more:
            return None
        if self._skipping:
            self.dropped += 1
            size = self._size
            self._reset()
            raise ChunkingError(f"a message of {size} bytes, past the limit of {self.limit}")
        data = b"".join(self._parts)
        self._reset()
        if text:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise ChunkingError("a text message that is not UTF-8") from None
        return data

    def _reset(self) -> None:
        self._parts, self._size, self._text, self._skipping = [], 0, None, False


class ChunkedChannel:
    """A data channel of a chunked connection, seen as a plain one: `send` frames the
    message. Messages past the peer's `limit` are not sent (logged): the peer would
    drop them."""

    def __init__(self, channel: Any, limit: int) -> None:
        self._channel = channel
        self.limit = limit

    @property
    def label(self) -> str:
        return str(self._channel.label)

    @property
    def readyState(self) -> str:  # noqa: N802 (aiortc's name)
        return str(self._channel.readyState)

    @property
    def bufferedAmount(self) -> int:  # noqa: N802 (aiortc's name)
        return int(self._channel.bufferedAmount)

    def send(self, message: str | bytes) -> None:
        text = isinstance(message, str)
        data = message.encode("utf-8") if isinstance(message, str) else bytes(message)
        if len(data) > self.limit:
            log.warning("a %d-byte message for channel %r is past the peer's limit of %d "
                        "bytes: not sent", len(data), self.label, self.limit)
            return
        for frame in _frames(data, text, FRAME_BYTES):
            self._channel.send(frame)
