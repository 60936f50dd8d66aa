"""Usage per key and model over a time window, from the ledger's intervals: the
seconds sessions spent waiting, ready and orphaned, the replica-seconds they held and
the frames they were sent. Intervals are cut at the window's edges; one still open
counts up to now."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import or_, select

from reactor_serve.access.database import Database
from reactor_serve.access.schema import session_owners, usage_intervals

__all__ = ["usage"]


def usage(database: Database, *, start: float, end: float, now: float,
          key_id: str | None = None) -> list[dict[str, Any]]:
    """One row per (key, model) with any usage in [start, end), ordered by key then
    model: `{key_id, model, sessions, waiting_s, ready_s, orphaned_s, replica_s,
    frames}`."""
    query = (
        select(usage_intervals, session_owners.c.key_id, session_owners.c.model)
        .join(session_owners, session_owners.c.session_id == usage_intervals.c.session_id)
        .where(usage_intervals.c.started_at < end,
               or_(usage_intervals.c.ended_at.is_(None), usage_intervals.c.ended_at > start))
    )
    if key_id is not None:
        query = query.where(session_owners.c.key_id == key_id)
    totals: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {
        "sessions": set(), "waiting_s": 0.0, "ready_s": 0.0, "orphaned_s": 0.0,
        "replica_s": 0.0, "frames": 0})
    with database.begin() as connection:
        for row in connection.execute(query):
            closes = row.ended_at if row.ended_at is not None else max(now, row.seen_at)
            length = closes - row.started_at
            inside = min(end, closes) - max(start, row.started_at)
            if inside <= 0:
                continue
            entry = totals[(row.key_id, row.model)]
            entry["sessions"].add(row.session_id)
            entry[f"{row.state}_s"] += inside
            if row.held:
                entry["replica_s"] += inside
            # Frames are counted per interval: a cut interval gets its share.
            entry["frames"] += round(row.frames * (inside / length if length > 0 else 1.0))
    return [
        {"key_id": key, "model": model, **{name: (len(value) if name == "sessions" else
                                                  round(value, 3) if isinstance(value, float)
                                                  else value)
                                           for name, value in entry.items()}}
        for (key, model), entry in sorted(totals.items())
    ]

