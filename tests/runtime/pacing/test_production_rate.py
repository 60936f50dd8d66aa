"""Tests for reactor_serve.runtime.pacing.production_rate.ProductionRate.

All times are simulated: the estimator only ever sees the `now` values passed in.
"""

from __future__ import annotations

import threading

import pytest

from reactor_serve.runtime.pacing.production_rate import ProductionRate


def _emit(rate: ProductionRate, called: float, frames: int, returned: float | None = None,
          compute_time: float | None = None) -> None:
    """One emit as a producer makes it: `record` when called, `returned` when it returns."""
    rate.record(called, frames, compute_time)
    rate.returned(called if returned is None else returned)


# ---- nothing to go on -------------------------------------------------------------


def test_no_rate_before_any_emit():
    assert ProductionRate().rate() is None


def test_first_emit_without_compute_time_gives_no_sample():
    r = ProductionRate()
    r.record(5.0, 12, None)
    assert r.rate() is None
    r.returned(5.0)
    assert r.rate() is None
    # The second emit is measured from where the first returned.
    r.record(5.5, 12, None)
    assert r.rate() == pytest.approx(24.0)


# ---- inter-emit time: the model's own time ------------------------------------------


def test_rate_from_inter_emit_time_per_frame():
    r = ProductionRate()
    t = 0.0
    r.returned(t)
    for _ in range(10):
        t += 0.04
        _emit(r, t, 1)
    assert r.rate() == pytest.approx(25.0)


def test_rate_from_inter_emit_time_blocks():
    r = ProductionRate()
    r.returned(0.0)
    for k in range(1, 5):
        _emit(r, 0.5 * k, 12)
    assert r.rate() == pytest.approx(24.0)


def test_time_blocked_inside_emit_is_not_counted():
    """Measured from `returned()` to the next `record()`: waiting for buffer space
    inside emit is not the model being slow."""
    r = ProductionRate()
    r.returned(0.0)
    # Each emit works 0.5 s, then waits 0.3 s for space before returning.
    t = 0.0
    for _ in range(6):
        t += 0.5
        r.record(t, 12, None)
        t += 0.3
        r.returned(t)
    # 12 frames per 0.5 s of the model's own time, not per 0.8 s of wall time.
    assert r.rate() == pytest.approx(24.0)
    assert r.rate() != pytest.approx(12 / 0.8)


def test_sample_uses_latest_return_not_previous_call():
    r = ProductionRate()
    r.returned(0.0)
    _emit(r, 0.5, 10)  # the session's first sample: dropped once there is another
    r.record(1.5, 10, None)  # 10 frames / 1.0 s
    r.returned(3.5)  # blocked two seconds
    r.record(3.75, 10, None)  # 10 frames / 0.25 s (not 2.25 s)
    assert r.rate() == pytest.approx(20 / 1.25)


def test_first_sample_stands_alone_until_the_second_comes():
    r = ProductionRate()
    # A slow first forward pass (warm-up), then the model's real pace.
    r.record(0.0, 12, 1.0)
    assert r.rate() == pytest.approx(12.0)  # all there is to go on
    r.record(0.5, 12, 0.5)
    assert r.rate() == pytest.approx(24.0)  # not 24 frames / 1.5 s
    r.record(1.0, 12, 0.4)
    assert r.rate() == pytest.approx(24 / 0.9)  # later samples all count
    # After a restart the next session's first sample is dropped the same way.
    r.restart()
    r.record(5.0, 12, 2.0)
    r.record(5.5, 12, 0.5)
    assert r.rate() == pytest.approx(24.0)


def test_non_positive_interval_gives_no_sample():
    r = ProductionRate()
    r.returned(1.0)
    r.record(1.0, 5, None)  # zero seconds since return
    assert r.rate() is None
    r.record(0.5, 5, None)  # negative (clock went backwards): ignored too
    assert r.rate() is None


# ---- compute_time -------------------------------------------------------------------


def test_rate_from_compute_time_when_given():
    r = ProductionRate()
    r.returned(0.0)
    # Emits every second of wall time, but reports 0.25 s of compute per 10 frames.
    for k in range(1, 5):
        _emit(r, float(k), 10, compute_time=0.25)
    assert r.rate() == pytest.approx(40.0)


def test_compute_time_counts_even_for_the_first_emit():
    r = ProductionRate()
    r.record(0.0, 12, 0.4)
    assert r.rate() == pytest.approx(30.0)


def test_zero_compute_time_falls_back_to_inter_emit_time():
    r = ProductionRate()
    r.returned(0.0)
    _emit(r, 0.1, 2, compute_time=0.0)
    assert r.rate() == pytest.approx(20.0)


def test_compute_time_and_inter_emit_samples_mix():
    r = ProductionRate()
    r.returned(0.0)
    _emit(r, 0.5, 10)  # 10 frames / 0.5 s measured
    _emit(r, 1.5, 10, compute_time=0.5)  # 10 frames / 0.5 s reported (1 s wall)
    assert r.rate() == pytest.approx(20.0)


# ---- the window -----------------------------------------------------------------------


def test_old_samples_fall_out_after_about_two_seconds():
    r = ProductionRate()
    t = 0.0
    r.returned(t)
    for _ in range(50):  # 5 s at 10 fps
        t += 0.1
        _emit(r, t, 1)
    assert r.rate() == pytest.approx(10.0)
    for _ in range(60):  # 3 s at 20 fps
        t += 0.05
        _emit(r, t, 1)
    # Only the last ~2 s are in the window: all at 20 fps.
    assert r.rate() == pytest.approx(20.0)


def test_window_is_a_short_average_not_a_single_sample():
    r = ProductionRate()
    t = 0.0
    r.returned(t)
    # Alternating fast and slow frames, 10 fps on average (20 fps and 6.7 fps alone).
    for k in range(40):
        t += 0.05 if k % 2 == 0 else 0.15
        _emit(r, t, 1)
    # ~2 s of samples: within one odd sample of the average, far from either extreme.
    assert r.rate() == pytest.approx(10.0, rel=0.05)


def test_at_least_min_samples_are_kept():
    r = ProductionRate()
    assert r.min_samples == 3
    t = 0.0
    r.returned(t)
    # Blocks far apart (5 s each): the 2 s window alone would hold a single block.
    for frames in (10, 20, 30, 40, 50):
        t += 5.0
        _emit(r, t, frames)
    assert r.rate() == pytest.approx((30 + 40 + 50) / 15.0)


def test_min_samples_is_configurable():
    r = ProductionRate(window_s=2.0, min_samples=1)
    t = 0.0
    r.returned(t)
    for frames in (10, 20, 30):
        t += 5.0
        _emit(r, t, frames)
    assert r.rate() == pytest.approx(30 / 5.0)


# ---- restart --------------------------------------------------------------------------


def test_restart_forgets_history_and_first_emit_gives_no_sample():
    r = ProductionRate()
    r.returned(0.0)
    for k in range(1, 5):
        _emit(r, 0.1 * k, 1)
    assert r.rate() == pytest.approx(10.0)

    r.restart()
    assert r.rate() is None
    # First emit of the new session: how long the model worked on it is unknown.
    r.record(100.0, 12, None)
    assert r.rate() is None
    r.returned(100.0)
    r.record(100.25, 12, None)
    assert r.rate() == pytest.approx(48.0)


def test_restart_reenables_monitoring():
    r = ProductionRate()
    r.set_monitoring(False, 0.0)
    assert not r.monitoring
    r.restart()
    assert r.monitoring
    r.record(1.0, 10, 0.5)
    assert r.rate() == pytest.approx(20.0)


# ---- monitoring -----------------------------------------------------------------------


def test_disable_monitoring_freezes_the_estimate():
    r = ProductionRate()
    t = 0.0
    r.returned(t)
    for _ in range(8):
        t += 0.5
        _emit(r, t, 12)
    assert r.rate() == pytest.approx(24.0)

    r.set_monitoring(False, t)
    assert not r.monitoring
    # Whatever happens while paused does not move the estimate.
    _emit(r, t + 10.0, 1)
    _emit(r, t + 20.0, 100, compute_time=0.01)
    assert r.rate() == pytest.approx(24.0)


def test_pauses_count_each_time_monitoring_is_disabled():
    r = ProductionRate()
    assert r.pauses == 0
    r.set_monitoring(False, 1.0)
    r.set_monitoring(False, 2.0)  # already paused: the same pause
    assert r.pauses == 1
    r.set_monitoring(True, 3.0)
    r.set_monitoring(False, 4.0)
    assert r.pauses == 2


def test_disable_before_any_sample_freezes_none():
    r = ProductionRate()
    r.set_monitoring(False, 0.0)
    r.record(1.0, 10, 0.1)
    assert r.rate() is None


def test_pause_does_not_count_after_enable():
    r = ProductionRate()
    t = 0.0
    r.returned(t)
    for _ in range(8):
        t += 0.5
        _emit(r, t, 12)
    r.set_monitoring(False, t)
    t += 30.0  # a long intentional pause, e.g. waiting for user input
    r.set_monitoring(True, t)
    assert r.monitoring
    # The model's own time restarts at enable: the next block took 0.5 s, not 30.5 s.
    t += 0.5
    _emit(r, t, 12)
    assert r.rate() == pytest.approx(24.0)
    t += 0.5
    _emit(r, t, 12)
    assert r.rate() == pytest.approx(24.0)


def test_enable_when_already_enabled_keeps_measuring():
    r = ProductionRate()
    r.returned(0.0)
    _emit(r, 0.5, 12)
    r.set_monitoring(True, 0.7)  # no-op: does not move where own time started
    r.record(1.0, 12, None)
    assert r.rate() == pytest.approx(24.0)


def test_rate_is_thread_safe_under_concurrent_use():
    r = ProductionRate()
    r.returned(0.0)
    errors: list[BaseException] = []

    def producer(offset: float) -> None:
        try:
            t = offset
            for _ in range(2000):
                t += 0.01
                r.record(t, 1, 0.01)
        except BaseException as exc:  # pragma: no cover - the failure path
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(2000):
                value = r.rate()
                assert value is None or value == pytest.approx(100.0)
        except BaseException as exc:  # pragma: no cover - the failure path
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(0.0,)), threading.Thread(target=reader)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "the producer or reader never finished"
    assert not errors
    assert r.rate() == pytest.approx(100.0)
