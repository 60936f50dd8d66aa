"""`MemoryDirectory`: `SessionDirectory`'s interface over dicts, for the ingress's
pieces tested without Ray (no GCS behind it, so records never expire)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["MemoryDirectory"]


class MemoryDirectory:
    """Session records, queue positions and model settings of one application.

    Each write first awaits `_write()`, which a subclass may hold back to stand for a
    slow GCS."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.positions: dict[str, dict[str, Any]] = {}
        self.settings: dict[str, Any] = {} if settings is None else dict(settings)
        # key -> batch of candidates kept before placement (SessionDirectory's semantics).
        self.early: dict[str, dict[str, Any]] = {}
        self.settings_reads = 0
        self.count_reads = 0
        self.max_wait_asked: float | None = None

    async def _write(self) -> None:
        pass

    async def put(self, session_id: str, record: dict[str, Any]) -> None:
        await self._write()
        self.records[session_id] = dict(record)

    async def get(self, session_id: str) -> dict[str, Any] | None:
        record = self.records.get(session_id)
        return dict(record) if record is not None else None

    async def update(self, session_id: str, **fields: Any) -> dict[str, Any] | None:
        await self._write()
        if session_id not in self.records:
            return None
        self.records[session_id].update(fields)
        return dict(self.records[session_id])

    async def end(self, session_id: str, reason: str, message: str | None) -> None:
        await self._write()
        record = self.records.get(session_id)
        if record is not None and record["state"] != "ended":
            record.update(state="ended", end_reason=reason, end_message=message,
                          ended_at=time.time())

    async def put_position(self, session_id: str, position: int, eta_s: float | None) -> None:
        await self._write()
        self.positions[session_id] = {"position": position, "eta_s": eta_s}

    async def position(self, session_id: str) -> dict[str, Any]:
        return dict(self.positions.get(session_id, {}))

    async def drop_position(self, session_id: str) -> None:
        await self._write()
        self.positions.pop(session_id, None)

    async def model_settings(self, name: str) -> dict[str, Any]:
        self.settings_reads += 1
        return dict(self.settings)

    async def session_counts(self, model: str, *, max_wait_s: float | None = None) -> dict[str, Any]:
        self.count_reads += 1
        self.max_wait_asked = max_wait_s
        records = [r for r in self.records.values() if r.get("model") == model]
        states = [r.get("state") for r in records]
        by_replica: dict[str, int] = {}
        for record in records:
            if record.get("state") == "placed":
                replica = str(record.get("replica") or "")
                by_replica[replica] = by_replica.get(replica, 0) + 1
        return {"live": states.count("placed"), "waiting": states.count("waiting"),
                "by_replica": by_replica}

    async def keep_early_candidates(self, session_id: str, batch: dict[str, Any]) -> str:
        await self._write()
        key = f"{session_id}/{time.time_ns():020d}-{len(self.early)}"
        self.early[key] = dict(batch)
        return key

    async def early_candidate_batches(self, session_id: str) -> int:
        return sum(key.startswith(f"{session_id}/") for key in self.early)

    async def take_early_candidates(self, session_id: str) -> list[dict[str, Any]]:
        keys = sorted(key for key in self.early if key.startswith(f"{session_id}/"))
        return [self.early.pop(key) for key in keys]

    async def take_early_candidate(self, key: str) -> dict[str, Any] | None:
        return self.early.pop(key, None)
