"""`ModelReplica`: one model instance in a Serve replica, one live session at a time.

The replica loads the model once in `__init__`. A session is one long streaming call,
`session(request)`: it yields the SDP answer first, then any later answers (the
client's reconnects) and finally how the session ended, and returns when the session
is over. Cancelling the call ends the session. With `max_ongoing_requests: 1` the
call is the replica's one slot, and Serve's graceful shutdown waits for it, so a
scale-down drains a busy replica instead of cutting its user.

Messages the ingress must send into a live session (a reconnect's new offer, trickled
candidates) come back through `Mailbox.take` on the ingress, polled by the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from reactor_serve.runtime.host import ModelHost, SessionBusy
from reactor_serve.runtime.session import EndReason
from reactor_serve.serve import metrics
from reactor_serve.webrtc.backend import OfferRejected
from reactor_serve.webrtc.peer import PeerSession
from reactor_serve.webrtc.settings import WebRTCSettings

__all__ = ["ModelReplica"]

log = logging.getLogger("reactor_serve.serve")


class ModelReplica:
    """The class behind each model deployment (wrapped with `serve.deployment`)."""

    STATS_INTERVAL_S = 1.0

    def __init__(
        self,
        model_dir: str,
        model_name: str,
        settings: dict[str, Any],
        max_session_s: float,
        ingress_deployment: str | None = None,
    ) -> None:
        self.model_name = model_name
        self.host = ModelHost.from_manifest(model_dir)
        # A failing load raises here: Serve reports the replica's constructor error
        # (with the model's traceback) and admits no session.
        self.host.start()
        self.settings = WebRTCSettings.model_validate(settings)
        self.max_session_s = max_session_s
        # The ingress deployment whose `take` holds messages for live sessions; its
        # handle is looked up on first use, inside the running application.
        self.ingress_deployment = ingress_deployment
        self._mailbox: Any = None
        self.peer: PeerSession | None = None
        self.sessions_started = 0
        self._metrics = metrics.ReplicaMetrics(model_name)
        self._metrics.live.set(0)

    def check_health(self) -> None:
        """Serve's health check: fails once the model thread is gone."""
        if not self.host.healthy:
            raise RuntimeError(f"model {self.model_name!r}: the model thread is not running")

    async def session(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Run one session: `{"session_id", "sdp_offer", "track_mapping"}` in; events out."""
        session_id = str(request["session_id"])
        started = time.monotonic()
        peer = PeerSession(self.host, self.settings, session_id=session_id)
        self.peer = peer
        try:
            try:
                answer = await peer.answer(request["sdp_offer"], request.get("track_mapping", []))
            except OfferRejected as exc:
                yield {"type": "rejected", "status": 400, "detail": str(exc)}
                return
            except SessionBusy as exc:
                yield {"type": "rejected", "status": 409, "detail": str(exc)}
                return
            self.sessions_started += 1
            self._metrics.session_started()
            yield {
                "type": "answer",
                "sdp": answer,
                "connection_id": request.get("connection_id"),
                "replica": _replica_id(),
                "gpu_ids": _gpu_ids(),
            }
            async for event in self._follow(peer, started):
                yield event
        except asyncio.CancelledError:
            # The ingress cancelled the call: the client stopped, or vanished.
            await peer.close(EndReason.CLIENT_CLOSED)
            raise
        finally:
            if not peer.ended.is_set():
                await peer.close(EndReason.SHUTDOWN)
            self._metrics.session_ended(peer.end_reason or "unknown", self.host.model_errors)
            self.peer = None

    async def _follow(self, peer: PeerSession, started: float) -> AsyncIterator[dict[str, Any]]:
        """Serve a live session until it ends: control messages in, answers out."""
        deadline = started + self.max_session_s
        first_frame_seen = False
        while not peer.ended.is_set():
            if time.monotonic() > deadline:
                await peer.close(EndReason.TIMEOUT)
                break
            if not first_frame_seen and peer.session is not None and peer.session.clock.presented:
                first_frame_seen = True
                self._metrics.first_frame(time.monotonic() - started)
            self._metrics.observe(peer.stats())
            for message in await self._next_controls(peer):
                event = await self._apply_control(peer, message)
                if event is not None:
                    yield event
        yield {"type": "ended", "reason": peer.end_reason, "detail": peer.end_detail}

    def _ingress(self) -> Any:
        if self._mailbox is None and self.ingress_deployment:
            from ray import serve

            app_name = serve.get_replica_context().app_name
            self._mailbox = serve.get_deployment_handle(self.ingress_deployment, app_name)
        return self._mailbox

    async def _next_controls(self, peer: PeerSession) -> list[dict[str, Any]]:
        mailbox = self._ingress()
        if mailbox is None:
            await asyncio.wait([asyncio.ensure_future(peer.ended.wait())],
                               timeout=self.STATS_INTERVAL_S)
            return []
        poll = asyncio.ensure_future(mailbox.take.remote(peer.id, self.STATS_INTERVAL_S))
        ended = asyncio.ensure_future(peer.ended.wait())
        done, _ = await asyncio.wait([poll, ended], return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if poll not in done:
            poll.cancel()
            return []
        try:
            return list(poll.result() or [])
        except Exception:
            log.exception("session %s: polling the ingress mailbox failed", peer.id)
            await asyncio.sleep(self.STATS_INTERVAL_S)
            return []

    async def _apply_control(self, peer: PeerSession, message: dict[str, Any]) -> dict[str, Any] | None:
        kind = message.get("type")
        if kind == "offer":
            try:
                answer = await peer.answer(message["sdp_offer"], message.get("track_mapping", []))
            except OfferRejected as exc:
                return {"type": "rejected", "status": 400, "detail": str(exc),
                        "connection_id": message.get("connection_id")}
            return {"type": "answer", "sdp": answer, "connection_id": message.get("connection_id")}
        if kind == "candidates":
            try:
                await peer.add_ice_candidates(message.get("candidates", []),
                                              bool(message.get("is_final")))
            except OfferRejected as exc:
                log.warning("session %s: %s", peer.id, exc)
            return None
        if kind == "stop":
            await peer.close(EndReason.CLIENT_CLOSED)
            return None
        log.warning("session %s: unknown control message %r", peer.id, kind)
        return None

    def stats(self) -> dict[str, Any]:
        """For tests and operators: this replica's live session, if any."""
        peer = self.peer
        return {
            "model": self.model_name,
            "sessions_started": self.sessions_started,
            "live_session": peer.id if peer is not None and not peer.ended.is_set() else None,
            "healthy": self.host.healthy,
        }

    def __del__(self) -> None:
        try:
            self.host.shutdown()
        except Exception:
            pass


def _replica_id() -> str | None:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return None


def _gpu_ids() -> list[str]:
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        return []
