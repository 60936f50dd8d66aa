"""The last word on a data channel: `sessionEnded`, then time for it to leave.

Closing a peer connection right after `channel.send` loses what SCTP has not put on
the wire yet, so whoever ends a client's connection (the owner's session ending, a
viewer dropped or revoked) sends `sessionEnded{reason, message}` and drains the
channel, bounded, before closing it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from reactor_serve.protocol import channel_codec
from reactor_serve.sessions.outbox import TextChannel

__all__ = ["drain", "session_ended"]

# After the buffer reads empty, SCTP may still hold the last message.
_LAST_MESSAGE_S = 0.05
_POLL_S = 0.01


def session_ended(reason: str, message: str | None) -> str:
    """The `sessionEnded` frame (`message` left out when there is none)."""
    data: dict[str, Any] = {"reason": reason}
    if message:
        data["message"] = message
    return channel_codec.runtime("sessionEnded", data)


async def drain(
    channel: TextChannel,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Wait until `channel` has sent what it buffered, at most `timeout_s`, or until it
    closes."""
    deadline = clock() + timeout_s
    while channel.readyState == "open" and channel.bufferedAmount > 0 and clock() < deadline:
        await sleep(_POLL_S)
    await sleep(_LAST_MESSAGE_S)
