"""`UsageLedger`: every session's state changes written to the access database as
intervals, so usage can be billed per key and model and a crash loses almost nothing.

It is the `SessionEvents` of whatever holds sessions (`reactor run`'s backend, each
Serve replica, the ingress for sessions still queued). Each change closes the
session's open interval and opens the next, in one transaction; the writes happen on
a thread of the ledger's own, in order, and a database that is down is retried until
it is back, the changes kept meanwhile. While an interval is open its `seen_at` is
renewed every `heartbeat_s`, so one a crash leaves open is closed at its last
heartbeat by `close_abandoned` when the server starts again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import and_, insert, select, text, update
from sqlalchemy.engine import Connection

from reactor_serve.access.database import Database, DatabaseError
from reactor_serve.access.schema import session_owners, usage_intervals

__all__ = ["METERED_STATES", "UsageLedger"]

log = logging.getLogger("reactor_serve.access.usage")

# A session's states as they are billed: `ready` is what a session-second costs.
METERED_STATES = {"created": "waiting", "waiting": "waiting", "streaming": "ready",
                  "orphaned": "orphaned"}
ENDED = "ended"


@dataclass(frozen=True)
class _Change:
    session_id: str
    state: str
    at: float
    reason: str | None
    frames: int


class UsageLedger:
    def __init__(
        self,
        database: Database,
        *,
        holds_slot: bool = True,
        heartbeat_s: float = 5.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        on_closed: Callable[[str, str, str, float, int], None] | None = None,
    ) -> None:
        """`on_closed(key_id, model, state, seconds, frames)` is called (on the
        ledger's thread) for each interval it closes of a session a key started:
        metrics per key."""
        self.database = database
        self.on_closed = on_closed
        self.holds_slot = holds_slot
        self.heartbeat_s = heartbeat_s
        self.retry_s = retry_s
        self._clock = clock
        self._changes: queue.Queue[_Change | None] = queue.Queue()
        # Sessions with an open interval written by this ledger: their heartbeats.
        self._open: set[str] = set()
        # Each session's frame count when its open interval began.
        self._frames_at_open: dict[str, int] = {}
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="reactor-usage-ledger",
                                        daemon=True)
        self._thread.start()

    # ---- SessionEvents ---------------------------------------------------------------

    def session_state(self, session_id: str, state: str, at: float, *,
                      reason: str | None = None, frames: int = 0) -> None:
        if state != ENDED and state not in METERED_STATES:
            return
        self._idle.clear()
        self._changes.put(_Change(session_id, state, at, reason, frames))

    # ---- lifecycle -------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every change so far is written; whether they all were."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._changes.put(None)
        self._thread.join(timeout)

    def close_abandoned(self, is_live: Callable[[str], bool], reason: str = "lost") -> int:
        """Close the intervals a crashed process left open, at their last heartbeat,
        for every session `is_live` says no longer runs; how many were closed."""
        gone = [sid for sid in self.open_sessions() if not is_live(sid)]
        return self.close_sessions(gone, reason)

    def open_sessions(self) -> list[str]:
        """Sessions with an interval open that no change of this ledger's opened: the
        ones to ask about after a restart."""
        with self.database.begin() as connection:
            found = {row[0] for row in connection.execute(
                select(usage_intervals.c.session_id).where(usage_intervals.c.ended_at.is_(None)))}
        return sorted(found - self._open)

    def close_sessions(self, session_ids: Iterable[str], reason: str) -> int:
        """Close these sessions' open intervals at their last heartbeat, and the
        sessions with them; how many intervals were closed."""
        closed = 0
        with self.database.begin() as connection:
            for session_id in session_ids:
                rows = connection.execute(select(usage_intervals).where(
                    usage_intervals.c.session_id == session_id,
                    usage_intervals.c.ended_at.is_(None))).all()
                for row in rows:
                    connection.execute(update(usage_intervals)
                                       .where(usage_intervals.c.id == row.id)
                                       .values(ended_at=row.seen_at, end_reason=reason))
                    closed += 1
                if rows:
                    last = max(row.seen_at for row in rows)
                    connection.execute(update(session_owners)
                                       .where(session_owners.c.session_id == session_id,
                                              session_owners.c.ended_at.is_(None))
                                       .values(ended_at=last, end_reason=reason))
        return closed

    # ---- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        next_beat = self._clock() + self.heartbeat_s
        while True:
            try:
                change = self._changes.get(timeout=max(0.0, next_beat - self._clock()))
            except queue.Empty:
                self._beat()
                next_beat = self._clock() + self.heartbeat_s
                continue
            if change is None:
                self._beat()
                self._idle.set()
                return
            while not self._write(change):
                time.sleep(self.retry_s)
            if self._changes.empty():
                self._idle.set()

    def _write(self, change: _Change) -> bool:
        closed: list[tuple[str, str, str, float, int]] = []
        try:
            with self.database.begin() as connection:
                self._apply(connection, change, closed)
        except DatabaseError as exc:
            log.warning("usage for session %s not written yet (retrying): %s",
                        change.session_id[:4], exc)
            return False
        if self.on_closed is not None:
            for interval in closed:
                try:
                    self.on_closed(*interval)
                except Exception:
                    log.exception("the usage listener failed")
        return True

    def _apply(self, conn: Connection, change: _Change,
               closed: list[tuple[str, str, str, float, int]]) -> None:
        sid = change.session_id
        if conn.dialect.name == "postgresql":
            # One session's changes, written by several processes (the ingress, the
            # replica), one after the other: each reads the intervals the other wrote.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:sid, 0))"),
                         {"sid": sid})
        ended = change.state == ENDED
        metered = None if ended else METERED_STATES[change.state]
        first = conn.execute(select(usage_intervals.c.started_at)
                             .where(usage_intervals.c.session_id == sid)
                             .order_by(usage_intervals.c.started_at)).first()
        if first is not None and first.started_at > change.at:
            # A change from before everything written of the session, come late
            # (another process, or another of this process's ledgers, wrote later
            # ones first): its interval ends where the first written one begins.
            if not ended:
                conn.execute(insert(usage_intervals).values(
                    session_id=sid, state=metered, started_at=change.at,
                    ended_at=first.started_at, seen_at=first.started_at,
                    held=self.holds_slot, frames=0))
            return
        current = conn.execute(select(usage_intervals).where(
            usage_intervals.c.session_id == sid, usage_intervals.c.ended_at.is_(None))
            .order_by(usage_intervals.c.started_at.desc())).first()
        if current is None and not ended and conn.execute(
                select(session_owners.c.ended_at).where(
                    session_owners.c.session_id == sid,
                    session_owners.c.ended_at.is_not(None))).first() is not None:
            return  # the session has ended: a straggler opens nothing
        if (current is not None and not ended and current.state == metered
                and bool(current.held) == self.holds_slot):
            return  # created -> waiting: one interval
        if current is not None:
            frames = max(0, change.frames - self._frames_at_open.get(sid, 0))
            conn.execute(update(usage_intervals)
                         .where(usage_intervals.c.id == current.id)
                         .values(ended_at=change.at, seen_at=change.at,
                                 end_reason=change.reason if ended else None,
                                 frames=current.frames + frames))
            owner = conn.execute(select(session_owners.c.key_id, session_owners.c.model)
                                 .where(session_owners.c.session_id == sid)).first()
            if owner is not None:
                closed.append((owner.key_id, owner.model, current.state,
                               max(0.0, change.at - current.started_at), current.frames + frames))
        if ended:
            conn.execute(update(session_owners)
                         .where(and_(session_owners.c.session_id == sid,
                                     session_owners.c.ended_at.is_(None)))
                         .values(ended_at=change.at, end_reason=change.reason))
            self._open.discard(sid)
            self._frames_at_open.pop(sid, None)
            return
        conn.execute(insert(usage_intervals).values(
            session_id=sid, state=metered, started_at=change.at, seen_at=change.at,
            held=self.holds_slot, frames=0))
        self._open.add(sid)
        self._frames_at_open[sid] = change.frames

    def _beat(self) -> None:
        open_now: Iterable[str] = list(self._open)
        if not open_now:
            return
        mine = and_(usage_intervals.c.session_id.in_(open_now),
                    usage_intervals.c.ended_at.is_(None),
                    usage_intervals.c.held == self.holds_slot)
        try:
            with self.database.begin() as connection:
                connection.execute(update(usage_intervals).where(mine)
                                   .values(seen_at=self._clock()))
                still = {row[0] for row in connection.execute(
                    select(usage_intervals.c.session_id).where(mine))}
        except DatabaseError as exc:
            log.warning("usage heartbeat not written: %s", exc)
            return
        # Another process took the session over (the replica, from the ingress's
        # wait) or ended it: its intervals are no longer this ledger's to renew.
        for session_id in set(open_now) - still:
            self._open.discard(session_id)
            self._frames_at_open.pop(session_id, None)
