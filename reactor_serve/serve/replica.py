"""`ModelReplica`: one model instance in a Serve replica; it owns its sessions.

The replica loads the model once in `__init__` and runs its sessions with the same
`SeatedSessionBackend` that `reactor run` uses, so the session's life (orphaned on a network
drop, resumed by a new offer, ended with `sessionEnded`) is one implementation. A model
with `sessions_per_replica: N` has N seats here, all on the one loaded model.

A session's seat is one long streaming call, `session({"session_id"})`, issued by the
ingress replica that admitted it: with `max_ongoing_requests: N` each call holds one of
the replica's N seats, waiting sessions queue in Serve (which offers them the oldest
replica with a free seat first, serve/seat_router.py), and Serve's graceful shutdown
drains a busy replica instead of cutting its users. The replica reports its seats in
use to the autoscaling policy (`record_autoscaling_stats`), which lets only idle
replicas go. The call yields once (placed, or rejected) and returns when the session
ends. Nothing else flows through it: if the
ingress replica that issued it dies, the call, and the session, go on (Serve does not
cancel a replica's streaming call when its caller dies; verified on Ray 2.60).

Everything else about a placed session (a reconnect's offer, polls, trickled
candidates, stop) reaches the replica straight from whichever ingress replica got the
HTTP request: a Ray call to this replica's actor (`control_call`), which runs beside
the busy slot rather than queueing behind it. The session's record in the
`SessionDirectory` says which replica to call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, AsyncIterator

from reactor_serve.access.database import open_database
from reactor_serve.access.usage_ledger import UsageLedger
from reactor_serve.protocol.errors import BackendError
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime.isolation.model_process import hosted_model
from reactor_serve.runtime.session import EndReason
from reactor_serve.runtime.startup_heap import freeze_startup_heap
from reactor_serve.serve import metrics
from reactor_serve.serve.policy import SEATS_USED_METRIC
from reactor_serve.serve.replica_logging import join_serve_log
from reactor_serve.serve.seat_router import STARTED_AT_STAT
from reactor_serve.serve.session_directory import SessionDirectory
from reactor_serve.sessions.contract import AnswerPending, ClientIdentity, SessionState
from reactor_serve.sessions.seated_sessions import SeatedSessionBackend
from reactor_serve.sessions.uploads.settings import UploadSettings

__all__ = ["SERVE_ACTOR_NAMESPACE", "ModelReplica", "control_call"]

# The Ray namespace of Serve's replica actors (where `ray.get_actor` finds them).
SERVE_ACTOR_NAMESPACE = "serve"

log = logging.getLogger("reactor_serve.serve")


class ModelReplica:
    """The class behind each model deployment (wrapped with `serve.deployment`)."""

    # How often the slot call looks at its session (metrics, the longest session).
    FOLLOW_INTERVAL_S = 1.0
    # The longest a control call may take in the replica (an offer answers in well
    # under a second; ICE gathering with STUN servers takes a few).
    CONTROL_TIMEOUT_S = 10.0

    def __init__(
        self,
        model_dir: str,
        model_name: str,
        settings: dict[str, Any],
        max_session_s: float,
        recording: dict[str, Any] | None = None,
        uploads: dict[str, Any] | None = None,
        usage_database: str | None = None,
        seats: int = 1,
        ranks: int = 1,
    ) -> None:
        join_serve_log()
        self.model_name = model_name
        self._identity = _replica_identity()
        # The model runs in a process of its own (REACTOR_IN_PROCESS=1 keeps it on a
        # thread of the replica, for debugging): a crash there ends the live session
        # and restarts the model, and the replica stays up. That process is no Ray
        # worker, so it is told where it runs.
        self.host = hosted_model(model_dir, env=_model_process_env(self._identity), seats=seats,
                                 ranks=ranks)
        # A failing load raises here: Serve reports the replica's constructor error
        # (with the model's traceback) and admits no session.
        self.host.start()
        self.settings = WebRTCSettings.model_validate(settings)
        self.max_session_s = max_session_s
        self.sessions = SeatedSessionBackend(self.host, self.settings)
        # Ready to serve, the session machinery imported: out of later collections.
        freeze_startup_heap()
        # The model's recording settings (config and serve_config.yaml, validated).
        self.sessions.recording_override = recording
        # Its upload bounds (config and serve_config.yaml, validated by the app builder).
        if uploads is not None:
            self.sessions.upload_settings = UploadSettings.model_validate(uploads)
        # With auth required: every state change of its sessions, in the usage ledger.
        self.sessions_started = 0
        # Session calls in progress, from arrival to return: the seats in use, counted
        # from before the session exists, so the policy never sees a just-routed
        # session's replica as idle.
        self._seat_calls = 0
        # When this replica started, for the routers to know the oldest (seat_router.py).
        self._started_at = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metrics = metrics.ReplicaMetrics(model_name, seats=len(self.host.seats))
        # With auth required: every state change of its sessions, in the usage ledger,
        # and each closed interval in the per-key usage counters.
        self._ledger = None
        if usage_database is not None:
            usage = metrics.UsageMetrics()
            self._ledger = UsageLedger(open_database(usage_database), on_closed=usage.interval)
            self.sessions.events = self._ledger
        self._directory = SessionDirectory(self._identity["app"]) if self._identity else None
        if self._directory is not None:
            # What the ingress needs to know of this model, published by the model
            # itself, so the ingress's args never carry a model's settings.
            self._directory.publish_model(model_name, {
                "max_replicas": _deployment_max_replicas(),
                "sessions_per_replica": len(self.host.seats),
                "ranks": self.host.ranks,
            })

    def check_health(self) -> None:
        """Serve's health check: fails once the model cannot run (it keeps failing to
        load after a crash, or its thread is gone), so Serve replaces the replica."""
        self._metrics.model_restarts(self.host.restarts)
        if not self.host.healthy:
            error = self.host.load_error
            why = f"it failed to load: {error}" if error is not None else "it is not running"
            raise RuntimeError(f"model {self.model_name!r}: {why}")

    # ---- the slot ---------------------------------------------------------------

    def record_routing_stats(self) -> dict[str, float]:
        """Serve's routing statistics hook: when this replica started. Every router
        (one per ingress replica) then agrees which replica is the oldest, whenever it
        first saw them."""
        return {STARTED_AT_STAT: self._started_at}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metric hook: the seats in use, for the policy.
        Async, so it reads the count on the loop that changes it."""
        return {SEATS_USED_METRIC: float(self._seat_calls)}

    async def session(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Take the session `request["session_id"]`: open it with its latest offer,
        yield `placed` (or `rejected`), and hold the slot until it ends."""
        self._seat_calls += 1
        replies = self._session(request)
        try:
            async for reply in replies:
                yield reply
        finally:
            try:
                # Closed here, not whenever the loop finalizes it: its own `finally`
                # ends the session's record before this call returns.
                await replies.aclose()
            finally:
                self._seat_calls -= 1

    async def _session(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._loop = asyncio.get_running_loop()
        session_id = str(request["session_id"])
        started = time.monotonic()
        directory = self._require_directory()
        record = await directory.get(session_id)
        if record is None or record.get("state") == "ended":
            # Stopped (or expired) while it waited for this slot.
            yield {"type": "rejected", "status": 404,
                   "detail": f"session {session_id} ended before a slot was free"}
            return
        if record.get("replica"):
            # Already placed: a wait taken over by another ingress replica raced the
            # first. The session lives where it is; this slot stays free.
            yield {"type": "placed_elsewhere"}
            return
        try:
            await self.sessions.create_session(
                dict(record.get("extra_args") or {}),
                ClientIdentity(str(record.get("client") or "")),
                session_id=session_id,
                generation=str(record.get("generation") or "streamed"),
                ends_at=record.get("ends_at"),
            )
        except BackendError as exc:
            yield _rejected(exc)
            return
        seat = self.sessions.seat_of(session_id)
        placed = False
        try:
            offer = record.get("offer") or {}
            try:
                # Negotiation starts first (it runs in the background), so the record
                # writes below cost the client nothing.
                await self._submit_first_offer(session_id, offer)
            except BackendError as exc:
                await self.sessions.stop_session(session_id)
                await directory.end(session_id, EndReason.ERROR, str(exc))
                yield _rejected(exc)
                return
            placement = {
                "state": "placed", "replica": self._identity["actor"],
                "replica_namespace": self._identity["namespace"],
                "replica_id": self._identity["replica_id"], "gpu_ids": _gpu_ids(),
                # Where the session runs, for operators (and the cluster tests that
                # prove a session runs on a worker node).
                "node_id": self._identity["node_id"], "node_ip": self._identity["node_ip"],
            }
            await directory.update(session_id, **placement)
            # The ingress may have rewritten the record (a newer offer, candidates)
            # between our read and write: read it again, and place it again if that
            # write undid ours. From here on only this replica writes it.
            fresh = await directory.get(session_id) or record
            if fresh.get("replica") != placement["replica"]:
                fresh = await directory.update(session_id, **placement) or fresh
            newer = fresh.get("offer") or {}
            if newer.get("connection_id") not in (None, offer.get("connection_id")):
                # A newer offer came while the session waited for this slot.
                await self.sessions.submit_offer(
                    session_id, newer.get("sdp_offer", ""), newer.get("track_mapping") or [],
                    int(newer["connection_id"]) if newer.get("registered") else None,
                )
            for batch in await directory.take_early_candidates(session_id):
                try:
                    await self.sessions.add_ice_candidates(
                        session_id, None, batch.get("candidates") or [],
                        bool(batch.get("is_final")),
                    )
                except BackendError as exc:
                    log.warning("session %s: early candidates refused: %s",
                                session_id[:4], exc)
            placed = True
            self.sessions_started += 1
            self._metrics.session_started(seat, len(self.sessions.live_sessions()))
            yield {"type": "placed", "replica": self._identity["replica_id"], "gpu_ids": _gpu_ids()}
            await self._follow(session_id, seat, started)
        except asyncio.CancelledError:
            # Cancelled by Serve (shutdown) or by the ingress: the session ends now.
            await self.sessions.stop_session(session_id)
            raise
        finally:
            info = None
            try:
                info = await self.sessions.get_session(session_id)
                if info.state != SessionState.ENDED:
                    await self.sessions.stop_session(session_id)
                    info = await self.sessions.get_session(session_id)
            except BackendError:
                pass
            reason = (info.end_reason if info else None) or EndReason.SHUTDOWN
            await directory.end(session_id, reason, info.end_message if info else None)
            if placed:
                self._metrics.session_ended(
                    reason, self.host.model_errors, session_id=session_id, seat=seat,
                    live=len(self.sessions.live_sessions()),
                )

    async def _submit_first_offer(self, session_id: str, offer: dict[str, Any]) -> None:
        # Connection ids count from 1 per session: mint the ones the client was handed
        # while the session waited (a registered one included), so the replica's ids
        # are the client's.
        cid = int(offer.get("connection_id") or 1)
        for _ in range(cid if offer.get("registered") else cid - 1):
            await self.sessions.register_connection(session_id)
        await self.sessions.submit_offer(
            session_id, offer.get("sdp_offer", ""), offer.get("track_mapping") or [],
            cid if offer.get("registered") else None,
        )

    async def _follow(self, session_id: str, seat: int, started: float) -> None:
        """Hold the seat while the session lives: metrics, and the longest session."""
        deadline = started + self.max_session_s
        first_frame_seen = False
        latencies_seen = 0
        while True:
            info = await self.sessions.get_session(session_id)
            if info.state == SessionState.ENDED:
                return
            if time.monotonic() > deadline:
                await self.sessions.end_session(
                    session_id, EndReason.TIMEOUT,
                    f"the session reached its longest allowed time ({self.max_session_s:g} s)",
                )
                return
            stats = self.sessions.stats(session_id)
            if stats:
                if not first_frame_seen and stats.get("presented"):
                    first_frame_seen = True
                    self._metrics.first_frame(time.monotonic() - started)
                self._metrics.observe(stats, session_id=session_id, seat=seat)
            totals = self.host.batch_totals
            if totals is not None:
                self._metrics.batches(totals.batches, totals.steps, totals.seconds)
            latencies, latencies_seen = self.sessions.input_latencies(session_id, latencies_seen)
            self._metrics.input_to_frame(latencies)
            await self.sessions.wait_ended(session_id, self.FOLLOW_INTERVAL_S)

    # ---- control calls from any ingress replica ----------------------------------

    def control_from_thread(self, op: str, session_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run one control operation on the replica's loop; called on a Ray thread."""
        loop = self._loop
        if loop is None:
            return _error("UnknownSession", 404, f"unknown session {session_id!r}")
        future = asyncio.run_coroutine_threadsafe(self._control(op, session_id, args), loop)
        try:
            return future.result(self.CONTROL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return _error("ModelUnavailable", 503,
                          f"the replica did not answer {op!r} within {self.CONTROL_TIMEOUT_S:g} s",
                          retry_after_s=1.0)

    async def _control(self, op: str, session_id: str, args: dict[str, Any]) -> dict[str, Any]:
        sessions = self.sessions
        try:
            if op == "offer":
                value: Any = await sessions.submit_offer(
                    session_id, args["sdp_offer"], args["track_mapping"], args.get("connection_id")
                )
            elif op == "register":
                value = await sessions.register_connection(session_id)
            elif op == "poll":
                answer = await sessions.poll_answer(session_id, args.get("connection_id"))
                value = {"pending": answer.status} if isinstance(answer, AnswerPending) else {"sdp": answer}
            elif op == "candidates":
                await sessions.add_ice_candidates(
                    session_id, args.get("connection_id"), args["candidates"], bool(args["is_final"])
                )
                value = None
            elif op == "get":
                info = await sessions.get_session(session_id)
                value = {"state": info.state, "end_reason": info.end_reason,
                         "end_message": info.end_message}
            elif op == "stop":
                await sessions.stop_session(session_id)
                value = None
            elif op == "stop_unnamed":
                value = await sessions.stop_unnamed(ClientIdentity(str(args["client"])))
            elif op in _VIEWER_OPS:
                value = await _viewer_op(sessions, op, session_id, args)
            elif op == "create_upload":
                value = await sessions.create_upload(
                    session_id, args["name"], args["size"], args["mime_type"]
                )
            elif op == "upload_size":
                value = await sessions.upload_size(args["upload_id"])
            elif op == "write_upload":
                value = await sessions.write_upload(args["upload_id"], args["data"])
            elif op == "clip_playlist":
                value = await sessions.clip_playlist(session_id, args["start"], args["end"])
            elif op == "clip_chunk":
                value = await sessions.clip_chunk(session_id, args["name"])
            elif op == "kept_steps":
                value = await sessions.kept_steps(session_id)
            elif op == "kept_step":
                value = await sessions.kept_step(session_id, args["step"])
            elif op == "kept_step_file":
                value = await sessions.kept_step_file(session_id, args["step"], args["name"])
            elif op == "shutdown":
                await sessions.end_session(session_id, EndReason.SHUTDOWN,
                                           "the server is shutting down")
                value = None
            else:
                return _error("OfferRejected", 400, f"unknown control operation {op!r}")
        except BackendError as exc:
            return _error(type(exc).__name__, exc.status, str(exc), exc.retry_after_s)
        return {"ok": value}

    def stats(self) -> dict[str, Any]:
        """For tests and operators: this replica's sessions."""
        return {
            "model": self.model_name,
            "sessions_started": self.sessions_started,
            "healthy": self.host.healthy,
            "ranks": {str(r.rank): {"pid": r.pid, "activity": r.activity}
                      for r in self.host.rank_processes()},
        }

    def _require_directory(self) -> SessionDirectory:
        if self._directory is None:
            raise RuntimeError("ModelReplica runs inside a Serve application only")
        return self._directory

    def __del__(self) -> None:
        # Ends any live session with sessionEnded{reason: "shutdown"} first.
        try:
            self.host.shutdown()
        except Exception:
            pass
        if self._ledger is not None:
            # What the session's end wrote is flushed before the process goes.
            self._ledger.close(timeout=10.0)


def control_call(actor_self: Any, op: str, session_id: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run through Ray's `__ray_call__` on a model replica's actor: hand `op` to the
    ModelReplica of that process. Ray runs it on a thread of its own, so it is not
    queued behind the session call that holds the replica's one Serve slot."""
    from ray import serve

    replica = serve.get_replica_context().servable_object
    if not isinstance(replica, ModelReplica):
        return _error("UnknownSession", 404, f"unknown session {session_id!r}")
    return replica.control_from_thread(op, session_id, args)


_VIEWER_OPS = ("viewer_link", "viewer_revoke", "watch_info", "watch_offer", "watch_poll")


async def _viewer_op(sessions: SeatedSessionBackend, op: str, session_id: str, args: dict[str, Any]) -> Any:
    """A viewer-link operation on the replica's session. The watch ops check the token
    against the session's own (the ingress found the session by the token)."""
    if op == "viewer_link":
        return await sessions.viewer_link(session_id)
    if op == "viewer_revoke":
        return await sessions.revoke_viewers(session_id)
    token = str(args.get("viewer_token", ""))
    if op == "watch_info":
        return await sessions.watch_info(token)
    if op == "watch_offer":
        return await sessions.watch_offer(token, args["sdp_offer"], args["track_mapping"])
    answer = await sessions.watch_poll(token, args["connection_id"])
    return {"pending": answer.status} if isinstance(answer, AnswerPending) else {"sdp": str(answer)}


def _error(kind: str, status: int, message: str, retry_after_s: float | None = None) -> dict[str, Any]:
    return {"error": {"kind": kind, "status": status, "message": message,
                      "retry_after_s": retry_after_s}}


def _rejected(exc: BackendError) -> dict[str, Any]:
    return {"type": "rejected", "status": exc.status, "detail": str(exc),
            "kind": type(exc).__name__, "retry_after_s": exc.retry_after_s}


def _replica_identity() -> dict[str, Any] | None:
    """This replica's Ray actor name and namespace (what the ingress calls), its
    Serve replica id and application, and its Ray node's id and IP; None outside
    Serve."""
    try:
        import ray
        from ray import serve

        context = serve.get_replica_context()
        runtime = ray.get_runtime_context()
        return {
            "actor": runtime.get_actor_name(),
            # Serve names its replica actors in its own namespace, not the job's.
            "namespace": SERVE_ACTOR_NAMESPACE,
            "replica_id": context.replica_id.unique_id,
            "app": context.app_name,
            "node_id": runtime.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
        }
    except Exception:
        return None


def _model_process_env(identity: dict[str, Any] | None) -> dict[str, str]:
    """What the model process learns of its replica: `REACTOR_RAY_NODE_ID`,
    `REACTOR_REPLICA_ID` (its GPUs it sees as CUDA does, in CUDA_VISIBLE_DEVICES)."""
    if identity is None:
        return {}
    return {"REACTOR_RAY_NODE_ID": identity["node_id"], "REACTOR_REPLICA_ID": identity["replica_id"]}


def _deployment_max_replicas() -> int | None:
    """The most replicas this replica's deployment may have, as Serve runs it: its
    autoscaling config's `max_replicas`, else its fixed `num_replicas`. Read from the
    replica's own deployment config (Ray 2.60's `ReplicaContext._deployment_config`)
    rather than from the app's args, so a `deployments:` override in a Serve config
    is what is reported; None if Ray no longer exposes it."""
    try:
        from ray import serve

        config = serve.get_replica_context()._deployment_config
        autoscaling = config.autoscaling_config
        return int(autoscaling.max_replicas if autoscaling is not None else config.num_replicas)
    except Exception:
        return None


def _gpu_ids() -> list[str]:
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        return []
