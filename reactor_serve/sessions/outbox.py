"""Messages to a client that has no open data channel yet.

The model may speak before the client's `data` channel opens (its schema, a first
`stats`, an error), and again while a reconnecting client opens a new one. Those
messages wait here and go out, in order, once the channel is open. The wait is
bounded: past `limit` messages the oldest are dropped, since a client that never
opens its channel must not grow the session's memory.

Frames name their channel (`"data"` unless told): wire v1 answers some requests on
`"control"`, and one order across both keeps a reply behind what came before it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Protocol

__all__ = ["Outbox", "TextChannel"]


class TextChannel(Protocol):
    """What the outbox needs of a data channel (aiortc's RTCDataChannel is one)."""

    @property
    def readyState(self) -> str: ...  # noqa: N802 (aiortc's name)

    @property
    def bufferedAmount(self) -> int: ...  # noqa: N802 (aiortc's name)

    def send(self, data: str | bytes) -> None: ...


class Outbox:
    """Sends on the channel `channel(label)` returns when it is open, holds otherwise."""

    def __init__(self, channel: Callable[[str], TextChannel | None], limit: int = 256) -> None:
        self._channel = channel
        self._held: collections.deque[tuple[str, str | bytes]] = collections.deque(maxlen=limit)

    def __len__(self) -> int:
        return len(self._held)

    def send(self, frame: str | bytes, label: str = "data") -> None:
        """Send `frame` on channel `label` now if it is open (after what is held), else
        hold it."""
        channel = self._open_channel(label)
        if channel is not None and not self._held:
            channel.send(frame)
        else:
            self._held.append((label, frame))
            self.flush()

    def flush(self) -> None:
        """Send what is held, oldest first, while its channel is open."""
        while self._held:
            label, frame = self._held[0]
            channel = self._open_channel(label)
            if channel is None:
                return
            self._held.popleft()
            channel.send(frame)

    def _open_channel(self, label: str) -> TextChannel | None:
        channel = self._channel(label)
        return channel if channel is not None and channel.readyState == "open" else None
