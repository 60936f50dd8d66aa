"""`SessionDirectory`: where a session lives, kept in Ray's GCS key-value store.

The ingress keeps no state whose loss ends a session: a session's record says which
model it belongs to, who started it (a `ClientIdentity` digest), what it was started
with, whether it waits for a slot (and which ingress replica holds that wait), which
model replica owns it once placed, and how it ended. Any ingress replica reads it,
so any ingress replica answers any request about any session, and a killed or
redeployed ingress loses nothing. The GCS outlives every Serve actor (and with GCS
fault tolerance, the head's restarts too).

Writes happen at the few moments a session changes hands (created, queued, placed,
ended), never while it streams: an idle live session costs the control plane
nothing. The records are small JSON objects under one prefix per application.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from reactor_serve.sessions.contract import SessionEvents, SessionState

__all__ = ["SessionDirectory", "SessionRecord"]

_NAMESPACE = "reactor_serve"

SessionRecord = dict[str, Any]


def _kv() -> Any:
    # Ray's own GCS key-value store (what Serve keeps its checkpoints in); imported
    # late so that this module imports without Ray initialised.
    from ray.experimental import internal_kv

    return internal_kv


class SessionDirectory:
    """Session records of one Serve application.

    Record fields: `model`, `created_at` (wall clock), `extra_args`, `client`
    (identity digest), `state` (created | waiting | placed | ended), `holder` (the
    actor name of the ingress replica holding the slot wait), `replica` (the actor
    name of the model replica that owns the session), `admission_error`
    (`{"status", "detail", "retry_after_s"}` when no slot was had), `end_reason`,
    `end_message`, `ended_at`; once placed, also `replica_id`, `node_id` and `node_ip`
    (the Ray node the owning replica runs on) and `gpu_ids`, written with the placement.
    """

    # Ended sessions are remembered this long, so a late poll learns why.
    KEEP_ENDED_S = 300.0

    def __init__(self, app_name: str) -> None:
        self._prefix = f"{app_name}/session/"
        self._queue_prefix = f"{app_name}/queue/"
        self._models_prefix = f"{app_name}/model/"
        self._viewer_prefix = f"{app_name}/viewer/"
        self._upload_prefix = f"{app_name}/upload/"
        # `<session id>/<upload id>` for each upload: what to drop when the session ends,
        # kept apart from the session's record, which has other writers.
        self._uploads_of_prefix = f"{app_name}/uploads-of/"
        # `<session id>/<stamp>` for each batch of candidates trickled before the session
        # is placed: written apart from the record, so that a candidate request on one
        # ingress replica never overwrites an offer written by another.
        self._early_prefix = f"{app_name}/early-candidates/"
        # Told each session this directory ends (usage metering, in the ingress): the
        # ends of sessions no replica ran, and of those whose replica died.
        self.events: SessionEvents | None = None

    def _key(self, session_id: str) -> bytes:
        return (self._prefix + session_id).encode()

    # ---- sessions ---------------------------------------------------------------

    async def put(self, session_id: str, record: SessionRecord) -> None:
        data = json.dumps(record, allow_nan=False).encode()
        await asyncio.to_thread(_kv()._internal_kv_put, self._key(session_id), data,
                                True, namespace=_NAMESPACE)

    async def get(self, session_id: str) -> SessionRecord | None:
        raw = await asyncio.to_thread(_kv()._internal_kv_get, self._key(session_id),
                                      namespace=_NAMESPACE)
        if raw is None:
            return None
        record: SessionRecord = json.loads(raw)
        if record.get("state") == "ended" and time.time() - record.get("ended_at", 0) > self.KEEP_ENDED_S:
            await self.delete(session_id)
            return None
        return record

    async def update(self, session_id: str, **fields: Any) -> SessionRecord | None:
        """Merge `fields` into the record; None when there is no record.

        Not atomic: each field has one writer at a time (the ingress until the session
        is placed, then its replica), which is what keeps this safe.
        """
        record = await self.get(session_id)
        if record is None:
            return None
        record.update(fields)
        await self.put(session_id, record)
        return record

    async def end(self, session_id: str, reason: str, message: str | None) -> None:
        record = await self.get(session_id)
        if record is None or record.get("state") == "ended":
            return
        ended_at = time.time()
        record.update(state="ended", end_reason=reason, end_message=message, ended_at=ended_at)
        await self.put(session_id, record)
        if self.events is not None:
            self.events.session_state(session_id, SessionState.ENDED, ended_at, reason=reason)
        # The session's uploads went with it (on its replica); so do their ids.
        await self.drop_uploads_of(session_id)
        await self.drop_early_candidates(session_id)

    async def delete(self, session_id: str) -> None:
        await asyncio.to_thread(_kv()._internal_kv_del, self._key(session_id),
                                namespace=_NAMESPACE)
        await self.drop_position(session_id)

    async def records(self) -> dict[str, SessionRecord]:
        """Every record of the application, for operators and shutdown: O(sessions),
        never on a session's own path."""
        keys = await asyncio.to_thread(_kv()._internal_kv_list, self._prefix.encode(),
                                       namespace=_NAMESPACE)
        found: dict[str, SessionRecord] = {}
        for key in keys:
            session_id = key.decode()[len(self._prefix):]
            record = await self.get(session_id)
            if record is not None:
                found[session_id] = record
        return found

    async def session_counts(self, model: str, *, max_wait_s: float | None = None) -> dict[str, Any]:
        """`{"live", "waiting", "by_replica"}`: `model`'s placed sessions, those
        waiting for a seat, and the placed ones per replica actor. A wait queued longer
        than `max_wait_s` ago is not counted: its holder would have ended it by then,
        so nothing holds it any more (its ingress replica died and its client went
        away)."""
        live = waiting = 0
        by_replica: dict[str, int] = {}
        now = time.time()
        for record in (await self.records()).values():
            if record.get("model") != model:
                continue
            state = record.get("state")
            if state == "placed":
                live += 1
                replica = str(record.get("replica") or "")
                by_replica[replica] = by_replica.get(replica, 0) + 1
            elif state == "waiting":
                queued_at = record.get("queued_at")
                if max_wait_s is None or not isinstance(queued_at, (int, float)) \
                        or now - queued_at <= max_wait_s:
                    waiting += 1
        return {"live": live, "waiting": waiting, "by_replica": by_replica}

    # ---- queue positions ----------------------------------------------------------
    #
    # Under keys of their own: the ingress replica holding a wait rewrites them as the
    # queue moves, and a read-modify-write of the session's record at that moment
    # could undo the replica placing the session. A session's position is written
    # before its record first says it waits and is dropped only with the record, so
    # whoever reads a waiting record finds a position after it.

    async def put_position(self, session_id: str, position: int, eta_s: float | None) -> None:
        data = json.dumps({"position": position, "eta_s": eta_s}).encode()
        await asyncio.to_thread(_kv()._internal_kv_put, (self._queue_prefix + session_id).encode(),
                                data, True, namespace=_NAMESPACE)

    async def position(self, session_id: str) -> dict[str, Any]:
        raw = await asyncio.to_thread(_kv()._internal_kv_get,
                                      (self._queue_prefix + session_id).encode(),
                                      namespace=_NAMESPACE)
        return json.loads(raw) if raw else {}

    async def drop_position(self, session_id: str) -> None:
        await asyncio.to_thread(_kv()._internal_kv_del, (self._queue_prefix + session_id).encode(),
                                namespace=_NAMESPACE)

    # ---- per-model settings the ingress needs -----------------------------------

    def publish_model(self, name: str, settings: dict[str, Any]) -> None:
        """From a model replica's constructor, which Serve runs outside its event loop:
        hence a plain blocking write."""
        _kv()._internal_kv_put((self._models_prefix + name).encode(),
                               json.dumps(settings, allow_nan=False).encode(), True,
                               namespace=_NAMESPACE)

    async def model_settings(self, name: str) -> dict[str, Any]:
        raw = await asyncio.to_thread(_kv()._internal_kv_get,
                                      (self._models_prefix + name).encode(),
                                      namespace=_NAMESPACE)
        return json.loads(raw) if raw else {}

    # ---- candidates trickled before placement -----------------------------------------
    #
    # Each batch is taken exactly once, by deleting its key: the replica that places the
    # session takes those kept so far, and an ingress replica that finds the session
    # placed right after keeping a batch takes that one back to hand it over itself.

    async def keep_early_candidates(self, session_id: str, batch: dict[str, Any]) -> str:
        """Keep `batch` for the replica that will place the session; its key."""
        key = f"{session_id}/{time.time_ns():020d}-{secrets.token_hex(4)}"
        await self._put_link(self._early_prefix, key, batch)
        return key

    async def early_candidate_batches(self, session_id: str) -> int:
        return len(await self._early_keys(session_id))

    async def take_early_candidates(self, session_id: str) -> list[dict[str, Any]]:
        """Every batch kept for the session and not yet taken, oldest first."""
        taken = []
        for key in sorted(await self._early_keys(session_id)):
            batch = await self.take_early_candidate(key)
            if batch is not None:
                taken.append(batch)
        return taken

    async def take_early_candidate(self, key: str) -> dict[str, Any] | None:
        """The batch under `key` if this call took it; None when another did first."""
        batch = await self._link(self._early_prefix, key)
        deleted = await asyncio.to_thread(_kv()._internal_kv_del, (self._early_prefix + key).encode(),
                                          namespace=_NAMESPACE)
        return batch if deleted else None

    async def drop_early_candidates(self, session_id: str) -> None:
        await asyncio.to_thread(_kv()._internal_kv_del, f"{self._early_prefix}{session_id}/".encode(),
                                del_by_prefix=True, namespace=_NAMESPACE)

    async def _early_keys(self, session_id: str) -> list[str]:
        keys = await asyncio.to_thread(_kv()._internal_kv_list,
                                       f"{self._early_prefix}{session_id}/".encode(),
                                       namespace=_NAMESPACE)
        return [key.decode()[len(self._early_prefix):] for key in keys]

    # ---- viewer links and uploads ----------------------------------------------------
    #
    # A viewer token, or an upload id, leads to its session here, under a key of its
    # own: the viewer and upload routes find the session's replica without the
    # request naming the session.

    async def put_viewer(self, viewer_token: str, session_id: str, model: str) -> None:
        await self._put_link(self._viewer_prefix, viewer_token,
                             {"session_id": session_id, "model": model})

    async def viewer(self, viewer_token: str) -> dict[str, Any] | None:
        """`{"session_id", "model"}` of a viewer token, or None."""
        return await self._link(self._viewer_prefix, viewer_token)

    async def drop_viewer(self, viewer_token: str) -> None:
        await self._drop_link(self._viewer_prefix, viewer_token)

    async def put_upload(self, upload_id: str, session_id: str, model: str) -> None:
        await self._put_link(self._uploads_of_prefix, f"{session_id}/{upload_id}", {})
        await self._put_link(self._upload_prefix, upload_id,
                             {"session_id": session_id, "model": model})

    async def upload(self, upload_id: str) -> dict[str, Any] | None:
        """`{"session_id", "model"}` of an upload id, or None."""
        return await self._link(self._upload_prefix, upload_id)

    async def drop_uploads_of(self, session_id: str) -> None:
        """Forget every upload id of a session."""
        prefix = f"{self._uploads_of_prefix}{session_id}/"
        keys = await asyncio.to_thread(_kv()._internal_kv_list, prefix.encode(),
                                       namespace=_NAMESPACE)
        for key in keys:
            upload_id = key.decode()[len(prefix):]
            await self._drop_link(self._upload_prefix, upload_id)
            await self._drop_link(prefix, upload_id)

    async def _put_link(self, prefix: str, key: str, entry: dict[str, Any]) -> None:
        await asyncio.to_thread(_kv()._internal_kv_put, (prefix + key).encode(),
                                json.dumps(entry).encode(), True, namespace=_NAMESPACE)

    async def _link(self, prefix: str, key: str) -> dict[str, Any] | None:
        raw = await asyncio.to_thread(_kv()._internal_kv_get, (prefix + key).encode(),
                                      namespace=_NAMESPACE)
        return json.loads(raw) if raw else None

    async def _drop_link(self, prefix: str, key: str) -> None:
        await asyncio.to_thread(_kv()._internal_kv_del, (prefix + key).encode(),
                                namespace=_NAMESPACE)
