"""Messages to a client that has no open data channel yet.

The model may speak before the client's `data` channel opens (its schema, a first
`stats`, an error), and again while a reconnecting client opens a new one. Those
messages wait here and go out, in order, once the channel is open. The wait is
bounded: past `limit` messages the oldest are dropped, since a client that never
opens its channel must not grow the session's memory.
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

    def send(self, data: str) -> None: ...


class Outbox:
    """Sends on the channel `channel()` returns when it is open, holds otherwise."""

    def __init__(self, channel: Callable[[], TextChannel | None], limit: int = 256) -> None:
        self._channel = channel
        self._held: collections.deque[str] = collections.deque(maxlen=limit)

    def __len__(self) -> int:
        return len(self._held)

    def send(self, text: str) -> None:
        """Send `text` now if the channel is open (after what is held), else hold it."""
        channel = self._open_channel()
        if channel is not None and not self._held:
            channel.send(text)
        else:
            self._held.append(text)
            self.flush()

    def flush(self) -> None:
        """Send what is held, oldest first, while the channel is open."""
        channel = self._open_channel()
        while self._held and channel is not None and channel.readyState == "open":
            channel.send(self._held.popleft())

    def _open_channel(self) -> TextChannel | None:
        channel = self._channel()
        return channel if channel is not None and channel.readyState == "open" else None
