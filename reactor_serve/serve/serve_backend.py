"""`ServeBackend`: the sessions of one model, run by its Serve replicas.

A session's first offer opens the replica call `session(...)` through the model's
deployment handle. With every replica busy the call waits in Serve's queue (which is
what the autoscaling policy counts); meanwhile a polling client is told its position
and an estimate, and after `admission_timeout_s` it gets 503 with Retry-After. The
call is then held open for the life of the session; stopping the session cancels it.
Messages for a live session (a reconnect's offer, trickled candidates) wait in a
mailbox that the replica polls through the ingress's `take`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from typing import Any

from ray.serve.exceptions import RequestCancelledError

from reactor_serve.runtime.model_spec import ModelSpec
from reactor_serve.serve.config import ModelEntry
from reactor_serve.serve.metrics import IngressMetrics
from reactor_serve.webrtc.backend import (
    AnswerPending,
    BackendError,
    ModelBusy,
    ModelUnavailable,
    OfferRejected,
    SessionInfo,
    UnknownSession,
)

__all__ = ["AdmissionTimeout", "ServeBackend", "SessionLost"]

log = logging.getLogger("reactor_serve.serve")


class AdmissionTimeout(ModelBusy):
    """No replica took the session within `admission_timeout_s`."""

    status = 503


class SessionLost(BackendError):
    """The replica running the session failed (it died, or the call broke)."""

    status = 502


class _Session:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.answers: dict[int, str | BackendError] = {}
        self.latest: int | None = None
        self.task: asyncio.Task[None] | None = None
        self.response: Any = None
        self.mailbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.waiting_since: float | None = None
        self.expiry: asyncio.TimerHandle | None = None
        self.ended_at: float | None = None
        # Where the session runs, for operators: Serve's replica id and its GPUs.
        self.replica: str | None = None
        self.gpu_ids: list[str] = []


class ServeBackend:
    """A SessionBackend over one model deployment's handle."""

    # A session that never gets an offer frees its record after this long.
    OFFER_TIMEOUT_S = 60.0
    # Ended sessions are remembered this long, so late polls get a clear answer.
    KEEP_ENDED_S = 300.0

    def __init__(
        self,
        spec: ModelSpec,
        handle: Any,
        entry: ModelEntry,
        ice_servers: list[dict[str, Any]],
        metrics: IngressMetrics | None = None,
    ) -> None:
        self._spec = spec
        self.handle = handle
        self.entry = entry
        self._ice_servers = ice_servers
        self._metrics = metrics
        self._sessions: dict[str, _Session] = {}
        self._waiting: list[_Session] = []
        self._ids = itertools.count(1)
        self._recent_wait_s: float | None = None
        self._status: tuple[float, str | None] | None = None

    @property
    def spec(self) -> ModelSpec:
        return self._spec

    @property
    def healthy(self) -> bool:
        return True

    # ---- SessionBackend -----------------------------------------------------------

    # How long a deployment-status reading is reused (asking the controller costs a call).
    STATUS_TTL_S = 2.0

    async def create_session(self, extra_args: dict[str, Any]) -> SessionInfo:
        self._forget_old()
        await self._check_available()
        info = SessionInfo(secrets.token_urlsafe(16), "created", time.time(), dict(extra_args))
        session = _Session(info)
        self._sessions[info.session_id] = session
        session.expiry = asyncio.get_running_loop().call_later(
            self.OFFER_TIMEOUT_S, self._expire, session
        )
        return info

    def get_session(self, session_id: str) -> SessionInfo:
        return self._session(session_id).info

    def live_sessions(self) -> list[SessionInfo]:
        return [s.info for s in self._sessions.values() if s.info.state != "ended"]

    async def submit_offer(
        self, session_id: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        session = self._session(session_id)
        if session.info.state == "ended":
            raise UnknownSession(f"session {session_id} has ended")
        if not isinstance(sdp_offer, str) or not sdp_offer.strip():
            raise OfferRejected("sdp_offer must be a non-empty SDP string")
        cid = next(self._ids)
        session.latest = cid
        if session.expiry is not None:
            session.expiry.cancel()
            session.expiry = None
        if session.task is None:
            session.info.state = "connecting"
            session.task = asyncio.get_running_loop().create_task(
                self._run(session, cid, sdp_offer, track_mapping)
            )
        else:
            # A reconnect: the replica holding the session answers it.
            await session.mailbox.put(
                {"type": "offer", "sdp_offer": sdp_offer, "track_mapping": track_mapping,
                 "connection_id": cid}
            )
        return cid

    def poll_answer(self, session_id: str, connection_id: int | None) -> str | AnswerPending:
        session = self._session(session_id)
        cid = session.latest if connection_id is None else connection_id
        if cid is None:
            return AnswerPending({"status": "awaiting_offer"})
        result = session.answers.get(cid)
        if isinstance(result, BackendError):
            raise result
        if result is not None:
            return result
        if session in self._waiting:
            return AnswerPending(self.queue_status(session))
        return AnswerPending({"status": "pending"})

    async def add_ice_candidates(
        self, session_id: str, candidates: list[Any], is_final: bool
    ) -> None:
        session = self._session(session_id)
        if session.info.state == "ended":
            raise UnknownSession(f"session {session_id} has ended")
        await session.mailbox.put(
            {"type": "candidates", "candidates": list(candidates), "is_final": is_final}
        )

    async def stop_session(self, session_id: str) -> None:
        session = self._session(session_id)
        self._end(session)
        if session.response is not None:
            session.response.cancel()
        if session.task is not None:
            await asyncio.gather(session.task, return_exceptions=True)

    def ice_servers(self) -> list[dict[str, Any]]:
        return self._ice_servers

    async def _check_available(self) -> None:
        """Refuse sessions while the model's deployment cannot run any (its load()
        failed): the client gets the model's error instead of a wait that never ends."""
        now = time.monotonic()
        if self._status is None or now - self._status[0] > self.STATUS_TTL_S:
            self._status = (now, await asyncio.to_thread(self._read_status))
        problem = self._status[1]
        if problem:
            raise ModelUnavailable(problem)

    def _read_status(self) -> str | None:
        try:
            from ray import serve

            context = serve.get_replica_context()
            app = serve.status().applications[context.app_name]
            deployment = app.deployments[f"model-{self._spec.name}"]
        except Exception:
            return None  # outside Serve (tests), or the controller is busy: let it try
        if deployment.replica_states.get("RUNNING", 0) == 0 and str(deployment.status) in (
            "DeploymentStatus.DEPLOY_FAILED", "DeploymentStatus.UNHEALTHY",
            "DEPLOY_FAILED", "UNHEALTHY",
        ):
            first_line = (deployment.message or "").strip().splitlines()
            detail = first_line[0] if first_line else str(deployment.status)
            return f"model {self._spec.name!r} is not available: {detail}"
        return None

    # ---- for the replica --------------------------------------------------------------

    async def take(self, session_id: str, timeout: float) -> list[dict[str, Any]]:
        """Messages for a live session, waiting up to `timeout` for the first."""
        session = self._sessions.get(session_id)
        if session is None:
            return [{"type": "stop"}]
        try:
            first = await asyncio.wait_for(session.mailbox.get(), timeout)
        except asyncio.TimeoutError:
            return []
        messages = [first]
        while not session.mailbox.empty():
            messages.append(session.mailbox.get_nowait())
        return messages

    def describe_sessions(self) -> list[dict[str, Any]]:
        """Live and waiting sessions, for operators."""
        return [
            {
                "session_id": s.info.session_id,
                "state": "queued" if s in self._waiting else s.info.state,
                "replica": s.replica,
                "gpu_ids": s.gpu_ids,
                "created_at": s.info.created_at,
            }
            for s in self._sessions.values()
            if s.info.state != "ended"
        ]

    def queue_status(self, session: _Session) -> dict[str, Any]:
        position = self._waiting.index(session) + 1 if session in self._waiting else 0
        eta = None
        if self._recent_wait_s is not None:
            eta = round(self._recent_wait_s * position, 1)
        waited = time.monotonic() - session.waiting_since if session.waiting_since else 0.0
        return {"status": "queued", "position": position, "eta_s": eta, "waited_s": round(waited, 1)}

    # ---- the session call ---------------------------------------------------------------

    async def _run(self, session: _Session, cid: int, sdp: str, mapping: list[Any]) -> None:
        request = {
            "session_id": session.info.session_id,
            "sdp_offer": sdp,
            "track_mapping": mapping,
            "connection_id": cid,
        }
        session.waiting_since = time.monotonic()
        self._waiting.append(session)
        self._report_waiting()
        try:
            response = self.handle.options(stream=True).session.remote(request)
            session.response = response
            try:
                first = await asyncio.wait_for(
                    response.__anext__(), self.entry.admission_timeout_s
                )
            except asyncio.TimeoutError:
                response.cancel()
                session.answers[cid] = AdmissionTimeout(
                    f"model {self._spec.name!r}: every replica is busy and none freed up "
                    f"within {self.entry.admission_timeout_s:g} s; try again",
                    retry_after_s=max(1.0, self._recent_wait_s or 5.0),
                )
                return
            finally:
                self._leave_queue(session)
            if not self._settle(session, first, cid):
                return
            session.info.state = "live"
            async for event in response:
                if event.get("type") == "ended":
                    break
                self._settle(session, event, cid)
        except (asyncio.CancelledError, StopAsyncIteration, RequestCancelledError):
            pass  # the session was stopped: cancelling the call is how it ends
        except Exception as exc:
            log.warning("session %s: the replica call failed: %r", session.info.session_id, exc)
            if session.latest is not None and session.latest not in session.answers:
                session.answers[session.latest] = SessionLost(
                    f"the replica running session {session.info.session_id} failed: "
                    f"{type(exc).__name__}"
                )
        finally:
            self._end(session)

    def _settle(self, session: _Session, event: dict[str, Any], default_cid: int) -> bool:
        """Record an event from the replica; False when it ends the session."""
        cid = event.get("connection_id") or default_cid
        if event.get("type") == "answer":
            session.answers[cid] = event["sdp"]
            if event.get("replica"):
                session.replica = event["replica"]
                session.gpu_ids = list(event.get("gpu_ids") or [])
            return True
        if event.get("type") == "rejected":
            status = event.get("status", 400)
            error: BackendError = (
                ModelBusy(event["detail"]) if status == 409 else OfferRejected(event["detail"])
            )
            session.answers[cid] = error
            # A rejected reconnect leaves the session as it was; a rejected first offer
            # ends it.
            return session.info.state == "live"
        return True

    def _leave_queue(self, session: _Session) -> None:
        if session in self._waiting:
            self._waiting.remove(session)
            waited = time.monotonic() - (session.waiting_since or time.monotonic())
            self._recent_wait_s = (
                waited if self._recent_wait_s is None else 0.7 * self._recent_wait_s + 0.3 * waited
            )
            if self._metrics is not None:
                self._metrics.wait.observe(waited, tags={"model": self._spec.name})
        self._report_waiting()

    def _report_waiting(self) -> None:
        if self._metrics is not None:
            self._metrics.waiting.set(len(self._waiting), tags={"model": self._spec.name})

    def _end(self, session: _Session) -> None:
        if session.info.state != "ended":
            session.info.state = "ended"
            session.ended_at = time.monotonic()
        if session.expiry is not None:
            session.expiry.cancel()
            session.expiry = None
        self._leave_queue(session)

    def _expire(self, session: _Session) -> None:
        if session.task is None:
            self._end(session)

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSession(f"unknown session {session_id!r} for model {self._spec.name!r}")
        return session

    def _forget_old(self) -> None:
        now = time.monotonic()
        for sid, session in list(self._sessions.items()):
            if session.ended_at is not None and now - session.ended_at > self.KEEP_ENDED_S:
                del self._sessions[sid]
