"""The session autoscaling policy, alone and as Ray Serve 2.60 loads and runs it."""

from __future__ import annotations

import math
import warnings

import pytest
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from reactor_serve.serve.config import ModelEntry, model_deployment_options
from reactor_serve.serve.policy import (
    POLICY_IMPORT_PATH,
    SEATS_USED_METRIC,
    SessionAutoscalingPolicy,
    replicas_to_keep,
    session_autoscaling_policy,
    target_replicas,
)


def _target(sessions: float, *, spares: int = 1, slots: int = 1, lo: int = 0, hi: int = 10) -> int:
    return target_replicas(
        sessions, slots_per_replica=slots, warm_spares=spares, min_replicas=lo, max_replicas=hi
    )


# --------------------------------------------------------------------------- pure helper


@pytest.mark.parametrize(
    ("sessions", "expected"),
    [(0, 1), (1, 2), (2, 3), (5, 6)],
)
def test_one_spare_beyond_the_sessions(sessions: float, expected: int) -> None:
    assert _target(sessions) == expected


def test_no_spares() -> None:
    assert _target(0, spares=0) == 0
    assert _target(3, spares=0) == 3


def test_several_slots_per_replica() -> None:
    assert _target(3, slots=2, spares=0) == 2
    assert _target(4, slots=2, spares=1) == 3


@pytest.mark.parametrize(
    ("sessions", "expected"),
    [(0.2, 2), (1.5, 3), (2.0000000001, 3), (0.999, 2)],
)
def test_fractional_sessions_round_up(sessions: float, expected: int) -> None:
    # Averaged metrics are fractional: a partly busy replica is still busy (float noise
    # just above a whole number does not buy a replica).
    assert _target(sessions) == expected


def test_clamped_to_max() -> None:
    assert _target(10, hi=4) == 4


def test_clamped_to_min() -> None:
    assert _target(0, lo=3) == 3
    assert _target(0, spares=0, lo=2) == 2


def test_negative_or_nan_sessions_count_as_none() -> None:
    assert _target(-1.0) == 1
    assert _target(float("nan")) == 1


def test_bad_parameters_rejected() -> None:
    with pytest.raises(ValueError, match="slots_per_replica"):
        _target(1, slots=0)
    with pytest.raises(ValueError, match="warm_spares"):
        _target(1, spares=-1)
    with pytest.raises(ValueError, match="slots_per_replica"):
        SessionAutoscalingPolicy(slots_per_replica=0)


# --------------------------------------------------------------------------- with a context


def _config(**kwargs):
    opts = model_deployment_options(ModelEntry(path="m", **kwargs), "m", gpus=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # metrics_interval_s
        return AutoscalingConfig(**opts["autoscaling_config"])


def _context(
    total: float,
    *,
    queued: float = 0.0,
    current: int = 1,
    target: int = 1,
    lo: int = 1,
    hi: int = 4,
    config=None,
    state=None,
    running=(),
    seats_used=None,
):
    from ray.serve._private.common import DeploymentID

    return AutoscalingContext(
        deployment_id=DeploymentID(name="model-m", app_name="reactor"),
        deployment_name="model-m",
        app_name="reactor",
        current_num_replicas=current,
        target_num_replicas=target,
        running_replicas=list(running),
        total_num_requests=total,
        total_queued_requests=queued,
        aggregated_metrics={} if seats_used is None else {SEATS_USED_METRIC: seats_used},
        raw_metrics={},
        capacity_adjusted_min_replicas=lo,
        capacity_adjusted_max_replicas=hi,
        policy_state=dict(state or {}),
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=0.0,
        config=config if config is not None else _config(),
    )


@pytest.mark.parametrize(
    ("total", "expected"),
    [(0, 1), (1, 2), (2, 3), (2.5, 4), (100, 4)],
)
def test_policy_class_on_context(total: float, expected: int) -> None:
    # total_num_requests is live + queued session calls.
    policy = SessionAutoscalingPolicy(warm_spares=1, slots_per_replica=1)
    replicas, state = policy(_context(total, lo=1, hi=4))
    assert replicas == expected
    assert isinstance(state, dict)


def test_queued_sessions_counted() -> None:
    # 1 live + 2 waiting: total_num_requests is 3 -> 3 busy + 1 spare.
    replicas, _ = SessionAutoscalingPolicy()(_context(3, queued=2, hi=10))
    assert replicas == 4


def test_policy_uses_capacity_adjusted_bounds() -> None:
    policy = SessionAutoscalingPolicy(warm_spares=2)
    assert policy(_context(0, lo=3, hi=8))[0] == 3
    assert policy(_context(9, lo=0, hi=5))[0] == 5


def test_replicas_to_keep_counts_only_the_idle_at_the_young_end() -> None:
    # Serve stops the newest first: only idle ones there may go.
    assert replicas_to_keep(["a", "b", "c"], {"a": 2, "b": 0, "c": 0}) == 1
    assert replicas_to_keep(["a", "b", "c"], {"a": 0, "b": 0, "c": 1}) == 3
    assert replicas_to_keep(["a", "b", "c"], {"a": 0, "b": 1, "c": 0}) == 2
    assert replicas_to_keep(["a", "b"], {"a": 0, "b": 0}) == 0
    # Not reported yet, or NaN: busy.
    assert replicas_to_keep(["a", "b"], {"a": 0}) == 2
    assert replicas_to_keep(["a", "b"], {"a": 0, "b": float("nan")}) == 2
    # No reports at all: nothing held back.
    assert replicas_to_keep(["a", "b"], {}) == 0
    assert replicas_to_keep(["a", "b"], None) == 0


def test_a_scale_down_waits_for_the_newest_replica_to_be_idle() -> None:
    policy = SessionAutoscalingPolicy(warm_spares=0, slots_per_replica=2)
    # One session left, on the newest replica: the seat count says 1, but Serve would
    # stop the newest (busy) one, so the policy holds both.
    held = _context(1, current=2, lo=1, hi=4, running=["old", "new"],
                    seats_used={"old": 0.0, "new": 1.0})
    assert policy(held)[0] == 2
    # Once its session moved on (or ended) and the newest is idle, one goes.
    freed = _context(1, current=2, lo=1, hi=4, running=["old", "new"],
                     seats_used={"old": 1.0, "new": 0.0})
    assert policy(freed)[0] == 1
    # Scaling up is never held back.
    assert policy(_context(5, current=2, lo=1, hi=4, running=["old", "new"],
                           seats_used={"old": 2.0, "new": 2.0}))[0] == 3
    # The operator's max still wins over a busy replica.
    assert policy(_context(4, current=3, lo=1, hi=2, running=["a", "b", "c"],
                           seats_used={"a": 2.0, "b": 1.0, "c": 1.0}))[0] == 2


def test_function_form_reads_kwargs_from_config() -> None:
    # Serve calls a plain function without policy_kwargs; it reads them from the config.
    ctx = _context(1, hi=10, config=_config(warm_spares=3, max_replicas=10))
    assert session_autoscaling_policy(ctx)[0] == 4


# --------------------------------------------------------------------------- as Serve loads it


def test_policy_path_names_the_class() -> None:
    import importlib

    module_name, attr = POLICY_IMPORT_PATH.split(":")
    assert importlib.import_module(module_name).__dict__[attr] is SessionAutoscalingPolicy


def test_policy_module_is_import_light() -> None:
    # Serve's controller imports (unpickles) the policy; it must not drag in the
    # media stack or the model runtime.
    import reactor_serve.serve.policy as policy_module

    source = open(policy_module.__file__, encoding="utf-8").read()
    for heavy in ("aiortc", "torch", "av", "numpy", "reactor_serve."):
        assert f"import {heavy}" not in source and f"from {heavy}" not in source


def test_serve_instantiates_the_class_with_policy_kwargs() -> None:
    """Ray 2.60: a class named by policy_function is instantiated once with
    policy_kwargs, then wrapped with the delay/bounds logic and called with the context."""
    from ray.serve._private import autoscaling_state
    from ray.serve.autoscaling_policy import _apply_autoscaling_config

    config = _config(warm_spares=2, max_replicas=6)
    # The cloudpickled definition round-trips (as it does into the controller).
    policy = AutoscalingPolicy.from_serialized_policy_def(
        config.policy.model_dump(), config.policy.get_serialized_policy_def()
    )
    resolved = autoscaling_state._resolve_policy_callable(policy)
    assert isinstance(resolved, SessionAutoscalingPolicy) or type(resolved).__name__ == (
        "SessionAutoscalingPolicy"
    )
    assert resolved.warm_spares == 2

    wrapped = _apply_autoscaling_config(resolved)
    # upscale_delay_s is 0: the first tick that sees demand scales up.
    replicas, state = wrapped(_context(1, current=2, target=2, lo=1, hi=6, config=config))
    assert replicas == 3
    assert isinstance(state, dict)
    # downscale_delay_s (30 s) holds a lower target back on the first tick.
    replicas, _ = wrapped(_context(0, current=4, target=4, lo=1, hi=6, config=config))
    assert replicas == 4


def test_policy_kwargs_survive_the_proto_round_trip() -> None:
    from ray.serve._private.config import DeploymentConfig

    opts = model_deployment_options(ModelEntry(path="m", warm_spares=2), "m", gpus=0.0)
    fields = {k: v for k, v in opts.items() if k not in ("name", "ray_actor_options")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = DeploymentConfig.from_default(**fields)
        again = DeploymentConfig.from_proto_bytes(config.to_proto_bytes())
    assert again.autoscaling_config.policy.policy_kwargs == {
        "warm_spares": 2,
        "slots_per_replica": 1,
    }
    assert again.autoscaling_config.policy.policy_function == POLICY_IMPORT_PATH
    assert again.max_ongoing_requests == 1


def test_math_sanity_against_formula() -> None:
    for sessions in (0, 0.5, 1, 3.2, 7):
        for spares in (0, 1, 2):
            expected = min(10, max(0, math.ceil(sessions) + spares))
            assert _target(sessions, spares=spares) == expected
