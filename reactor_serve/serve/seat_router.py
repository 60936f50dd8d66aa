"""`SeatPackingRouter`: where Serve sends a new session of a model with seats.

A replica with `sessions_per_replica: N` takes N session calls at once
(`max_ongoing_requests: N`). Serve's default router picks the less busy of two random
replicas, which spreads sessions thinly: every replica ends up with a session or two,
so none is ever idle for the autoscaling policy to let go, and warm spares get used up
by sessions that had a seat elsewhere. This router packs instead: it offers Serve the
replicas fullest first, so a session takes a free seat on a busy replica before an
idle one, idle replicas stay whole for the next burst, and a scale-down finds
replicas whose seats are all free.

Serve calls `choose_replicas` for each waiting session; each rank it returns is tried
in order (its queue length read from Serve's cache, or probed), and a full replica is
passed over for the next rank, so a session never waits while any seat is free.
Requests keep Serve's FIFO order (`FIFOMixin`).
"""

from __future__ import annotations

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

__all__ = ["SEAT_ROUTER_IMPORT_PATH", "SeatPackingRouter", "packing_order"]

# What a model deployment's `request_router_config.request_router_class` names.
SEAT_ROUTER_IMPORT_PATH = "reactor_serve.serve.seat_router:SeatPackingRouter"


def packing_order(seats_used: dict[str, int | None], seats: dict[str, int]) -> list[str]:
    """Replica ids, the fullest with a free seat first, then the idle (or unknown)
    ones, then the full ones (tried last: Serve's figure may be stale). Ties keep
    the given order."""

    def key(replica: str) -> tuple[int, int]:
        used = seats_used.get(replica) or 0
        if used >= seats[replica]:
            return (2, 0)
        return (0, -used) if used > 0 else (1, 0)

    return sorted(seats_used, key=key)


class SeatPackingRouter(FIFOMixin, RequestRouter):
    """Offers the replicas with a free seat, fullest first, one rank each."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        cache = self.replica_queue_len_cache
        by_id = {str(r.replica_id): r for r in candidate_replicas}
        used = {rid: cache.get(r.replica_id) for rid, r in by_id.items()}
        seats = {rid: r.max_ongoing_requests for rid, r in by_id.items()}
        return [[by_id[rid]] for rid in packing_order(used, seats)]
