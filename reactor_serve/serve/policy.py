"""The session autoscaling policy for model deployments.

Each replica holds one live session (`max_ongoing_requests: 1`), so the demand is the
number of session calls, live or waiting in Serve's queue, and the target is::

    ceil(sessions / slots_per_replica) + warm_spares, within [min, max]

Warm spares exist because a cold replica loads its model for minutes while a user
waits; keeping `warm_spares` idle replicas lets the next user start at once.

A scale-down never drains a busy replica on purpose. Serve chooses which replicas to
stop, the newest first (ray/serve/_private/deployment_scheduler.py,
`_get_replicas_to_stop`), so the policy lowers the count only by as many replicas as
are idle at the young end of `running_replicas` (Serve's own order, oldest first).
Each replica reports its seats in use as the custom metric `seats_used`
(`ModelReplica.record_autoscaling_stats`), and Serve hands the policy the largest value
of each replica's look-back window. A replica that has not reported yet counts as busy.

How Ray Serve 2.60 runs a custom policy (ray/serve/_private/autoscaling_state.py,
ray/serve/autoscaling_policy.py):

- `autoscaling_config.policy.policy_function` names "module:attr". If attr is a
  class, the controller instantiates it ONCE with `**policy_kwargs` and then calls
  the instance with the `AutoscalingContext` on every tick. If attr is a plain
  function it is called with the context alone and `policy_kwargs` are NOT passed.
  That is why the deployment options name `SessionAutoscalingPolicy` (the class).
- The call returns `(num_replicas, policy_state)`; `num_replicas` may be a float
  (Serve rounds it up) and `policy_state` must be a dict (Serve merges its own
  delay bookkeeping into it).
- Serve then applies upscaling/downscaling factors, `upscale_delay_s`,
  `downscale_delay_s` and the min/max bounds itself.

The module is pickled BY VALUE into Serve's controller (cloudpickle
`register_pickle_by_value`), so it must stay self-contained and import-light: only
the standard library, no aiortc, torch or other reactor_serve modules.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: the controller never needs the import
    from ray.serve.config import AutoscalingContext

__all__ = [
    "POLICY_IMPORT_PATH",
    "SEATS_USED_METRIC",
    "SessionAutoscalingPolicy",
    "replicas_to_keep",
    "session_autoscaling_policy",
    "target_replicas",
]

# What `autoscaling_config.policy.policy_function` names (a class, so that Serve
# passes `policy_kwargs` to it).
POLICY_IMPORT_PATH = "reactor_serve.serve.policy:SessionAutoscalingPolicy"

# The custom autoscaling metric each replica reports: its seats holding a session.
SEATS_USED_METRIC = "seats_used"

# Float noise in averaged metrics (e.g. 2.0000000001 sessions) must not buy a replica.
_EPSILON = 1e-6


def target_replicas(
    sessions: float,
    *,
    slots_per_replica: int,
    warm_spares: int,
    min_replicas: int,
    max_replicas: int,
) -> int:
    """Replicas for `sessions` live + waiting sessions: enough slots for all of them
    plus `warm_spares` idle replicas, clamped to `[min_replicas, max_replicas]`.

    `sessions` may be fractional (metrics averaged over a window); it is rounded up,
    since a partly busy replica is still busy.
    """
    if slots_per_replica < 1:
        raise ValueError(f"slots_per_replica must be >= 1, got {slots_per_replica}")
    if warm_spares < 0:
        raise ValueError(f"warm_spares must be >= 0, got {warm_spares}")
    # Negative or NaN metrics (a difference of windows, a missing sample) mean none.
    sessions = sessions if sessions > 0 else 0.0
    busy = math.ceil(sessions / slots_per_replica - _EPSILON)
    target = max(busy, 0) + warm_spares
    # max before min: if the bounds ever cross, max_replicas wins (Serve clamps the
    # same way afterwards).
    return max(0, min(max_replicas, max(min_replicas, target)))


def replicas_to_keep(running: list[Any], seats_used: dict[Any, float] | None) -> int:
    """How few of the `running` replicas (oldest first) Serve may be asked to keep
    without stopping one that holds a session: all but the idle ones at the young end.

    With no reports at all (custom metrics off or failing) nothing is held back, so
    the seat count alone decides, as it would without this rule."""
    if not seats_used:
        return 0
    keep = len(running)
    for replica in reversed(running):
        used = seats_used.get(replica)
        # Unknown (not reported yet) or NaN counts as busy.
        if used is None or not used <= _EPSILON:
            break
        keep -= 1
    return keep


def _decide(ctx: AutoscalingContext, *, slots_per_replica: int, warm_spares: int) -> int:
    # total_num_requests counts running + queued session calls (at handles and
    # replicas), aggregated over look_back_period_s with the aggregation_function.
    sessions = float(ctx.total_num_requests or 0.0)
    target = target_replicas(
        sessions,
        slots_per_replica=slots_per_replica,
        warm_spares=warm_spares,
        # The capacity-adjusted bounds honour Serve's target_capacity.
        min_replicas=ctx.capacity_adjusted_min_replicas,
        max_replicas=ctx.capacity_adjusted_max_replicas,
    )
    if target >= ctx.current_num_replicas:
        return target
    metrics = ctx.aggregated_metrics or {}
    keep = replicas_to_keep(list(ctx.running_replicas or []), metrics.get(SEATS_USED_METRIC))
    # The max bound still wins: an operator who lowers it means it.
    return min(max(target, keep), ctx.capacity_adjusted_max_replicas)


def _state(ctx: AutoscalingContext, target: int) -> dict[str, Any]:
    # Returned as the policy's state; Serve merges its own delay counters into it.
    # Kept for inspection only: the decision never depends on it.
    return {"sessions": float(ctx.total_num_requests or 0.0), "target": target}


class SessionAutoscalingPolicy:
    """The policy Serve instantiates once per deployment with `policy_kwargs`
    (`warm_spares`, `slots_per_replica`) and calls with the context every tick."""

    def __init__(self, warm_spares: int = 1, slots_per_replica: int = 1) -> None:
        if slots_per_replica < 1:
            raise ValueError(f"slots_per_replica must be >= 1, got {slots_per_replica}")
        if warm_spares < 0:
            raise ValueError(f"warm_spares must be >= 0, got {warm_spares}")
        self.warm_spares = int(warm_spares)
        self.slots_per_replica = int(slots_per_replica)

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        target = _decide(
            ctx, slots_per_replica=self.slots_per_replica, warm_spares=self.warm_spares
        )
        return target, _state(ctx, target)

    def __repr__(self) -> str:
        return (
            f"SessionAutoscalingPolicy(warm_spares={self.warm_spares}, "
            f"slots_per_replica={self.slots_per_replica})"
        )


def session_autoscaling_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """The same policy as a plain function, for a `policy_function` that names it.

    Serve calls a plain function with the context alone (no `policy_kwargs`), so the
    settings are read from the deployment's own config,
    `ctx.config.policy.policy_kwargs`; absent ones default to 1 spare, 1 slot.
    """
    kwargs = _policy_kwargs(ctx)
    target = _decide(
        ctx,
        slots_per_replica=int(kwargs.get("slots_per_replica", 1)),
        warm_spares=int(kwargs.get("warm_spares", 1)),
    )
    return target, _state(ctx, target)


def _policy_kwargs(ctx: AutoscalingContext) -> dict[str, Any]:
    policy = getattr(getattr(ctx, "config", None), "policy", None)
    kwargs = getattr(policy, "policy_kwargs", None)
    # After a proto round trip an empty kwargs dict may come back as b"".
    return kwargs if isinstance(kwargs, dict) else {}
