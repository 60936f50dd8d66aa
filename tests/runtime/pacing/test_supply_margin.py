"""The supply-margin estimator's arithmetic, driven with made-up times: the margin's
samples and smoothing, stalls and what does not count as one, and the producer's pace
and spread from a line through its arrivals."""

import math

import pytest

from reactor_serve.runtime.pacing.supply_margin import SupplyMargin

TAU = SupplyMargin.MARGIN_TIME_CONSTANT_S


def _arrive(supply, now, queued=0, delivered=0, *, fps=24.0, pauses=0, monitoring=True):
    supply.arrived(
        now, queued=queued, delivered=delivered, fps=fps, pauses=pauses, monitoring=monitoring
    )


def _steady(supply, times, frames=12, pauses=0, monitoring=True):
    """Blocks of `frames` arriving at `times`, each taken before the next comes."""
    delivered = 0
    for t in times:
        _arrive(supply, t, delivered=delivered, pauses=pauses, monitoring=monitoring)
        delivered += frames
    return delivered


# ---- the margin ------------------------------------------------------------------


def test_nothing_is_known_before_the_first_arrival():
    supply = SupplyMargin()
    assert supply.margin() is None
    assert supply.spread() == 0.0
    assert not supply.jitter_measured
    assert supply.arrival_rate() is None


def test_a_sample_is_what_was_queued_plus_the_part_of_a_tick_until_the_next():
    supply = SupplyMargin()
    supply.note_next_tick(10.0125, 0.05)
    _arrive(supply, 10.0, queued=2)
    assert supply.margin() == pytest.approx(2.25)


@pytest.mark.parametrize("slot, fraction", [(9.9, 0.0), (10.5, 1.0)])
def test_the_part_of_a_tick_is_kept_between_none_and_one(slot, fraction):
    supply = SupplyMargin()
    supply.note_next_tick(slot, 0.05)
    _arrive(supply, 10.0, queued=3)
    assert supply.margin() == pytest.approx(3.0 + fraction)


def test_samples_are_smoothed_with_the_time_constant():
    supply = SupplyMargin()
    _arrive(supply, 0.0, queued=0)
    _arrive(supply, TAU, queued=4)
    expected = 4.0 * (1 - math.exp(-1))
    assert supply.margin() == pytest.approx(expected)
    _arrive(supply, 3 * TAU, queued=0)
    assert supply.margin() == pytest.approx(expected * math.exp(-2))


def test_each_empty_tick_before_an_arrival_is_a_whole_frame_of_stall():
    supply = SupplyMargin()
    _arrive(supply, 0.0, queued=0)
    supply.ran_dry(monitoring=True)
    supply.ran_dry(monitoring=True)
    supply.note_next_tick(100.04, 0.05)  # a tick fraction does not soften a stall
    _arrive(supply, 100.0, queued=0)
    assert supply.margin() == pytest.approx(-2.0)
    # Counted once: the next arrival samples the queue again.
    _arrive(supply, 200.0, queued=1)
    assert supply.margin() == pytest.approx(1.0)  # its tick is past: no fraction


def test_a_long_stall_is_kept_at_the_floor():
    supply = SupplyMargin()
    _arrive(supply, 0.0)
    for _ in range(50):
        supply.ran_dry(monitoring=True)
    _arrive(supply, 100.0)
    assert supply.margin() == SupplyMargin.MARGIN_FLOOR


def test_the_first_arrival_forgives_the_empty_ticks_before_it():
    supply = SupplyMargin()
    for _ in range(5):
        supply.ran_dry(monitoring=True)
    _arrive(supply, 1.0, queued=0)
    assert supply.margin() == 0.0


def test_no_stall_is_counted_during_an_intended_pause():
    supply = SupplyMargin()
    _arrive(supply, 0.0)
    for _ in range(5):
        supply.ran_dry(monitoring=False)
    _arrive(supply, 100.0, queued=1)
    assert supply.margin() == pytest.approx(1.0)


def test_after_stale_frames_are_dropped_empty_ticks_are_no_stall_until_the_next_arrival():
    supply = SupplyMargin()
    _arrive(supply, 0.0)
    supply.ran_dry(monitoring=True)
    supply.stale_dropped()  # forgets the stall before it too
    supply.ran_dry(monitoring=True)
    _arrive(supply, 100.0, queued=0)
    assert supply.margin() == pytest.approx(0.0)
    # The gap ends with that arrival: an empty tick after it is a stall again.
    supply.ran_dry(monitoring=True)
    _arrive(supply, 200.0, queued=0)
    assert supply.margin() == pytest.approx(-1.0)


def test_puts_within_half_a_tick_are_one_arrival():
    """The rest of a block put frame by frame is no new sample (nor a stall's end)."""
    supply = SupplyMargin()
    _arrive(supply, 0.0, queued=0, fps=10.0)
    _arrive(supply, 10.0, queued=0, fps=10.0)  # sample 0, margin stays 0
    _arrive(supply, 10.04, queued=5, fps=10.0)  # under half of a 0.1 s tick
    assert supply.margin() == 0.0
    _arrive(supply, 10.1, queued=5, fps=10.0)
    assert supply.margin() > 0.0


def test_the_clocks_interval_sets_what_counts_as_one_arrival():
    supply = SupplyMargin()
    supply.note_next_tick(0.0, 1.0)  # a one-second tick: half a second is one arrival
    _arrive(supply, 0.0, queued=0, fps=100.0)
    _arrive(supply, 0.4, queued=7, fps=100.0)
    assert supply.margin() == 0.0


def test_reset_starts_the_measurement_over():
    supply = SupplyMargin()
    _steady(supply, [0.5 * k for k in range(8)])
    _arrive(supply, 4.1, delivered=96)  # late: some spread
    assert supply.jitter_measured
    supply.ran_dry(monitoring=True)
    supply.reset()
    assert supply.margin() is None
    assert supply.spread() == 0.0 and not supply.jitter_measured
    _arrive(supply, 50.0, queued=2)
    assert supply.margin() == pytest.approx(2.0)
    assert supply.arrival_rate() is None


# ---- the pace and the spread --------------------------------------------------------


def test_the_pace_is_the_slope_of_the_recent_arrivals():
    supply = SupplyMargin()
    # Arrivals inside the session's first PACE_START_S do not count.
    start = SupplyMargin.PACE_START_S
    times = [0.0] + [start + 0.5 * k for k in range(SupplyMargin.PACE_MIN_ARRIVALS)]
    _steady(supply, times)
    assert supply.arrival_rate() is None  # a line needs PACE_MIN_ARRIVALS behind it
    _arrive(supply, start + 2.0, delivered=12 * len(times))
    assert supply.arrival_rate() == pytest.approx(24.0)
    assert supply.spread() == pytest.approx(0.0, abs=1e-12)
    assert supply.jitter_measured


def test_a_late_arrival_spreads_by_the_frames_the_pace_would_have_brought():
    supply = SupplyMargin()
    # (2, 48), (2.5, 60), (3, 72), (3.5, 84) on the line: 24 frames a second.
    _steady(supply, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5])
    # Due at 4.0; 0.1 s late is 2.4 frames the line expected and that did not come.
    # The spread's first sample counts in full, not as a fraction of its weight.
    _arrive(supply, 4.1, delivered=96)
    assert supply.spread() == pytest.approx(2.4)


def test_only_the_last_window_of_arrivals_sets_the_pace():
    supply = SupplyMargin()
    fast = [0.5 * k for k in range(21)]  # 24 frames a second up to 10 s
    delivered = _steady(supply, fast)
    assert supply.arrival_rate() == pytest.approx(24.0)
    for k in range(1, 21):  # then 12 frames a second
        _arrive(supply, 10.0 + 0.5 * k, delivered=delivered)
        delivered += 6
    assert supply.arrival_rate() == pytest.approx(12.0)


@pytest.mark.parametrize("how", ["declared", "monitoring off", "undeclared"])
def test_an_intended_pause_starts_the_pace_over_and_is_no_lateness(how):
    supply = SupplyMargin()
    delivered = _steady(supply, [0.5 * k for k in range(12)])
    assert supply.arrival_rate() == pytest.approx(24.0)
    pauses = 1 if how == "declared" else 0
    # Nothing came from 5.5 s to 20 s; then the same steady blocks again.
    _arrive(supply, 20.0, delivered=delivered, pauses=pauses, monitoring=how != "monitoring off")
    if how == "undeclared":
        assert supply.spread() > 1.0
        return
    assert supply.arrival_rate() is None
    for k in range(1, SupplyMargin.PACE_MIN_ARRIVALS + 2):
        delivered += 12
        _arrive(supply, 20.0 + 0.5 * k, delivered=delivered, pauses=pauses)
    assert supply.arrival_rate() == pytest.approx(24.0)
    assert supply.spread() == pytest.approx(0.0, abs=1e-12)
