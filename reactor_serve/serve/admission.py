"""`AdmissionQueue`: the sessions whose wait for a slot this ingress replica holds.

A session's first offer opens the replica call `session(...)` through the model's
deployment handle. With every replica busy the call waits in Serve's queue (which is
what the autoscaling policy counts); meanwhile a polling client is told its position
and an estimate of its wait, and after `admission_timeout_s` it gets 503 with
Retry-After. The ingress replica that issued the call is the session's `holder`
while it waits; if that replica dies, the next ingress replica asked about the
session takes the wait over. Once placed, the holder only watches the call, to learn
at once when the replica dies.

Serve's queue is per caller, so only the holder knows a session's position: it
publishes the position to the session directory for the other ingress replicas to
read. A session's position is published before its record first says it waits and
stays until the directory deletes the record, so a poll on any ingress replica that
reads a waiting record finds a position after it, even one that read the record just
before the wait ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from reactor_serve.protocol.errors import BackendError, ModelBusy
from reactor_serve.runtime.session import EndReason
from reactor_serve.serve.metrics import IngressMetrics
from reactor_serve.serve.replica import SERVE_ACTOR_NAMESPACE
from reactor_serve.serve.replica_calls import REPLICA_DIED, reported_error
from reactor_serve.serve.session_directory import SessionDirectory, SessionRecord
from reactor_serve.sessions.contract import mask_session_id

__all__ = ["AdmissionQueue", "AdmissionTimeout", "admission_error"]

log = logging.getLogger("reactor_serve.serve")


class AdmissionTimeout(ModelBusy):
    """No replica took the session within `admission_timeout_s`."""

    status = 503


def admission_error(error: dict[str, Any]) -> BackendError:
    """The error a failed admission recorded (`record["admission_error"]`), as raised
    to the client: a timeout, or what the replica that declined the session said."""
    if error.get("kind") == "AdmissionTimeout":
        return AdmissionTimeout(str(error.get("message", "")), error.get("retry_after_s"))
    return reported_error(error)


class AdmissionQueue:
    """The slot waits one ingress replica holds for one model, in the order they came."""

    # The weight of the latest wait in the running estimate of how long a wait takes.
    WAIT_ESTIMATE_WEIGHT = 0.3
    # Retry-After of a timed-out admission before any wait has been seen.
    DEFAULT_RETRY_AFTER_S = 5.0

    def __init__(
        self,
        model: str,
        handle: Any,
        directory: SessionDirectory,
        *,
        holder_name: str | None,
        admission_timeout_s: Callable[[], Awaitable[float]],
        actor_alive: Callable[[str, str], Awaitable[bool]],
        metrics: IngressMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`handle` is the model's deployment handle; `holder_name` this ingress
        replica's actor name, written into the records of the waits it holds (None
        outside an actor); `actor_alive(name, namespace)` tells whether another holder
        still runs. `clock` times waits; `wall_clock` stamps records, which other
        processes read."""
        self._model = model
        self._handle = handle
        self._directory = directory
        self._me = holder_name
        self._admission_timeout_s = admission_timeout_s
        self._actor_alive = actor_alive
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        # Sessions whose slot wait this ingress replica holds: session id -> task.
        self._waits: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._queue: list[str] = []
        self._queued_at: dict[str, float] = {}
        self._recent_wait_s: float | None = None

    # ---- holding a wait ---------------------------------------------------------

    async def claim(self, session_id: str, record: SessionRecord) -> None:
        """Make this ingress replica the holder of the session's wait in `record` (the
        caller writes it), and publish the position it will take in the queue."""
        record.update(holder=self._me, holder_namespace=SERVE_ACTOR_NAMESPACE,
                      queued_at=self._wall_clock())
        # Published before the record says the session waits, so that no poll, on
        # any ingress replica, finds a wait without a position.
        position = len(self._queue) + 1
        await self._directory.put_position(session_id, position, self.eta(position))

    def admit(self, session_id: str, *, claimed: bool = False) -> None:
        """Hold the session's wait on this ingress replica, unless it already does;
        `claimed` when its record already names this replica the holder."""
        if session_id in self._waits:
            return
        task = asyncio.get_running_loop().create_task(
            self.hold(session_id, claimed), name=f"reactor-admission-{mask_session_id(session_id)}"
        )
        self._waits[session_id] = task
        task.add_done_callback(lambda _: self._waits.pop(session_id, None))

    def holds(self, session_id: str) -> bool:
        return session_id in self._waits

    def cancel(self, session_id: str) -> None:
        """Give up the session's wait, if this ingress replica holds it."""
        task = self._waits.get(session_id)
        if task is not None:
            task.cancel()

    async def holder_alive(self, session_id: str, record: SessionRecord) -> bool:
        """Whether some ingress replica still holds the wait `record` names."""
        holder = record.get("holder")
        if not holder:
            return False
        if holder == self._me:
            return self.holds(session_id)
        return await self._actor_alive(holder, record.get("holder_namespace") or SERVE_ACTOR_NAMESPACE)

    async def hold(self, session_id: str, claimed: bool) -> None:
        """Issue the session's slot call and watch it to its end."""
        from ray.exceptions import RayActorError

        timeout = await self._admission_timeout_s()
        self._queued_at[session_id] = self._clock()
        self._queue.append(session_id)
        self._report_waiting()
        placed = False
        try:
            if not claimed:
                await self._directory.update(session_id, holder=self._me, queued_at=self._wall_clock(),
                                             holder_namespace=SERVE_ACTOR_NAMESPACE)
            response = self._handle.options(stream=True).session.remote({"session_id": session_id})
            try:
                first = await asyncio.wait_for(response.__anext__(), timeout)
            except asyncio.TimeoutError:
                response.cancel()
                retry = max(1.0, self._recent_wait_s or self.DEFAULT_RETRY_AFTER_S)
                await self._directory.update(session_id, admission_error={
                    "kind": "AdmissionTimeout", "status": 503, "retry_after_s": retry,
                    "message": f"model {self._model!r}: every replica is busy and none "
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

    # ---- positions --------------------------------------------------------------

    async def status(self, session_id: str, record: SessionRecord) -> dict[str, Any]:
        """What a poll of a waiting session answers: `{"status": "queued", "position",
        "eta_s", "waited_s"}`, from this queue or from what its holder published."""
        if session_id in self._queue:
            position: int | None = self._queue.index(session_id) + 1
            eta = self.eta(position)
        else:
            published = await self._directory.position(session_id)
            position, eta = published.get("position"), published.get("eta_s")
        now = self._wall_clock()
        waited = now - float(record.get("queued_at") or now)
        return {"status": "queued", "position": position, "eta_s": eta,
                "waited_s": round(max(0.0, waited), 1)}

    def eta(self, position: int) -> float | None:
        """Seconds a session at `position` may still wait, from the recent waits;
        None before any wait ended."""
        if self._recent_wait_s is None:
            return None
        return round(self._recent_wait_s * position, 1)

    def _leave_queue(self, session_id: str) -> None:
        if session_id in self._queue:
            # Its published position stays until the record goes (the directory drops
            # both): a poll that read the record while it still waited reads the
            # position after it, maybe after the wait ended.
            self._queue.remove(session_id)
            now = self._clock()
            waited = now - self._queued_at.pop(session_id, now)
            weight = self.WAIT_ESTIMATE_WEIGHT
            self._recent_wait_s = (
                waited if self._recent_wait_s is None
                else (1 - weight) * self._recent_wait_s + weight * waited
            )
            if self._metrics is not None:
                self._metrics.wait.observe(waited, tags={"model": self._model})
        self._report_waiting()

    async def _publish_positions(self) -> None:
        for index, session_id in enumerate(list(self._queue)):
            try:
                await self._directory.put_position(session_id, index + 1, self.eta(index + 1))
            except Exception:
                log.warning("publishing the queue position of %s failed",
                            mask_session_id(session_id), exc_info=True)

    def _report_waiting(self) -> None:
        if self._queue:
            self._spawn(self._publish_positions())
        if self._metrics is not None:
            self._metrics.waiting.set(len(self._queue), tags={"model": self._model})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
