"""How long a client's connection has said nothing, and whether that is too long.

A connection is alive while frames arrive from it (its pings keep a quiet client
alive): silence past `idle_timeout_s` means it is gone. A connection still coming up
(ICE, DTLS, SCTP and the client's data channel, after the answer) can send nothing
yet, however alive its client: it gets `connect_timeout_s` instead, and its silence
counts from the moment it is up (its data channel open).
One rule for a session's client (`OrphanTimer`) and for a viewer's (`ViewerRoom`).

Silence is judged by a watch on the server's own event loop (`silence_checks`), and
that loop can stall (a model's import holding the GIL, a machine out of CPU). While it
stalls nothing is read: what the client sent waits in the socket, and the first check
after the stall would see it "silent" before those datagrams get their turn. So a stall
does not count as the client's silence (`InboundSilence.excuse`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from reactor_serve.runtime.log_throttle import LogThrottle

__all__ = ["InboundSilence", "silence_checks"]

log = logging.getLogger("reactor_serve.sessions")
_throttle = LogThrottle(log)


class InboundSilence:
    """The inbound silence of one connection. `clock` is injectable for tests."""

    def __init__(
        self,
        *,
        idle_timeout_s: float,
        connect_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        # None: a connection coming up is held to `idle_timeout_s` as well.
        self.connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._last_inbound = clock()
        self._coming_up = False

    def heard(self) -> None:
        """The client is alive now (a frame arrived, or a fresh connection)."""
        self._last_inbound = self._clock()

    def excuse(self, seconds: float) -> None:
        """`seconds` just passed in which we could not hear the client (our own loop
        stalled): they do not count as its silence."""
        self._last_inbound = min(self._clock(), self._last_inbound + max(0.0, seconds))

    def coming_up(self) -> None:
        """A connection was answered and is not up yet: it has `connect_timeout_s`."""
        self._coming_up = True
        self.heard()

    def up(self) -> None:
        """The connection is up: its silence counts from now, against `idle_timeout_s`."""
        self._coming_up = False
        self.heard()

    @property
    def waiting_for_connection(self) -> bool:
        """Whether the connection has not come up yet."""
        return self._coming_up

    @property
    def limit_s(self) -> float:
        """The silence allowed now: `connect_timeout_s` while coming up, else
        `idle_timeout_s`."""
        if self._coming_up and self.connect_timeout_s is not None:
            return self.connect_timeout_s
        return self.idle_timeout_s

    def silent(self) -> bool:
        """Whether nothing came from the client for longer than `limit_s`."""
        return self._clock() - self._last_inbound > self.limit_s


async def silence_checks(
    period_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> AsyncIterator[float]:
    """Yield once every `period_s`: the time to check silences. Each yield is the
    seconds this loop overslept past a whole extra period (0.0 when it woke about on
    time), which the caller `excuse`s: a stall, not the clients' silence. Lateness under
    a period is scheduling noise on a busy machine, and is not excused."""
    while True:
        before = clock()
        await sleep(period_s)
        late = clock() - before - period_s
        if late > period_s:
            _throttle.warning("the event loop stalled for %.1f s; not counted as any "
                              "client's silence", late)
            yield late
        else:
            yield 0.0
