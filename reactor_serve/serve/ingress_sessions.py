"""`IngressSessions`: the sessions of one model, as any ingress replica sees them.

It keeps nothing that a session needs: a session's record lives in the
`SessionDirectory` (Ray's GCS), and once placed the session lives in the model
replica that owns it, which every request about it reaches directly (`ReplicaCalls`).
So any ingress replica answers any request, and killing or redeploying one loses no
session. Until it is placed, a session waits for a slot in the `AdmissionQueue` of
the ingress replica that holds its wait; `DeploymentStatus` says whether the model
can take sessions at all, and how many.

This class is the SessionBackend and ViewerBackend contract over those three: it
reads a session's record and sends each request where the session is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from reactor_serve.protocol.errors import (
    NOT_CONNECTED_FOR_UPLOADS,
    UNKNOWN_UPLOAD,
    UNKNOWN_VIEWER_LINK,
    BackendError,
    ClipGone,
    ModelUnavailable,
    OfferRejected,
    UnknownClip,
    UnknownSession,
    UnknownStep,
    UnknownUpload,
    UploadRejected,
    ViewersUnavailable,
    session_ended,
)
from reactor_serve.rtc.ice_servers import (
    client_ice_servers,
    require_turn_secrets,
    session_ice_servers,
)
from reactor_serve.rtc.settings import IceServer
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.runtime.session import EndReason
from reactor_serve.serve.admission import AdmissionQueue, admission_error
from reactor_serve.serve.deployment_status import DeploymentStatus
from reactor_serve.serve.metrics import IngressMetrics
from reactor_serve.serve.replica_calls import REPLICA_DIED, ReplicaCalls, ReplicaDied
from reactor_serve.serve.session_directory import SessionDirectory, SessionRecord
from reactor_serve.sessions.contract import (
    AnswerPending,
    ClientIdentity,
    SdpAnswer,
    SessionInfo,
    SessionState,
    mask_session_id,
)
from reactor_serve.sessions.session_steps import check_steppable

__all__ = ["IngressSessions"]

log = logging.getLogger("reactor_serve.serve")

# What a viewer is told of a token that leads nowhere (never issued, revoked, its
# session ended): the same words whatever the case, naming no session.


class IngressSessions:
    """A SessionBackend over one model deployment, stateless across ingress replicas."""

    # A session that never gets an offer ends after this long.
    OFFER_TIMEOUT_S = 60.0
    # Trickled candidates kept for a session still waiting for a slot.
    MAX_EARLY_CANDIDATE_BATCHES = 16

    def __init__(
        self,
        spec: ModelSpec,
        handle: Any,
        directory: SessionDirectory,
        ice_servers: list[dict[str, Any]],
        metrics: IngressMetrics | None = None,
        *,
        actor_name: str | None,
        admission_timeout_s: float,
        deployment: DeploymentStatus | None = None,
        replicas: ReplicaCalls | None = None,
    ) -> None:
        """`handle` is the model's deployment handle; `actor_name` this ingress
        replica's Ray actor name, by which the other ingress replicas find out whether
        the waits it holds are still held (None outside an actor);
        `admission_timeout_s` the app's setting for the model. `deployment` and
        `replicas` replace what reads Serve's status and reaches the model replicas."""
        self._spec = spec
        self._directory = directory
        # Per waiting session: the lock its record's rewrites take here, and how many
        # requests hold or wait for it (see `_writing`).
        self._record_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # The app's STUN/TURN servers (IceServer as JSON): a TURN server with a secret
        # gets credentials minted per session; its secret must be readable here.
        self._ice_servers = [IceServer.model_validate(server) for server in ice_servers]
        require_turn_secrets(self._ice_servers)
        self._deployment = deployment or DeploymentStatus(
            spec.name, directory, admission_timeout_s=admission_timeout_s)
        self._replicas = replicas or ReplicaCalls(directory)
        self.admission = AdmissionQueue(
            spec.name, handle, directory, holder_name=actor_name,
            admission_timeout_s=self._deployment.admission_timeout_s,
            actor_alive=self._replicas.actor_alive, metrics=metrics,
        )

    @property
    def spec(self) -> ModelSpec:
        return self._spec

    # ---- SessionBackend -----------------------------------------------------------

    async def create_session(
        self,
        extra_args: dict[str, Any],
        client: ClientIdentity,
        *,
        generation: str = "streamed",
        max_duration_s: float | None = None,
    ) -> SessionInfo:
        check_steppable(self._spec, generation)
        await self._deployment.check_available()
        session_id = secrets.token_urlsafe(24)
        now = time.time()
        await self._directory.put(session_id, {
            "model": self._spec.name, "created_at": now, "extra_args": extra_args,
            "client": client.digest, "state": SessionState.CREATED, "next_cid": 1,
            "generation": generation,
            # Fixed here, in wall-clock time: the time spent waiting for a slot counts.
            "ends_at": now + max_duration_s if max_duration_s is not None else None,
        })
        if self._directory.events is not None:
            # Waiting for a slot, holding none: its replica takes over from "created".
            self._directory.events.session_state(session_id, SessionState.WAITING, now)
        return SessionInfo(session_id, SessionState.CREATED, now, dict(extra_args),
                           generation=generation)

    async def get_session(self, session_id: str) -> SessionInfo:
        record = await self._record(session_id)
        state = record["state"]
        end_reason, end_message = record.get("end_reason"), record.get("end_message")
        if state == "placed":
            result = await self._on_replica(session_id, record, "get", {})
            state, end_reason, end_message = result["state"], result["end_reason"], result["end_message"]
        elif state not in (SessionState.CREATED, SessionState.WAITING, SessionState.ENDED):
            state = SessionState.WAITING
        return SessionInfo(session_id, state, record["created_at"],
                           dict(record.get("extra_args") or {}), end_reason, end_message,
                           generation=str(record.get("generation") or "streamed"))

    async def submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
    ) -> int:
        async with self._writing(session_id):
            return await self._submit_offer(session_id, sdp_offer, track_mapping, connection_id)

    async def _submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None,
    ) -> int:
        record = await self._record(session_id, live=True)
        if record["state"] == "placed":
            return int(await self._on_replica(session_id, record, "offer", {
                "sdp_offer": sdp_offer, "track_mapping": track_mapping,
                "connection_id": connection_id,
            }))
        registered = list(record.get("registered") or [])
        if connection_id is not None and connection_id not in registered:
            raise UnknownSession(
                f"unknown connection {connection_id} for session {session_id}; "
                f"POST .../connections first"
            )
        cid = connection_id if connection_id is not None else int(record.get("next_cid", 1))
        offer = {"sdp_offer": sdp_offer, "track_mapping": track_mapping, "connection_id": cid,
                 "registered": connection_id is not None}
        # While the session waits for a slot, a newer offer replaces the queued one:
        # the replica that takes the session reads the latest from the record.
        admit = record["state"] == SessionState.CREATED or (
            not record.get("replica") and not await self.admission.holder_alive(session_id, record)
        )
        record.update(offer=offer, state=SessionState.WAITING, latest=cid,
                      next_cid=max(int(record.get("next_cid", 1)), cid + 1))
        if admit:
            # Claimed in the same write: this ingress replica holds the slot wait. The
            # claim publishes the position before this write says the session waits.
            await self.admission.claim(session_id, record)
        await self._directory.put(session_id, record)
        if admit:
            self.admission.admit(session_id, claimed=True)
        return cid

    async def register_connection(self, session_id: str) -> int:
        async with self._writing(session_id):
            return await self._register_connection(session_id)

    async def _register_connection(self, session_id: str) -> int:
        record = await self._record(session_id, live=True)
        if record["state"] == "placed":
            return int(await self._on_replica(session_id, record, "register", {}))
        cid = int(record.get("next_cid", 1))
        registered = [*(record.get("registered") or []), cid][-8:]
        await self._directory.update(session_id, next_cid=cid + 1, registered=registered)
        return cid

    async def poll_answer(self, session_id: str, connection_id: int | None) -> str | AnswerPending:
        record = await self._record(session_id)
        error = record.get("admission_error")
        if error is not None:
            raise admission_error(error)
        if record["state"] == SessionState.ENDED:
            raise _ended(session_id, record)
        if record["state"] == "placed":
            result = await self._on_replica(session_id, record, "poll",
                                            {"connection_id": connection_id})
            return AnswerPending(result["pending"]) if "pending" in result else result["sdp"]
        if connection_id is not None and connection_id not in (record.get("registered") or []) \
                and connection_id != record.get("latest"):
            raise UnknownSession(f"unknown connection {connection_id} for session {session_id}")
        if record["state"] == SessionState.CREATED or record.get("latest") is None:
            return AnswerPending({"status": "awaiting_offer"})
        if not record.get("replica") and not await self.admission.holder_alive(session_id, record):
            # The ingress replica that held this wait is gone: hold it here.
            self.admission.admit(session_id)
        return AnswerPending(await self.admission.status(session_id, record))

    async def add_ice_candidates(
        self, session_id: str, connection_id: int | None, candidates: list[Any], is_final: bool
    ) -> None:
        async with self._writing(session_id):
            await self._add_ice_candidates(session_id, connection_id, candidates, is_final)

    async def _add_ice_candidates(
        self, session_id: str, connection_id: int | None, candidates: list[Any], is_final: bool
    ) -> None:
        record = await self._record(session_id, live=True)
        if record["state"] == "placed":
            await self._on_replica(session_id, record, "candidates", {
                "connection_id": connection_id, "candidates": candidates, "is_final": is_final,
            })
            return
        if await self._directory.early_candidate_batches(session_id) >= self.MAX_EARLY_CANDIDATE_BATCHES:
            raise OfferRejected(
                f"at most {self.MAX_EARLY_CANDIDATE_BATCHES} candidate requests are kept "
                f"before the session has a slot"
            )
        key = await self._directory.keep_early_candidates(
            session_id, {"candidates": candidates, "is_final": is_final})
        # Placed meanwhile: its replica may have taken the kept batches before this one
        # landed. Whichever of us takes this one hands it over.
        placed = await self._record(session_id, live=True)
        if placed["state"] == "placed" and await self._directory.take_early_candidate(key) is not None:
            await self._on_replica(session_id, placed, "candidates", {
                "connection_id": None, "candidates": candidates, "is_final": is_final,
            })

    async def stop_session(self, session_id: str) -> None:
        record = await self._record(session_id)
        if record["state"] == SessionState.ENDED:
            return
        if record["state"] == "placed":
            try:
                await self._on_replica(session_id, record, "stop", {})
            except UnknownSession:
                pass  # it ended meanwhile, or its replica died: ended either way
            return
        # Not placed yet: end the record; a replica that takes the session later sees
        # that it ended and declines it.
        await self._directory.end(session_id, EndReason.CLIENT_CLOSED, "stopped by the client")
        self.admission.cancel(session_id)

    async def stop_unnamed(self, client: ClientIdentity) -> int:
        matched = 0
        for session_id, record in (await self._directory.records()).items():
            if record.get("model") != self._spec.name or record.get("client") != client.digest:
                continue
            if record.get("state") != "placed":
                continue
            try:
                matched += int(await self._on_replica(
                    session_id, record, "stop_unnamed", {"client": client.digest}
                ) or 0)
            except BackendError:
                continue
        return matched

    async def describe_sessions(self) -> list[dict[str, Any]]:
        described = []
        for session_id, record in (await self._directory.records()).items():
            if record.get("model") != self._spec.name or record.get("state") == SessionState.ENDED:
                continue
            described.append({
                "session": mask_session_id(session_id),
                "state": "queued" if record["state"] == SessionState.WAITING else record["state"],
                "replica": record.get("replica_id"),
                "node_id": record.get("node_id"),
                "node_ip": record.get("node_ip"),
                "gpu_ids": record.get("gpu_ids") or [],
                "created_at": record.get("created_at"),
            })
        return described

    async def health(self) -> dict[str, Any]:
        problem = await self._deployment.problem()
        return {"healthy": problem is None, "model": self._spec.name,
                **({"detail": problem} if problem else {})}

    def ice_servers(self, session_id: str) -> list[dict[str, Any]]:
        return client_ice_servers(session_ice_servers(self._ice_servers, session_id))

    # ---- viewers (ViewerBackend) ----------------------------------------------------
    #
    # The replica that owns a session keeps its viewers; the directory maps each viewer
    # token to its session, so any ingress replica routes a viewer's request there.
    # Viewers are no sessions: no record, no slot, nothing the autoscaler counts.

    async def viewer_link(self, session_id: str) -> dict[str, Any]:
        record = await self._record(session_id, live=True)
        if record["state"] != "placed":
            raise ViewersUnavailable(
                "the session is not streaming yet: ask for a viewer link once it streams"
            )
        link = await self._on_replica(session_id, record, "viewer_link", {})
        await self._directory.put_viewer(str(link["viewer_token"]), session_id, self._spec.name)
        return dict(link)

    async def revoke_viewers(self, session_id: str) -> bool:
        record = await self._record(session_id, live=True)
        if record["state"] != "placed":
            return False
        # The token's directory entry stays until a viewer tries it (then it is dropped).
        return bool(await self._on_replica(session_id, record, "viewer_revoke", {}))

    async def watch_info(self, viewer_token: str) -> dict[str, Any]:
        return dict(await self._on_watched(viewer_token, "watch_info", {}))

    async def watch_offer(
        self, viewer_token: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        return int(await self._on_watched(viewer_token, "watch_offer", {
            "sdp_offer": sdp_offer, "track_mapping": track_mapping,
        }))

    async def watch_poll(self, viewer_token: str, connection_id: int) -> SdpAnswer | AnswerPending:
        result = await self._on_watched(viewer_token, "watch_poll", {"connection_id": connection_id})
        if "pending" in result:
            return AnswerPending(result["pending"])
        return SdpAnswer(result["sdp"], connection_id)

    async def watch_ice_servers(self, viewer_token: str) -> list[dict[str, Any]]:
        await self._watched(viewer_token)
        return client_ice_servers(session_ice_servers(self._ice_servers, viewer_token))

    async def _watched(self, viewer_token: str) -> tuple[str, SessionRecord]:
        session_id = await self._linked_session(
            self._directory.viewer, viewer_token, UnknownSession(UNKNOWN_VIEWER_LINK)
        )
        try:
            record = await self._record(session_id, live=True)
        except UnknownSession:
            await self._directory.drop_viewer(viewer_token)
            raise UnknownSession(UNKNOWN_VIEWER_LINK) from None
        if record.get("state") != "placed":
            raise UnknownSession(UNKNOWN_VIEWER_LINK)
        return session_id, record

    async def _on_watched(self, viewer_token: str, op: str, args: dict[str, Any]) -> Any:
        session_id, record = await self._watched(viewer_token)
        try:
            return await self._on_replica(
                session_id, record, op, {**args, "viewer_token": viewer_token}
            )
        except UnknownSession:
            raise UnknownSession(UNKNOWN_VIEWER_LINK) from None
        except BackendError as exc:
            # A replica's message may name the session: a viewer must never learn it.
            raise type(exc)(str(exc).replace(session_id, "…"), exc.retry_after_s) from None

    # ---- uploads (UploadBackend) ----------------------------------------------------
    #
    # The replica that owns a session holds its uploads; the directory maps each upload
    # id to its session, so any ingress replica routes the upload's PUT there.

    async def create_upload(self, session_id: str, name: str, size: int, mime_type: str) -> str:
        record = await self._record(session_id, live=True)
        if record["state"] != "placed":
            raise UploadRejected(NOT_CONNECTED_FOR_UPLOADS)
        upload_id = str(await self._on_replica(session_id, record, "create_upload", {
            "name": name, "size": size, "mime_type": mime_type,
        }))
        await self._directory.put_upload(upload_id, session_id, self._spec.name)
        return upload_id

    async def upload_size(self, upload_id: str) -> int:
        return int(await self._on_upload(upload_id, "upload_size", {}))

    async def write_upload(self, upload_id: str, data: bytes) -> None:
        await self._on_upload(upload_id, "write_upload", {"data": data})

    async def _on_upload(self, upload_id: str, op: str, args: dict[str, Any]) -> Any:
        session_id = await self._linked_session(
            self._directory.upload, upload_id, UnknownUpload(UNKNOWN_UPLOAD)
        )
        try:
            record = await self._record(session_id, live=True)
            return await self._on_replica(session_id, record, op, {**args, "upload_id": upload_id})
        except UnknownSession:
            await self._directory.drop_uploads_of(session_id)
            raise UnknownUpload(UNKNOWN_UPLOAD) from None

    # ---- clips (ClipBackend) ----------------------------------------------------------
    #
    # A session's clips are files on the replica that owns it; the session id routes.

    async def clip_playlist(self, session_id: str, start: float, end: float) -> str | float:
        return await self._on_clip_replica(session_id, "clip_playlist", {"start": start, "end": end})

    async def clip_chunk(self, session_id: str, name: str) -> bytes:
        return await self._on_clip_replica(session_id, "clip_chunk", {"name": name})

    async def _on_clip_replica(self, session_id: str, op: str, args: dict[str, Any]) -> Any:
        record = await self._record(session_id)
        if record.get("state") == SessionState.ENDED:
            raise ClipGone(f"session {session_id} has ended: its clips are gone")
        if record["state"] != "placed":
            raise UnknownClip("this session has no clips yet")
        return await self._on_replica(session_id, record, op, args)

    # ---- kept steps (StepBackend) -------------------------------------------------------
    #
    # Kept by the replica that ran the session: also once the session has ended, for as
    # long as that replica runs and remembers it (SeatedSessionBackend.KEEP_ENDED).

    async def kept_steps(self, session_id: str) -> list[int]:
        return list(await self._on_step_replica(session_id, "kept_steps", {}))

    async def kept_step(self, session_id: str, step: int) -> dict[str, Any]:
        return dict(await self._on_step_replica(session_id, "kept_step", {"step": step}))

    async def kept_step_file(self, session_id: str, step: int, name: str) -> tuple[bytes, str]:
        data, content_type = await self._on_step_replica(
            session_id, "kept_step_file", {"step": step, "name": name})
        return data, content_type

    async def _on_step_replica(self, session_id: str, op: str, args: dict[str, Any]) -> Any:
        record = await self._record(session_id)
        if not record.get("replica"):
            raise UnknownStep("this session never ran on a replica: it has kept no step")
        try:
            return await self._replicas.call(session_id, record, op, args)
        except ReplicaDied:
            raise UnknownStep("the replica that kept this session's steps is gone") from None

    async def _linked_session(
        self, read: Callable[[str], Awaitable[dict[str, Any] | None]], key: str,
        unknown: BackendError,
    ) -> str:
        """The session a viewer token or an upload id leads to (`read`: the directory's
        lookup), raising `unknown` when it leads to none of this model's."""
        try:
            entry = await read(key)
        except Exception:
            raise ModelUnavailable("the session directory is unavailable; retry shortly",
                                   retry_after_s=1.0) from None
        if not entry or entry.get("model") != self._spec.name:
            raise unknown
        return str(entry.get("session_id"))

    # ---- for the ingress ----------------------------------------------------------

    async def capacity(self) -> dict[str, int | None]:
        """What `GET /models` shows of this model (see `DeploymentStatus.capacity`)."""
        return await self._deployment.capacity()

    async def end_all(self, reason: str, message: str) -> None:
        """End every live session of this model (the application is shutting down)."""
        for session_id, record in (await self._directory.records()).items():
            if record.get("model") != self._spec.name or record.get("state") == SessionState.ENDED:
                continue
            if record.get("state") == "placed":
                try:
                    await self._on_replica(session_id, record, "shutdown", {})
                except BackendError:
                    pass
            else:
                await self._directory.end(session_id, reason, message)

    # ---- records ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _writing(self, session_id: str) -> AsyncIterator[None]:
        """One request at a time rewrites a waiting session's record here: an offer and
        the candidates the official SDK trickles beside it each read, change and write
        the whole record, and interleaved, the later write lost the other's (a session
        placed with no offer)."""
        lock, users = self._record_locks.get(session_id, (asyncio.Lock(), 0))
        self._record_locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._record_locks[session_id]
            if users > 1:
                self._record_locks[session_id] = (lock, users - 1)
            else:
                del self._record_locks[session_id]

    async def _record(self, session_id: str, *, live: bool = False) -> SessionRecord:
        try:
            record = await self._directory.get(session_id)
        except Exception as exc:
            # The GCS is restarting: a retry in a moment will find the session.
            log.warning("reading session %s failed: %r", mask_session_id(session_id), exc)
            raise ModelUnavailable("the session directory is unavailable; retry shortly",
                                   retry_after_s=1.0) from None
        if record is None or record.get("model") != self._spec.name:
            raise UnknownSession(f"unknown session {session_id!r} for model {self._spec.name!r}")
        if (
            record.get("state") == SessionState.CREATED
            and time.time() - float(record.get("created_at", 0)) > self.OFFER_TIMEOUT_S
        ):
            await self._directory.end(session_id, EndReason.TIMEOUT,
                                      f"no offer came within {self.OFFER_TIMEOUT_S:g} s")
            record = await self._directory.get(session_id) or record
        if live and record.get("state") == SessionState.ENDED:
            raise _ended(session_id, record)
        return record

    async def _on_replica(
        self, session_id: str, record: SessionRecord, op: str, args: dict[str, Any]
    ) -> Any:
        """Run `op` on the replica that owns the session; its death ends the session."""
        try:
            return await self._replicas.call(session_id, record, op, args)
        except ReplicaDied:
            raise _ended(session_id, {"end_reason": EndReason.ERROR,
                                      "end_message": REPLICA_DIED}) from None


def _ended(session_id: str, record: SessionRecord) -> UnknownSession:
    return session_ended(session_id, record.get("end_reason"), record.get("end_message"))
