"""`Negotiations`: one session's offers and their answers, and the expiry of a session
that never got a usable offer.

A session's client may register a connection before it offers (to trickle candidates
early), offer again on a reconnect, and poll for each answer by connection id. The
table remembers a bounded number of both, so a client that keeps reconnecting cannot
grow it. A session that is created and then abandoned before any offer is answered
would hold the model for good; the expiry ends it. The clock and the timer are
injectable so the expiry is testable without waiting for it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

from reactor_serve.protocol.errors import (
    BackendError,
    NegotiationFailed,
    UnknownSession,
)
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer

__all__ = ["Cancellable", "Negotiations", "ScheduleLater"]


class Cancellable(Protocol):
    """A scheduled call that can be called off (an `asyncio.TimerHandle`)."""

    def cancel(self) -> None: ...


# Call the function after the delay (s): `asyncio.get_running_loop().call_later`.
ScheduleLater = Callable[[float, Callable[[], None]], Cancellable]


def _call_later(delay_s: float, callback: Callable[[], None]) -> Cancellable:
    return asyncio.get_running_loop().call_later(delay_s, callback)


class Negotiations:
    """The connections of one session: ids handed out, offers being answered or
    answered, the latest offer, and the expiry of a session with no usable offer."""

    # Offers and registered connections kept; older ones are dropped.
    KEEP_OFFERED = 8
    KEEP_REGISTERED = 16

    def __init__(
        self,
        session_id: str,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        call_later: ScheduleLater = _call_later,
    ) -> None:
        self.session_id = session_id
        # How long the session may go without a usable offer.
        self.timeout_s = timeout_s
        self._clock = clock
        self._call_later = call_later
        # connection id -> the task answering its offer (result: the SDP answer); the
        # ids only (values None) once released.
        self._offered: collections.OrderedDict[int, asyncio.Task[str] | None] = (
            collections.OrderedDict()
        )
        # Connection ids handed out by `register` that got no offer yet.
        self._registered: collections.OrderedDict[int, None] = collections.OrderedDict()
        # Per session, from 1: a Serve replica re-registers a session's connections in
        # order and expects the same ids (serve/replica.py).
        self._ids = itertools.count(1)
        self._latest: int | None = None
        self._answered = False
        self._expiry: Cancellable | None = None
        self._expires_at: float | None = None

    # ---- connections --------------------------------------------------------------------

    @property
    def latest(self) -> int | None:
        """The connection id of the newest offer: what a poll without an id sees."""
        return self._latest

    @property
    def answered(self) -> bool:
        """Whether an offer of this session was ever answered."""
        return self._answered

    def knows(self, connection_id: Any) -> bool:
        """Whether `connection_id` was handed out (registered or offered) and is kept."""
        return isinstance(connection_id, int) and (
            connection_id in self._registered or connection_id in self._offered
        )

    def register(self) -> int:
        """A fresh connection id for an offer still to come."""
        cid = next(self._ids)
        self._registered[cid] = None
        while len(self._registered) > self.KEEP_REGISTERED:
            self._registered.popitem(last=False)
        return cid

    def offer(
        self, connection_id: int | None, answer: Callable[[int], asyncio.Task[str]]
    ) -> int:
        """Record an offer on `connection_id` (one `knows`), or on a fresh id when
        None, with the task `answer(id)` starts to answer it; that id becomes the
        latest. The expiry stops: the answer's outcome decides what comes next."""
        cid = connection_id if connection_id is not None else next(self._ids)
        self._registered.pop(cid, None)
        self.cancel_expiry()
        task = answer(cid)
        task.add_done_callback(_retrieve)
        # The newest offer is what a poll without a connection id sees from now on, so
        # a reconnect never hands out the previous connection's answer.
        self._offered[cid] = task
        self._offered.move_to_end(cid)
        self._latest = cid
        while len(self._offered) > self.KEEP_OFFERED:
            self._offered.popitem(last=False)
        return cid

    def mark_answered(self) -> None:
        """An offer got its answer: the session no longer expires."""
        self._answered = True

    def poll(self, connection_id: int | None) -> SdpAnswer | AnswerPending:
        """The answer on `connection_id` (the latest offer's when None), or that it is
        still to come. Raises UnknownSession (an id never handed out, or dropped),
        NegotiationFailed or the answering's own BackendError."""
        cid = self._latest if connection_id is None else connection_id
        if cid is None or cid in self._registered:
            return AnswerPending({"status": "awaiting_offer"})
        if cid not in self._offered:
            raise self.unknown_connection(cid)
        task = self._offered[cid]
        if task is None or task.cancelled():
            raise NegotiationFailed("the offer was abandoned")
        if not task.done():
            return AnswerPending({"status": "pending"})
        error = task.exception()
        if error is not None:
            # A fresh exception per poll: re-raising one object grows its traceback.
            if isinstance(error, BackendError):
                raise type(error)(str(error), error.retry_after_s)
            raise NegotiationFailed(str(error))
        return SdpAnswer(task.result(), cid)

    async def wait_answer(self, connection_id: int | None, timeout_s: float) -> None:
        """Until the answer on `connection_id` (the latest offer's when None) is made
        or failed, at most `timeout_s`; at once when there is no answering under way."""
        cid = self._latest if connection_id is None else connection_id
        task = self._offered.get(cid) if cid is not None else None
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout_s)

    def unknown_connection(self, connection_id: Any) -> UnknownSession:
        """The error for a connection id this session does not know."""
        return UnknownSession(
            f"unknown connection {connection_id!r} for session {self.session_id}"
        )

    def tasks(self) -> list[asyncio.Task[str] | None]:
        """The answering tasks kept, oldest first (None for each once released)."""
        return list(self._offered.values())

    def release(self) -> None:
        """Let go of the answering tasks (a failed one's traceback holds the session's
        frames), keeping the connection ids so a late poll still gets a clear answer."""
        self.cancel_expiry()
        self._offered = collections.OrderedDict.fromkeys(self._offered)

    # ---- expiry -------------------------------------------------------------------------

    def arm_expiry(self, on_expiry: Callable[[], None]) -> None:
        """Call `on_expiry` in `timeout_s` unless an offer is answered, or is being
        answered, by then. Replaces an expiry already armed."""
        self.cancel_expiry()
        self._expires_at = self._clock() + self.timeout_s
        self._expiry = self._call_later(self.timeout_s, lambda: self._expire(on_expiry))

    def cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = self._expires_at = None

    def expires_in(self) -> float | None:
        """Seconds until the session expires; None when no expiry is armed or an offer
        was answered."""
        if self._answered or self._expires_at is None:
            return None
        return self._expires_at - self._clock()

    def _expire(self, on_expiry: Callable[[], None]) -> None:
        self._expiry = self._expires_at = None
        if self._answered:
            return
        if any(task is not None and not task.done() for task in self._offered.values()):
            return  # its outcome re-arms the expiry if it fails
        on_expiry()


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Failures are reported through `poll`; a client that never polls must not leave
    # "exception was never retrieved" noise behind.
    if not task.cancelled():
        task.exception()
