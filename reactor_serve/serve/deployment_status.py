"""`DeploymentStatus`: what the ingress knows of one model's deployment.

Three readings from the control plane meet here: the settings the model's replicas
published to the session directory (`max_replicas`, `sessions_per_replica`), the
directory's count of live and waiting sessions, and Serve's own status of the
deployment. Each is a `CachedReading`, so a page polling `GET /models` or a burst of
new sessions costs the controller and the GCS one read per interval per ingress
replica. From them come the model's capacity and, when its deployment cannot run
any session (its `load()` failed), the reason a client is told instead of a wait
that never ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from reactor_serve.protocol.errors import ModelUnavailable
from reactor_serve.serve.cached_reading import CachedReading
from reactor_serve.serve.session_directory import SessionDirectory

__all__ = ["DeploymentStatus", "serve_deployment_status"]

log = logging.getLogger("reactor_serve.serve")

# Serve's deployment states in which no session can start (spelled both ways Ray has
# printed them).
_FAILED_STATES = (
    "DeploymentStatus.DEPLOY_FAILED", "DeploymentStatus.UNHEALTHY", "DEPLOY_FAILED", "UNHEALTHY",
)


def serve_deployment_status(deployment: str) -> Any:
    """`deployment`'s `DeploymentStatusOverview` in this replica's application, from
    Serve's controller; None outside Serve or when the controller does not answer.
    Blocks: call it off the event loop."""
    try:
        from ray import serve

        context = serve.get_replica_context()
        return serve.status().applications[context.app_name].deployments[deployment]
    except Exception:
        return None


class DeploymentStatus:
    """One model's deployment as the ingress sees it: settings, occupancy, Serve's status."""

    # How long a deployment-status, model-settings or session-count reading is reused.
    TTL_S = 2.0
    # Serve's replica states counted as a replica being started.
    STARTING_REPLICA_STATES = ("STARTING", "RECOVERING")

    def __init__(
        self,
        model: str,
        directory: SessionDirectory,
        *,
        admission_timeout_s: float,
        read_status: Callable[[], Awaitable[Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`admission_timeout_s` is the app's setting for the model; `read_status`
        answers Serve's `DeploymentStatusOverview` of the deployment (or None); by
        default it asks Serve's controller, off the event loop."""
        self._model = model
        self._admission_timeout_s = admission_timeout_s
        self._directory = directory
        # The name serve/config.py gives the model's deployment.
        deployment = f"model-{model}"
        self._read_status = read_status or (
            lambda: asyncio.to_thread(serve_deployment_status, deployment)
        )
        self._status = CachedReading(self._read_status, self.TTL_S, clock=clock)
        self._settings = CachedReading(self._read_settings, self.TTL_S, clock=clock)
        self._occupancy = CachedReading(self._read_occupancy, self.TTL_S, clock=clock)

    async def settings(self) -> dict[str, Any]:
        """What the model's replicas published of their deployment; {} until one did."""
        return await self._settings.get()

    async def admission_timeout_s(self) -> float:
        """How long a session waits for a slot before it is told to come back later.

        The app's setting, given to the ingress rather than published by the model's
        replicas: a model scaled to zero has none, and its first session is the one
        that waits longest (a replica, maybe a GPU node, starting).
        """
        return self._admission_timeout_s

    async def problem(self) -> str | None:
        """Why the model's deployment cannot run any session, or None."""
        deployment = await self._status.get()
        if deployment is None:
            return None  # outside Serve, or the controller is busy: let it try
        if deployment.replica_states.get("RUNNING", 0) == 0 and str(deployment.status) in _FAILED_STATES:
            first_line = (deployment.message or "").strip().splitlines()
            detail = first_line[0] if first_line else str(deployment.status)
            return f"model {self._model!r} is not available: {detail}"
        return None

    async def check_available(self) -> None:
        """Raise `ModelUnavailable` with the deployment's problem, if it has one."""
        problem = await self.problem()
        if problem:
            raise ModelUnavailable(problem, retry_after_s=5.0)

    async def capacity(self) -> dict[str, int | None]:
        """What `GET /models` shows of this model: `replicas` running, `starting`,
        `busy` (every seat holding a live session), `free` (a seat free), `waiting`
        sessions, `max_replicas`, and in seats: `seats_per_replica`, `seats_used`,
        `seats_free`.

        Replica counts are Serve's own, sessions are the session directory's,
        `max_replicas` is what the model's replicas published of their deployment. A
        count not known (Serve's controller did not answer, or no replica has started
        yet) is None.
        """
        overview, occupancy, settings = await asyncio.gather(
            self._status.get(), self._occupancy.get(), self._settings.get()
        )
        replicas = starting = free = seats_free = None
        seats = settings.get("sessions_per_replica")
        seats = seats if isinstance(seats, int) and seats >= 1 else 1
        # A replica is busy once its seats are all held. The caps keep a record that
        # outlived its replica (both it and its holder died) from counting a busy
        # replica, or a used seat, that is not there.
        per_replica = occupancy.get("by_replica") or {}
        busy = sum(1 for count in per_replica.values() if count >= seats)
        used = occupancy["live"]
        if overview is not None:
            states = overview.replica_states
            replicas = int(states.get("RUNNING", 0))
            starting = sum(int(states.get(state, 0)) for state in self.STARTING_REPLICA_STATES)
            busy = min(busy, replicas)
            free = replicas - busy
            used = min(used, replicas * seats)
            seats_free = replicas * seats - used
        max_replicas = settings.get("max_replicas")
        return {
            "replicas": replicas,
            "starting": starting,
            "busy": busy,
            "free": free,
            "waiting": occupancy["waiting"],
            "max_replicas": int(max_replicas) if isinstance(max_replicas, int) else None,
            "seats_per_replica": seats,
            "seats_used": used,
            "seats_free": seats_free,
        }

    async def _read_settings(self) -> dict[str, Any]:
        try:
            return await self._directory.model_settings(self._model)
        except Exception:
            return {}

    async def _read_occupancy(self) -> dict[str, Any]:
        # A wait outlives admission_timeout_s only when nothing holds it any more.
        max_wait = await self.admission_timeout_s() + self.TTL_S
        try:
            return await self._directory.session_counts(self._model, max_wait_s=max_wait)
        except Exception as exc:
            log.warning("counting the sessions of %s failed: %r", self._model, exc)
            return {"live": 0, "waiting": 0, "by_replica": {}}
