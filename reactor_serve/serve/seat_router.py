"""`SeatPackingRouter`: where Serve sends a new session of a model with seats.

A replica with `sessions_per_replica: N` takes N session calls at once
(`max_ongoing_requests: N`). Serve's default router picks the less busy of two random
replicas, which spreads sessions thinly: every replica ends up with a session or two,
so none is ever idle for the autoscaling policy to let go, and warm spares get used up
by sessions that had a seat elsewhere. This router packs instead, first fit by age: a
session takes a free seat on the oldest replica that has one (each replica reports
when it started in its routing statistics). Serve stops the newest replicas first when it scales down, so the newest are
the ones left idle, and a replica that is the newest while it holds sessions gets no
more of them and empties as they end. The autoscaling policy (serve/policy.py) lets a
replica go only once it is idle; together they mean a scale-down stops an idle
replica rather than draining a busy one.

Serve calls `choose_replicas` for each waiting session; each rank it returns is tried
in order (its queue length read from Serve's cache, or probed), and a full replica is
passed over for the next rank, so a session never waits while any seat is free. The
order is by age alone, never by the cached counts: each ingress replica's router
counts only the sessions it sent itself and what it probed up to Serve's cache
timeout ago, so an old replica whose sessions ended through another ingress replica
still looks full to it. Serve probes a replica its cache counts as full before passing
it over, so at its rank the old replica is asked afresh, where ranking it behind the
"free" ones would hand the session to a younger replica.
Requests keep Serve's FIFO order (`FIFOMixin`).
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

__all__ = [
    "SEAT_ROUTER_IMPORT_PATH", "STARTED_AT_STAT", "SeatPackingRouter", "age_keys",
    "packing_order",
]

# What a model deployment's `request_router_config.request_router_class` names.
SEAT_ROUTER_IMPORT_PATH = "reactor_serve.serve.seat_router:SeatPackingRouter"
# The routing statistic a model replica reports its start (wall-clock seconds) in.
STARTED_AT_STAT = "started_at"


def age_keys(
    started: dict[str, float | None], first_seen: dict[str, int]
) -> dict[str, tuple[int, float]]:
    """Per replica, a key that sorts the oldest first: when it started, as it reports
    in its routing statistics, so every router (one per ingress replica) agrees; a
    replica that has not reported yet comes after every one that has (it is new), in
    the order this router first saw it."""
    return {
        rid: (0, at) if at is not None else (1, float(first_seen.get(rid, 0)))
        for rid, at in started.items()
    }


def _started_at(replica: RunningReplica) -> float | None:
    stats = getattr(replica, "routing_stats", None) or {}
    value = stats.get(STARTED_AT_STAT) if isinstance(stats, dict) else None
    return float(value) if isinstance(value, (int, float)) and value == value else None


def packing_order(replicas: list[str], seen: dict[str, Any] | None = None) -> list[str]:
    """Replica ids oldest first: `seen` gives each an age key (`age_keys`), smaller
    being older; replicas without one, or of one age, keep the given order.

    First fit by age rather than fullest first: the fullest replica may be the newest,
    the one Serve stops first, and sessions sent there would keep it busy while an
    older replica idles."""
    seen = seen or {}
    return sorted(replicas, key=lambda replica: (0, seen[replica]) if replica in seen else (1,))


class SeatPackingRouter(FIFOMixin, RequestRouter):
    """Offers the replicas oldest first, one rank each; Serve passes over the full."""

    def initialize_state(self, **kwargs: object) -> None:
        # Replica id -> when this router first saw it: the order replicas came up in
        # (those already running when it started, in the order Serve listed them).
        self._first_seen: dict[str, int] = {}
        self._seen_count = 0

    def _ages(self, replica_ids: list[str]) -> dict[str, int]:
        if not hasattr(self, "_first_seen"):
            self.initialize_state()
        for rid in replica_ids:
            if rid not in self._first_seen:
                self._first_seen[rid] = self._seen_count
                self._seen_count += 1
        if len(self._first_seen) > 4 * len(replica_ids) + 16:
            # Replicas long gone: forget them (the live ones keep their places).
            live = set(replica_ids)
            self._first_seen = {r: n for r, n in self._first_seen.items() if r in live}
        return self._first_seen

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {str(r.replica_id): r for r in candidate_replicas}
        seen = age_keys({rid: _started_at(r) for rid, r in by_id.items()},
                        self._ages(list(by_id)))
        return [[by_id[rid]] for rid in packing_order(list(by_id), seen)]
