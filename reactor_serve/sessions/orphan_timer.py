"""When a session's client counts as gone, and for how long it may come back.

A client is alive while frames arrive on its data channel: the watchdog calls
`on_silent` once it has been silent too long (`InboundSilence`: `idle_timeout_s`, or
`connect_timeout_s` for a connection still coming up). A lost transport orphans the session for
`reconnect_grace_s`: `on_expired` is called when that grace runs out (with the
orphaning's time, so the owner can tell an expiry of a grace that a reconnect already
ended from the current one). A
`stop_session` that names no session may mean this one: it opens a short window in
which a transport loss ends the session instead of orphaning it.

All time comes from `clock` and every wait from `sleep`, so the timer is testable
with a fake clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from reactor_serve.sessions.inbound_silence import InboundSilence, silence_checks

__all__ = ["OrphanTimer"]


class OrphanTimer:
    """Inbound liveness, the reconnect grace, and the stop-on-close window of one session.

    Create and use it on the session's loop."""

    def __init__(
        self,
        *,
        idle_timeout_s: float,
        reconnect_grace_s: float,
        on_silent: Callable[[], Awaitable[None]],
        connect_timeout_s: float | None = None,
        on_expired: Callable[[float], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        # The client's silence: `heard()` on each frame, `coming_up()` and `up()` as
        # a connection is answered and connects.
        self.silence = InboundSilence(idle_timeout_s=idle_timeout_s,
                                      connect_timeout_s=connect_timeout_s, clock=clock)
        self.reconnect_grace_s = reconnect_grace_s
        self._on_silent = on_silent
        self._on_expired = on_expired
        self._clock = clock
        self._sleep = sleep
        self._orphaned_at: float | None = None
        self._stop_on_close_until: float | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._grace: asyncio.Task[None] | None = None
        self._stopped = False

    # ---- inbound liveness -----------------------------------------------------------

    def start_watchdog(self) -> None:
        """Check for silence a few times per `idle_timeout_s` until `stop()`."""
        if self._watchdog is None and not self._stopped:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        period = min(1.0, self.silence.idle_timeout_s / 4)
        async for stalled in silence_checks(period, clock=self._clock, sleep=self._sleep):
            if self._stopped:
                return
            self.silence.excuse(stalled)
            if self.silence.silent():
                await self._on_silent()

    # ---- orphaned -------------------------------------------------------------------

    @property
    def orphaned_at(self) -> float | None:
        """When the session was orphaned (on `clock`); None while it is not."""
        return self._orphaned_at

    def orphan(self) -> float:
        """The transport is gone: start the reconnect grace. Returns the orphaning's time."""
        at = self._orphaned_at = self._clock()
        self._cancel_grace()
        if not self._stopped:
            self._grace = asyncio.get_running_loop().create_task(self._expire(at))
        return at

    def resume(self) -> None:
        """A client (re)connected: no grace runs, and it is alive now."""
        self._cancel_grace()
        self._orphaned_at = None
        self.silence.heard()

    def grace_remaining(self) -> float | None:
        """Seconds left for a reconnect while orphaned; None otherwise."""
        if self._orphaned_at is None:
            return None
        return max(0.0, self._orphaned_at + self.reconnect_grace_s - self._clock())

    def orphaned_within(self, window_s: float) -> bool:
        """Whether the session was orphaned at most `window_s` ago."""
        return self._orphaned_at is not None and self._clock() - self._orphaned_at <= window_s

    async def _expire(self, orphaned_at: float) -> None:
        await self._sleep(max(0.0, orphaned_at + self.reconnect_grace_s - self._clock()))
        await self._on_expired(orphaned_at)

    def _cancel_grace(self) -> None:
        grace, self._grace = self._grace, None
        if grace is not None and grace is not asyncio.current_task():
            grace.cancel()

    # ---- a stop that may mean this session ------------------------------------------

    def stop_on_close(self, window_s: float) -> None:
        """A transport loss within the next `window_s` ends the session."""
        self._stop_on_close_until = self._clock() + window_s

    def stopping_on_close(self) -> bool:
        """Whether a transport loss now ends the session instead of orphaning it."""
        until = self._stop_on_close_until
        return until is not None and self._clock() <= until

    # ---- end ------------------------------------------------------------------------

    def stop(self) -> None:
        """No more watching and no grace (the session is ending). Safe to call from
        either callback."""
        self._stopped = True
        current = asyncio.current_task()
        for task in (self._watchdog, self._grace):
            if task is not None and task is not current:
                task.cancel()
        self._watchdog = self._grace = None
