"""`IngressSessions`: the sessions of one model, as any ingress replica sees them.

It keeps nothing that a session needs: a session's record lives in the
`SessionDirectory` (Ray's GCS), and once placed the session lives in the model
replica that owns it, which every request about it reaches directly
(`replica.control_call` through Ray's `__ray_call__`). So any ingress replica answers
any request, and killing or redeploying one loses no session.

Admission: a session's first offer opens the replica call `session(...)` through the
model's deployment handle. With every replica busy the call waits in Serve's queue
(which is what the autoscaling policy counts); meanwhile a polling client is told
its position, and after `admission_timeout_s` it gets 503 with Retry-After. The
ingress replica that issued the call is the session's `holder` while it waits; if
that replica dies, the next ingress replica asked about the session takes the wait
over. Once placed, the holder only watches the call, to learn at once when the
replica dies.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from reactor_serve.protocol import errors as error_kinds
from reactor_serve.protocol.errors import (
    BackendError,
    ModelBusy,
    ModelUnavailable,
    OfferRejected,
    UnknownSession,
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
from reactor_serve.serve.cached_reading import CachedReading
from reactor_serve.serve.metrics import IngressMetrics
from reactor_serve.serve.replica import SERVE_ACTOR_NAMESPACE, control_call
from reactor_serve.serve.session_directory import SessionDirectory, SessionRecord
from reactor_serve.sessions.contract import (
    AnswerPending,
    ClientIdentity,
    SdpAnswer,
    SessionInfo,
    SessionState,
    mask_session_id,
)

__all__ = ["AdmissionTimeout", "IngressSessions"]

log = logging.getLogger("reactor_serve.serve")

# What a viewer is told of a token that leads nowhere (never issued, revoked, its
# session ended): the same words whatever the case, naming no session.
_VIEWER_GONE = "unknown viewer link, or the session it watched has ended"

# What a replica's death is reported as, to the client and in the record.
REPLICA_DIED = "the replica running this session died"


class AdmissionTimeout(ModelBusy):
    """No replica took the session within `admission_timeout_s`."""

    status = 503


class IngressSessions:
    """A SessionBackend over one model deployment, stateless across ingress replicas."""

    # A session that never gets an offer ends after this long.
    OFFER_TIMEOUT_S = 60.0
    # How long a deployment-status, model-settings or session-count reading is reused.
    STATUS_TTL_S = 2.0
    # Serve's replica states counted as a replica being started.
    STARTING_REPLICA_STATES = ("STARTING", "RECOVERING")
    # The longest an ingress waits for a replica's answer to a control call.
    CONTROL_TIMEOUT_S = 15.0
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
        deployment_name: str | None = None,
    ) -> None:
        self._spec = spec
        self.handle = handle
        self._directory = directory
        # The app's STUN/TURN servers (IceServer as JSON): a TURN server with a secret
        # gets credentials minted per session; its secret must be readable here.
        self._ice_servers = [IceServer.model_validate(server) for server in ice_servers]
        require_turn_secrets(self._ice_servers)
        self._metrics = metrics
        self._deployment = deployment_name or f"model-{spec.name}"
        # Sessions whose slot wait this ingress replica holds: session id -> task.
        self._admissions: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._queue: list[str] = []
        self._queued_at: dict[str, float] = {}
        self._recent_wait_s: float | None = None
        self._status = CachedReading(self._read_status, self.STATUS_TTL_S)
        self._settings = CachedReading(self._read_settings, self.STATUS_TTL_S)
        self._occupancy = CachedReading(self._read_occupancy, self.STATUS_TTL_S)
        self._actors: dict[tuple[str, str], Any] = {}
        self._me = _own_actor_name()

    @property
    def spec(self) -> ModelSpec:
        return self._spec

    # ---- SessionBackend -----------------------------------------------------------

    async def create_session(self, extra_args: dict[str, Any], client: ClientIdentity) -> SessionInfo:
        await self._check_available()
        session_id = secrets.token_urlsafe(24)
        now = time.time()
        await self._directory.put(session_id, {
            "model": self._spec.name, "created_at": now, "extra_args": extra_args,
            "client": client.digest, "state": SessionState.CREATED, "next_cid": 1,
        })
        return SessionInfo(session_id, SessionState.CREATED, now, dict(extra_args))

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
                           dict(record.get("extra_args") or {}), end_reason, end_message)

    async def submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
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
            not record.get("replica") and not await self._holder_alive(session_id, record)
        )
        record.update(offer=offer, state=SessionState.WAITING, latest=cid,
                      next_cid=max(int(record.get("next_cid", 1)), cid + 1))
        if admit:
            # Claimed in the same write: this ingress replica holds the slot wait.
            record.update(holder=self._me, holder_namespace=SERVE_ACTOR_NAMESPACE,
                          queued_at=time.time())
            # Published before the record says the session waits, so that no poll, on
            # any ingress replica, finds a wait without a position.
            position = len(self._queue) + 1
            await self._directory.put_position(session_id, position, self._eta(position))
        await self._directory.put(session_id, record)
        if admit:
            self._admit(session_id, claimed=True)
        return cid

    async def register_connection(self, session_id: str) -> int:
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
            raise _backend_error(error)
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
        if not record.get("replica") and not await self._holder_alive(session_id, record):
            # The ingress replica that held this wait is gone: hold it here.
            self._admit(session_id)
        return AnswerPending(await self._queue_status(session_id, record))

    async def add_ice_candidates(
        self, session_id: str, connection_id: int | None, candidates: list[Any], is_final: bool
    ) -> None:
        record = await self._record(session_id, live=True)
        if record["state"] == "placed":
            await self._on_replica(session_id, record, "candidates", {
                "connection_id": connection_id, "candidates": candidates, "is_final": is_final,
            })
            return
        batches = list(record.get("early_candidates") or [])
        if len(batches) >= self.MAX_EARLY_CANDIDATE_BATCHES:
            raise OfferRejected(
                f"at most {self.MAX_EARLY_CANDIDATE_BATCHES} candidate requests are kept "
                f"before the session has a slot"
            )
        batches.append({"candidates": candidates, "is_final": is_final})
        await self._directory.update(session_id, early_candidates=batches)

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
        task = self._admissions.get(session_id)
        if task is not None:
            task.cancel()

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
        problem = await self._problem()
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
        try:
            entry = await self._directory.viewer(viewer_token)
        except Exception:
            raise ModelUnavailable("the session directory is unavailable; retry shortly",
                                   retry_after_s=1.0) from None
        if not entry or entry.get("model") != self._spec.name:
            raise UnknownSession(_VIEWER_GONE)
        session_id = str(entry.get("session_id"))
        try:
            record = await self._record(session_id, live=True)
        except UnknownSession:
            await self._directory.drop_viewer(viewer_token)
            raise UnknownSession(_VIEWER_GONE) from None
        if record.get("state") != "placed":
            raise UnknownSession(_VIEWER_GONE)
        return session_id, record

    async def _on_watched(self, viewer_token: str, op: str, args: dict[str, Any]) -> Any:
        session_id, record = await self._watched(viewer_token)
        try:
            return await self._on_replica(
                session_id, record, op, {**args, "viewer_token": viewer_token}
            )
        except UnknownSession:
            raise UnknownSession(_VIEWER_GONE) from None
        except BackendError as exc:
            # A replica's message may name the session: a viewer must never learn it.
            raise type(exc)(str(exc).replace(session_id, "…"), exc.retry_after_s) from None

    # ---- for the ingress ----------------------------------------------------------

    async def capacity(self) -> dict[str, int | None]:
        """What `GET /models` shows of this model: `replicas` running, `starting`,
        `busy` (running a live session), `free`, `waiting` sessions, `max_replicas`.

        Replica counts are Serve's own (`serve.status()`), sessions are the session
        directory's, `max_replicas` is what the model's replicas published of their
        deployment; each reading is reused for `STATUS_TTL_S`, so pollers cost the
        controller and the GCS one read per interval. A count not known (Serve's
        controller did not answer, or no replica has started yet) is None.
        """
        overview, occupancy, settings = await asyncio.gather(
            self._status.get(), self._occupancy.get(), self._settings.get()
        )
        replicas = starting = free = None
        # One session per replica; the cap keeps a record that outlived its replica
        # (both it and its holder died) from counting a busy replica that is not there.
        busy = occupancy["live"]
        if overview is not None:
            states = overview.replica_states
            replicas = int(states.get("RUNNING", 0))
            starting = sum(int(states.get(state, 0)) for state in self.STARTING_REPLICA_STATES)
            busy = min(busy, replicas)
            free = replicas - busy
        max_replicas = settings.get("max_replicas")
        return {
            "replicas": replicas,
            "starting": starting,
            "busy": busy,
            "free": free,
            "waiting": occupancy["waiting"],
            "max_replicas": int(max_replicas) if isinstance(max_replicas, int) else None,
        }

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
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            actor = self._actor(record["replica"], record.get("replica_namespace") or SERVE_ACTOR_NAMESPACE)
            ref = actor.__ray_call__.remote(control_call, op, session_id, args)
            result = await asyncio.wait_for(ref, self.CONTROL_TIMEOUT_S)
        except (RayActorError, ValueError) as exc:
            log.warning("session %s: its replica %s is gone: %r", mask_session_id(session_id),
                        record.get("replica"), exc)
            await self._directory.end(session_id, EndReason.ERROR, REPLICA_DIED)
            raise UnknownSession(f"session {session_id} has ended: error: {REPLICA_DIED}") from None
        except (asyncio.TimeoutError, GetTimeoutError):
            raise ModelUnavailable(
                f"the replica running session {session_id} did not answer within "
                f"{self.CONTROL_TIMEOUT_S:g} s", retry_after_s=1.0,
            ) from None
        if "error" in result:
            raise _backend_error(result["error"])
        return result["ok"]

    def _actor(self, name: str, namespace: str) -> Any:
        import ray

        key = (name, namespace)
        actor = self._actors.get(key)
        if actor is None:
            actor = self._actors[key] = ray.get_actor(name, namespace=namespace)
            while len(self._actors) > 1024:
                self._actors.pop(next(iter(self._actors)))
        return actor

    async def _holder_alive(self, session_id: str, record: SessionRecord) -> bool:
        holder = record.get("holder")
        if not holder:
            return False
        if holder == self._me:
            return session_id in self._admissions
        import ray

        try:
            await asyncio.to_thread(
                ray.get_actor, holder, namespace=record.get("holder_namespace") or SERVE_ACTOR_NAMESPACE
            )
        except ValueError:
            return False
        return True

    # ---- admission ----------------------------------------------------------------

    def _admit(self, session_id: str, *, claimed: bool = False) -> None:
        if session_id in self._admissions:
            return
        task = asyncio.get_running_loop().create_task(
            self._hold(session_id, claimed), name=f"reactor-admission-{mask_session_id(session_id)}"
        )
        self._admissions[session_id] = task
        task.add_done_callback(lambda _: self._admissions.pop(session_id, None))

    async def _hold(self, session_id: str, claimed: bool) -> None:
        """Issue the session's slot call and watch it to its end."""
        from ray.exceptions import RayActorError

        settings = await self._model_settings()
        timeout = float(settings.get("admission_timeout_s", 60.0))
        self._queued_at[session_id] = time.monotonic()
        self._queue.append(session_id)
        self._report_waiting()
        placed = False
        try:
            if not claimed:
                await self._directory.update(session_id, holder=self._me, queued_at=time.time(),
                                             holder_namespace=SERVE_ACTOR_NAMESPACE)
            response = self.handle.options(stream=True).session.remote({"session_id": session_id})
            try:
                first = await asyncio.wait_for(response.__anext__(), timeout)
            except asyncio.TimeoutError:
                response.cancel()
                retry = max(1.0, self._recent_wait_s or 5.0)
                await self._directory.update(session_id, admission_error={
                    "kind": "AdmissionTimeout", "status": 503, "retry_after_s": retry,
                    "message": f"model {self._spec.name!r}: every replica is busy and none "
                               f"freed up within {timeout:g} s; try again",
                })
                await self._directory.end(session_id, EndReason.TIMEOUT, "no slot was free in time")
                return
            finally:
                self._leave_queue(session_id)
            if first.get("type") == "placed_elsewhere":
                return  # another ingress replica's call placed it first
            if first.get("type") == "rejected":
                await self._directory.update(session_id, admission_error={
                    "kind": first.get("kind") or "OfferRejected",
                    "status": first.get("status", 400), "message": first.get("detail", ""),
                    "retry_after_s": first.get("retry_after_s"),
                })
                await self._directory.end(session_id, EndReason.ERROR, first.get("detail"))
                return
            placed = True
            async for _ in response:
                pass
        except asyncio.CancelledError:
            raise
        except (RayActorError, Exception) as exc:  # noqa: B014 - named for the reader
            log.warning("session %s: the replica call failed: %r", mask_session_id(session_id), exc)
            await self._directory.end(
                session_id, EndReason.ERROR,
                REPLICA_DIED if placed else f"the session could not be placed: {type(exc).__name__}",
            )
        finally:
            # Also when the directory write before the slot call failed or was
            # cancelled: an id left in the queue would stay there for good, ahead of
            # every later session.
            if session_id in self._queue:
                self._leave_queue(session_id)

    def _leave_queue(self, session_id: str) -> None:
        if session_id in self._queue:
            # Its published position stays until the record goes (the directory drops
            # both): a poll that read the record while it still waited reads the
            # position after it, maybe after the wait ended.
            self._queue.remove(session_id)
            waited = time.monotonic() - self._queued_at.pop(session_id, time.monotonic())
            self._recent_wait_s = (
                waited if self._recent_wait_s is None else 0.7 * self._recent_wait_s + 0.3 * waited
            )
            if self._metrics is not None:
                self._metrics.wait.observe(waited, tags={"model": self._spec.name})
        self._report_waiting()

    async def _queue_status(self, session_id: str, record: SessionRecord) -> dict[str, Any]:
        # Serve's queue is per caller, so the ingress replica holding the wait knows
        # the position; it publishes it for the others to read.
        if session_id in self._queue:
            position: int | None = self._queue.index(session_id) + 1
            eta = self._eta(position)
        else:
            published = await self._directory.position(session_id)
            position, eta = published.get("position"), published.get("eta_s")
        waited = time.time() - float(record.get("queued_at") or time.time())
        return {"status": "queued", "position": position, "eta_s": eta,
                "waited_s": round(max(0.0, waited), 1)}

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _eta(self, position: int) -> float | None:
        if self._recent_wait_s is None:
            return None
        return round(self._recent_wait_s * position, 1)

    async def _publish_positions(self) -> None:
        for index, session_id in enumerate(list(self._queue)):
            try:
                await self._directory.put_position(session_id, index + 1, self._eta(index + 1))
            except Exception:
                log.warning("publishing the queue position of %s failed",
                            mask_session_id(session_id), exc_info=True)

    def _report_waiting(self) -> None:
        if self._queue:
            self._spawn(self._publish_positions())
        if self._metrics is not None:
            self._metrics.waiting.set(len(self._queue), tags={"model": self._spec.name})

    # ---- model availability -------------------------------------------------------

    async def _model_settings(self) -> dict[str, Any]:
        return await self._settings.get()

    async def _read_settings(self) -> dict[str, Any]:
        try:
            return await self._directory.model_settings(self._spec.name)
        except Exception:
            return {}

    async def _read_occupancy(self) -> dict[str, int]:
        settings = await self._model_settings()
        # A wait outlives admission_timeout_s only when nothing holds it any more.
        max_wait = float(settings.get("admission_timeout_s", 60.0)) + self.STATUS_TTL_S
        try:
            return await self._directory.session_counts(self._spec.name, max_wait_s=max_wait)
        except Exception as exc:
            log.warning("counting the sessions of %s failed: %r", self._spec.name, exc)
            return {"live": 0, "waiting": 0}

    async def _check_available(self) -> None:
        problem = await self._problem()
        if problem:
            raise ModelUnavailable(problem, retry_after_s=5.0)

    async def _problem(self) -> str | None:
        """Why the model's deployment cannot run any session (its load() failed),
        so a client gets the model's error instead of a wait that never ends."""
        deployment = await self._status.get()
        if deployment is None:
            return None  # outside Serve, or the controller is busy: let it try
        if deployment.replica_states.get("RUNNING", 0) == 0 and str(deployment.status) in (
            "DeploymentStatus.DEPLOY_FAILED", "DeploymentStatus.UNHEALTHY",
            "DEPLOY_FAILED", "UNHEALTHY",
        ):
            first_line = (deployment.message or "").strip().splitlines()
            detail = first_line[0] if first_line else str(deployment.status)
            return f"model {self._spec.name!r} is not available: {detail}"
        return None

    async def _read_status(self) -> Any:
        """The model deployment's `DeploymentStatusOverview` from Serve's controller
        (off the event loop: `serve.status()` blocks); None when it cannot be had."""
        return await asyncio.to_thread(self._read_status_blocking)

    def _read_status_blocking(self) -> Any:
        try:
            from ray import serve

            context = serve.get_replica_context()
            return serve.status().applications[context.app_name].deployments[self._deployment]
        except Exception:
            return None


def _ended(session_id: str, record: SessionRecord) -> UnknownSession:
    return session_ended(session_id, record.get("end_reason"), record.get("end_message"))


def _backend_error(error: dict[str, Any]) -> BackendError:
    """The BackendError a replica (or a failed admission) reported, by its kind."""
    kind = getattr(error_kinds, str(error.get("kind")), None)
    if kind is None and error.get("kind") == "AdmissionTimeout":
        kind = AdmissionTimeout
    if not (isinstance(kind, type) and issubclass(kind, BackendError)):
        kind = OfferRejected if int(error.get("status", 400)) < 500 else ModelUnavailable
    return kind(str(error.get("message", "")), error.get("retry_after_s"))


def _own_actor_name() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_actor_name()
    except Exception:
        return None
