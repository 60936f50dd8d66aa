"""Keeping a client's session through a lost transport (a network drop, a suspended
laptop).

The server keeps a session whose transport was lost for a grace period, with the model's
state. So when the connection fails, closes, or goes quiet while the server's
once-a-second `stats` are expected, the supervisor offers again on the same session,
with backoff, until it works, the server says the session is over, or the policy gives
up. When the session is over it always names why: the server's own `sessionEnded`, the
server's word on the session, or the server being gone.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import httpx

from reactor_serve.client.signalling import SessionOver, SessionRefused

__all__ = ["ClientState", "Liveness", "ReconnectPolicy", "ReconnectSupervisor"]

log = logging.getLogger("reactor_serve.client")


class ClientState:
    """`ReactorClient.state` values, in the order a session goes through them."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"  # the transport was lost; offering again
    ENDED = "ended"


@dataclass(frozen=True)
class ReconnectPolicy:
    """When the client decides its transport is lost, and how it tries again.

    The server keeps a session whose transport was lost for its reconnect grace
    (30 s by default), so `give_up_after_s` matches that.
    """

    enabled: bool = True
    # No data-channel message for this long, while the server's `stats` (about once a
    # second) are expected, means the transport is gone even if ICE has not noticed
    # (it takes ~30 s to). Before the first `stats` nothing is expected.
    silence_timeout_s: float = 2.0
    # Backoff between attempts: first_delay_s, doubling, at most max_delay_s.
    first_delay_s: float = 0.2
    max_delay_s: float = 2.0
    # Give up (and report the session ended) after trying for this long in all ...
    give_up_after_s: float = 30.0
    # ... or once the server has refused connections for this long: nothing listens
    # there any more (a killed `reactor run`), and nobody will tell us why.
    unreachable_after_s: float = 3.0
    # How long one attempt waits for the answer to its offer.
    attempt_timeout_s: float = 10.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (1-based)."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1))


class Liveness(Protocol):
    """What the supervisor reads of the current connection (`ClientPeer` has it)."""

    # Whether the server's periodic `stats` have come: only then is silence a loss.
    stats_seen: bool
    # When the current connection last received a data-channel message (on the clock).
    last_inbound: float
    # The server's `sessionEnded` data, once it has come.
    session_end: dict[str, Any] | None


class ReconnectSupervisor:
    """Watches one session's connection; offers again when it is lost; ends the session
    (through `end`) when the server says it is over or reconnecting gives up.

    `check_session()` asks the server about the session and raises SessionOver when it
    ended; `reoffer(timeout)` makes a new connection on the same session; `set_state`
    gets each ClientState change with its detail; `end(reason, message)` is called once,
    when the session is over. `lost(why)` is what the connection calls when it fails.
    """

    # Without `stats` to watch, how often to ask the server whether the session lives.
    WATCH_INTERVAL_S = 2.0
    # How often `run()` looks at the connection's liveness.
    TICK_S = 0.1

    def __init__(
        self,
        connection: Liveness,
        policy: ReconnectPolicy,
        *,
        check_session: Callable[[], Awaitable[object]],
        reoffer: Callable[[float], Awaitable[None]],
        set_state: Callable[..., None],
        end: Callable[[str, str | None], Awaitable[None]],
        server: str,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.connection = connection
        self.policy = policy
        self._check_session = check_session
        self._reoffer = reoffer
        self._set_state = set_state
        self._end = end
        self._server = server
        self._name = name
        self._clock = clock
        self._sleep = sleep
        # Successful reconnects so far (each one a new connection, same session).
        self.reconnects = 0
        self.ended = False
        self._lost = asyncio.Event()
        self._lost_why = ""
        self._next_watch = clock() + self.WATCH_INTERVAL_S

    def lost(self, why: str) -> None:
        """The connection is gone (`why`, in a few words); `run()` reconnects."""
        self._lost_why = why
        self._lost.set()

    async def run(self) -> None:
        """Look at the connection every TICK_S (at once when it is lost) until the
        session is over."""
        try:
            while not self.ended:
                try:
                    await asyncio.wait_for(self._lost.wait(), self.TICK_S)
                except asyncio.TimeoutError:
                    pass
                await self.check()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave the client hanging
            log.exception("session %s: the connection supervisor failed", self._name)
            await self._finish("error", f"the client's connection supervisor failed: {exc!r}")

    async def check(self) -> None:
        """Look at the connection once: end the session if the server said so, reconnect
        if the connection is lost or silent, and now and then ask a server that sends no
        `stats` whether the session lives."""
        if self.ended:
            return
        ended = self.connection.session_end
        if ended is not None:
            # The server said so itself: no reconnect, whatever the transport does.
            await self._finish(ended.get("reason") or "unknown", ended.get("message"))
            return
        why = None
        now = self._clock()
        if self._lost.is_set():
            why = self._lost_why
        elif self.connection.stats_seen and (
            now - self.connection.last_inbound > self.policy.silence_timeout_s
        ):
            why = f"no message from the server for {self.policy.silence_timeout_s:g} s"
        elif not self.connection.stats_seen and now >= self._next_watch:
            # A server that sends no stats: ask it now and then instead.
            self._next_watch = now + self.WATCH_INTERVAL_S
            await self._end_if_server_ended()
        if why is not None:
            await self.reconnect(why)

    async def reconnect(self, why: str) -> None:
        """Offer again on the same session until it works, the server says the session
        is over, or the policy gives up. The model keeps its state on the server."""
        log.info("session %s: transport lost (%s)", self._name, why)
        if not self.policy.enabled:
            await self._end_after_loss(why, "reconnecting is disabled")
            return
        started = self._clock()
        refused_since: float | None = None
        last_error = why
        attempt = 0
        while True:
            attempt += 1
            log.info("session %s: reconnecting (attempt %d)", self._name, attempt)
            self._set_state(ClientState.RECONNECTING, attempt=attempt, reason=why)
            # A short pause first, doubling per failure: the server may need a moment
            # to notice the loss, and a dead network should not be hammered.
            await self._sleep(self.policy.delay(attempt))
            self._lost.clear()
            try:
                await self._check_session()
                remaining = self.policy.give_up_after_s - (self._clock() - started)
                await self._reoffer(max(1.0, min(self.policy.attempt_timeout_s, remaining)))
            except SessionOver as over:
                await self._finish(over.reason, over.message)
                return
            except SessionRefused as exc:
                if exc.status == 404:
                    await self._end_after_404(str(exc))
                    return
                refused_since, last_error = None, str(exc)
            except httpx.HTTPError as exc:
                if _refused(exc):
                    refused_since = refused_since or self._clock()
                    if self._clock() - refused_since >= self.policy.unreachable_after_s:
                        await self._finish(
                            "error",
                            f"lost the connection ({why}) and the server at {self._server} "
                            f"refuses connections: it is gone, and the session with it",
                        )
                        return
                else:
                    refused_since = None
                last_error = f"{type(exc).__name__}: {exc}"
            except (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError) as exc:
                refused_since, last_error = None, f"{type(exc).__name__}: {exc}"
            else:
                self.reconnects += 1
                log.info("session %s: reconnected after %d attempt(s)", self._name, attempt)
                self._set_state(ClientState.STREAMING, reconnects=self.reconnects)
                return
            log.info("session %s: reconnect attempt %d failed: %s",
                     self._name, attempt, last_error)
            if self._clock() - started >= self.policy.give_up_after_s:
                await self._end_after_loss(
                    why, f"could not reconnect within {self.policy.give_up_after_s:g} s "
                    f"({last_error})")
                return

    async def _end_after_404(self, detail: str) -> None:
        # The offer's 404 says in words that the session ended; the descriptor says why
        # in fields, when the server still remembers it.
        try:
            await self._check_session()
        except SessionOver as over:
            if over.reason not in ("error", "unknown") or over.message:
                await self._finish(over.reason, over.message)
                return
        except httpx.HTTPError:
            pass
        await self._finish("error", detail)

    async def _end_after_loss(self, why: str, what: str) -> None:
        if await self._end_if_server_ended():
            return
        await self._finish("timeout", f"lost the connection ({why}) and {what}")

    async def _end_if_server_ended(self) -> bool:
        """Ask the server whether the session lives; if it ended, end here with the
        server's reason. An unreachable server tells nothing: False."""
        try:
            await self._check_session()
        except SessionOver as over:
            await self._finish(over.reason, over.message)
            return True
        except httpx.HTTPError:
            pass
        return False

    async def _finish(self, reason: str, message: str | None) -> None:
        if self.ended:
            return
        self.ended = True
        await self._end(reason, message)


def _refused(exc: BaseException) -> bool:
    """Whether a connection attempt was refused: nothing listens there any more. httpx
    keeps the OSError deep in the exception chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or (
            isinstance(current, OSError) and current.errno == errno.ECONNREFUSED
        ):
            return True
        current = current.__cause__ or current.__context__
    return False
