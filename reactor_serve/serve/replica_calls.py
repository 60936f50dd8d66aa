"""`ReplicaCalls`: reaching the model replica that holds a placed session.

Once placed, a session lives in one model replica, and every request about it goes
straight there: the session's record names the replica's actor, and the call runs
`replica.control_call` on it through Ray's `__ray_call__`, so no ingress replica
keeps anything of the session and none stands between it and its replica. A replica
answers `{"ok": value}` or `{"error": {...}}`; an error comes back to the client as
the protocol error it names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from reactor_serve.protocol import errors as error_kinds
from reactor_serve.protocol.errors import BackendError, ModelUnavailable, OfferRejected
from reactor_serve.runtime.session import EndReason
from reactor_serve.serve.replica import SERVE_ACTOR_NAMESPACE, control_call
from reactor_serve.serve.session_directory import SessionDirectory, SessionRecord
from reactor_serve.sessions.contract import mask_session_id

__all__ = ["REPLICA_DIED", "ReplicaCalls", "ReplicaDied", "reported_error"]

log = logging.getLogger("reactor_serve.serve")

# What a replica's death is reported as, to the client and in the record.
REPLICA_DIED = "the replica running this session died"


class ReplicaDied(Exception):
    """The replica that held the session is gone; the session's record says it ended."""


def reported_error(error: dict[str, Any]) -> BackendError:
    """The BackendError that `error` (`{"kind", "status", "message", "retry_after_s"}`)
    names; a kind the protocol does not know becomes the error its status implies."""
    kind = getattr(error_kinds, str(error.get("kind")), None)
    if not (isinstance(kind, type) and issubclass(kind, BackendError)):
        kind = OfferRejected if int(error.get("status", 400)) < 500 else ModelUnavailable
    return kind(str(error.get("message", "")), error.get("retry_after_s"))


def _ray_get_actor(name: str, namespace: str) -> Any:
    import ray

    return ray.get_actor(name, namespace=namespace)


class ReplicaCalls:
    """Control calls to the replicas that own sessions, and actor lookups by name."""

    # The longest an ingress waits for a replica's answer to a control call.
    TIMEOUT_S = 15.0
    # Actor handles kept, so a busy session does not cost a GCS lookup per request.
    MAX_CACHED_ACTORS = 1024

    def __init__(
        self,
        directory: SessionDirectory,
        *,
        get_actor: Callable[[str, str], Any] = _ray_get_actor,
    ) -> None:
        """`get_actor(name, namespace)` answers a named actor's handle, or raises
        ValueError when there is no such actor (as `ray.get_actor` does)."""
        self._directory = directory
        self._get_actor = get_actor
        self._actors: dict[tuple[str, str], Any] = {}

    async def call(self, session_id: str, record: SessionRecord, op: str, args: dict[str, Any]) -> Any:
        """Run `op` on the replica that owns the session and answer its value.

        Raises the BackendError the replica reported, `ModelUnavailable` when it did not
        answer in time, and `ReplicaDied` (after ending the record) when it is gone.
        """
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            actor = self._actor(record["replica"], record.get("replica_namespace") or SERVE_ACTOR_NAMESPACE)
            ref = actor.__ray_call__.remote(control_call, op, session_id, args)
            result = await asyncio.wait_for(ref, self.TIMEOUT_S)
        except (RayActorError, ValueError) as exc:
            log.warning("session %s: its replica %s is gone: %r", mask_session_id(session_id),
                        record.get("replica"), exc)
            await self._directory.end(session_id, EndReason.ERROR, REPLICA_DIED)
            raise ReplicaDied(REPLICA_DIED) from None
        except (asyncio.TimeoutError, GetTimeoutError):
            raise ModelUnavailable(
                f"the replica running session {session_id} did not answer within "
                f"{self.TIMEOUT_S:g} s", retry_after_s=1.0,
            ) from None
        if "error" in result:
            raise reported_error(result["error"])
        return result["ok"]

    async def actor_alive(self, name: str, namespace: str) -> bool:
        """Whether an actor of that name runs now; asked afresh each time."""
        try:
            await asyncio.to_thread(self._get_actor, name, namespace)
        except ValueError:
            return False
        return True

    def _actor(self, name: str, namespace: str) -> Any:
        key = (name, namespace)
        actor = self._actors.get(key)
        if actor is None:
            actor = self._actors[key] = self._get_actor(name, namespace)
            while len(self._actors) > self.MAX_CACHED_ACTORS:
                self._actors.pop(next(iter(self._actors)))
        return actor
