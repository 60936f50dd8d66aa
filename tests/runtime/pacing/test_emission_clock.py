"""Tests for reactor_serve.runtime.pacing.emission_clock.EmissionClock, in simulated time.

The clock and the buffer share an injected time source. A small discrete-event
simulation plays the producer (the model's emits: `record_emit`, `put_nowait`, and
`rate.returned` when the whole emit got in) against the consumer (`present()` at each
`next_slot`), so pacing can be checked exactly, without wall-clock timing.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from reactor_serve.interface.tracks import Audio, TrackDecl, Video
from reactor_serve.runtime.pacing.emission_clock import (
    AUDIO_CLOCK_RATE,
    VIDEO_CLOCK_RATE,
    EmissionClock,
    PresentedFrame,
)
from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer

VIDEO = [TrackDecl("main_video", "video", Video)]


class SimTime:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _make(fps: float = 30, capacity: int = 8, tracks=VIDEO, **kwargs):
    now = SimTime()
    buf = OutputBuffer(capacity, fps, clock=now)
    clock = EmissionClock(buf, tracks, clock=now, **kwargs)
    return now, buf, clock


def _frame(value: int, size: tuple[int, int] = (6, 8)) -> np.ndarray:
    return np.full((*size, 3), value % 256, dtype=np.uint8)


def _emit(buf: OutputBuffer, frames: list[np.ndarray], compute_time: float | None = None,
          audio: list[dict] | None = None) -> list[FrameItem]:
    items = [FrameItem(video={"main_video": f}) for f in frames]
    if audio is not None:
        for item, a in zip(items, audio):
            item.audio = a
    buf.record_emit(items, compute_time)
    buf.put_nowait(items)
    buf.rate.returned(buf.clock())
    return items


def _is_black(frame: np.ndarray, size: tuple[int, int]) -> bool:
    return frame.shape == (*size, 3) and frame.dtype == np.uint8 and not frame.any()


# ---- the discrete-event simulation ----------------------------------------------------


@dataclass
class Producer:
    """A model emitting `block` frames per emit, after `period` seconds of its own work
    (plus gaussian jitter), optionally reporting `compute_time`. When the buffer is
    full it stays blocked in its emit until everything got in."""

    block: int
    period: float
    jitter: float = 0.0
    compute_time: float | None = None
    report_compute_time: bool = False
    seed: int = 0
    size: tuple[int, int] = (4, 4)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.emits = 0

    def work(self) -> float:
        d = self.period + (self.rng.gauss(0.0, self.jitter) if self.jitter else 0.0)
        return max(d, 1e-4)

    def block_frames(self) -> list[np.ndarray]:
        self.emits += 1
        frame = _frame(self.emits, self.size)
        return [frame] * self.block


@dataclass
class SimResult:
    presented: list[PresentedFrame]
    depths: list[int]
    buffer: OutputBuffer
    clock: EmissionClock
    blocked_s: float = 0.0
    emit_times: list[float] = field(default_factory=list)

    def window(self, start: float, end: float | None = None) -> list[PresentedFrame]:
        end = math.inf if end is None else end
        return [p for p in self.presented if start <= p.slot < end]

    def new_rate(self, start: float, end: float) -> float:
        return sum(1 for p in self.window(start, end) if p.is_new) / (end - start)

    def intervals(self, start: float, end: float | None = None) -> np.ndarray:
        return np.diff([p.slot for p in self.window(start, end)])

    def held(self, start: float, end: float | None = None) -> int:
        return sum(1 for p in self.window(start, end) if not p.is_new)

    def latencies(self, start: float, end: float | None = None) -> np.ndarray:
        return np.array([p.slot - p.emitted_at for p in self.window(start, end) if p.is_new])


def simulate(producer: Producer, *, fps: float, capacity: int, duration: float,
             first_emit: float | None = None) -> SimResult:
    now = SimTime()
    buf = OutputBuffer(capacity, fps, clock=now)
    clock = EmissionClock(buf, VIDEO, clock=now, default_size=producer.size)
    presented: list[PresentedFrame] = []
    depths: list[int] = []
    emit_times: list[float] = []
    pending: list[FrameItem] = []
    blocked_since = 0.0
    blocked_s = 0.0
    next_emit = producer.work() if first_emit is None else first_emit
    next_slot = 0.0

    def emit_returned() -> None:
        nonlocal next_emit
        buf.rate.returned(now.t)
        next_emit = now.t + producer.work()

    while True:
        t_emit = math.inf if pending else next_emit
        if min(t_emit, next_slot) > duration:
            break
        if t_emit <= next_slot:
            now.t = t_emit
            emit_times.append(now.t)
            items = [FrameItem(video={"main_video": f}) for f in producer.block_frames()]
            ct = None
            if producer.report_compute_time:
                ct = producer.compute_time if producer.compute_time is not None else (
                    now.t - (emit_times[-2] if len(emit_times) > 1 else 0.0))
            buf.record_emit(items, ct)
            placed = buf.put_nowait(items)
            pending = items[placed:]
            if pending:
                blocked_since = now.t
            else:
                emit_returned()
        else:
            now.t = next_slot
            presented.append(clock.present())
            if pending:
                placed = buf.put_nowait(pending)
                pending = pending[placed:]
                if not pending:
                    blocked_s += now.t - blocked_since
                    emit_returned()
            depths.append(buf.depth())
            assert clock.next_slot is not None and clock.next_slot > now.t
            next_slot = clock.next_slot
    return SimResult(presented, depths, buf, clock, blocked_s, emit_times)


# ---- black, frames, hold --------------------------------------------------------------


def test_black_before_first_frame_at_default_size():
    now, buf, clock = _make()
    for _ in range(3):
        p = clock.present()
        frame = p.video["main_video"]
        assert _is_black(frame, (480, 640))
        assert p.is_new is False
        assert p.seq is None and p.emitted_at is None
        now.t = clock.next_slot
    assert clock.presented == 3
    assert clock.new_frames == 0


def test_black_before_first_frame_custom_default_size():
    now, buf, clock = _make(default_size=(72, 128))
    assert _is_black(clock.present().video["main_video"], (72, 128))


def test_a_later_sessions_black_is_at_the_size_the_model_last_made():
    # A second session on the same buffer (or the first after the model process was
    # restarted) shows black at the model's size before its first frame, not at the
    # default, so the client's video does not change size when the model's frames come.
    now, buf, first = _make(default_size=(480, 640))
    _emit(buf, [_frame(1, (48, 64))])
    assert first.present().video["main_video"].shape == (48, 64, 3)
    assert buf.last_size("main_video") == (48, 64)
    second = EmissionClock(buf, VIDEO, clock=now, default_size=(480, 640))
    assert _is_black(second.present().video["main_video"], (48, 64))


def test_emitted_frame_is_presented():
    now, buf, clock = _make()
    clock.present()  # black
    now.t = clock.next_slot
    frame = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    (item,) = _emit(buf, [frame])
    p = clock.present()
    assert p.is_new is True
    assert np.array_equal(p.video["main_video"], frame)
    assert p.seq == item.seq
    assert p.emitted_at == item.emitted_at == pytest.approx(now.t)
    assert clock.new_frames == 1


def test_frames_presented_in_order_one_per_tick():
    now, buf, clock = _make(capacity=8)
    frames = [_frame(v) for v in (10, 20, 30, 40)]
    items = _emit(buf, frames)
    for expected, item in zip(frames, items):
        p = clock.present()
        assert np.array_equal(p.video["main_video"], expected)
        assert p.seq == item.seq
        now.t = clock.next_slot
    assert buf.depth() == 0


def test_hold_last_frame_when_queue_empty():
    now, buf, clock = _make()
    frame = _frame(77)
    _emit(buf, [frame])
    first = clock.present()
    assert first.is_new
    for _ in range(5):
        now.t = clock.next_slot
        p = clock.present()
        assert p.is_new is False
        assert p.seq is None and p.emitted_at is None
        assert np.array_equal(p.video["main_video"], frame)
        assert p.video["main_video"].any()  # not black
    assert clock.new_frames == 1
    assert clock.presented == 6


def test_black_at_last_frame_size_after_flush():
    now, buf, clock = _make()
    _emit(buf, [_frame(200, (36, 64)), _frame(201, (36, 64))])
    clock.present()
    now.t = clock.next_slot
    buf.flush()  # drops the second frame too
    for _ in range(3):
        p = clock.present()
        assert p.is_new is False
        assert _is_black(p.video["main_video"], (36, 64))
        now.t = clock.next_slot


def test_flush_then_new_frame_shows_new_frame():
    now, buf, clock = _make()
    _emit(buf, [_frame(1)])
    clock.present()
    now.t = clock.next_slot
    buf.flush()
    _emit(buf, [_frame(2)])  # arrives before the next tick
    p = clock.present()
    assert p.is_new
    assert np.array_equal(p.video["main_video"], _frame(2))
    now.t = clock.next_slot
    # And it is held afterwards (the flush was already accounted for).
    p = clock.present()
    assert not p.is_new
    assert np.array_equal(p.video["main_video"], _frame(2))


def test_flush_before_any_frame_stays_black_at_default_size():
    now, buf, clock = _make(default_size=(10, 12))
    buf.flush()
    assert _is_black(clock.present().video["main_video"], (10, 12))


def test_multiple_video_tracks_and_audio():
    tracks = [
        TrackDecl("main_video", "video", Video),
        TrackDecl("depth", "video", Video),
        TrackDecl("voice", "audio", Audio),
    ]
    now, buf, clock = _make(tracks=tracks, default_size=(4, 6))
    p = clock.present()
    assert set(p.video) == {"main_video", "depth"}
    assert all(_is_black(f, (4, 6)) for f in p.video.values())
    assert p.audio == {}
    now.t = clock.next_slot
    chunk = np.arange(1600, dtype=np.int16)[None, :]
    item = FrameItem(video={"main_video": _frame(5), "depth": _frame(6, (3, 3))},
                     audio={"voice": chunk})
    buf.record_emit([item], None)
    buf.put_nowait([item])
    p = clock.present()
    assert np.array_equal(p.video["main_video"], _frame(5))
    assert np.array_equal(p.video["depth"], _frame(6, (3, 3)))
    assert p.audio["voice"] is chunk
    now.t = clock.next_slot
    p = clock.present()  # held: the video repeats, the audio does not
    assert np.array_equal(p.video["depth"], _frame(6, (3, 3)))
    assert p.audio == {}
    buf.flush()
    now.t = clock.next_slot
    p = clock.present()
    assert _is_black(p.video["main_video"], (6, 8))
    assert _is_black(p.video["depth"], (3, 3))


# ---- timestamps -----------------------------------------------------------------------


def test_pts_from_slots_90khz_and_audio_48khz():
    now, buf, clock = _make(fps=30)
    now.t = 1234.5  # an arbitrary monotonic epoch: pts start at 0 anyway
    frames = []
    for k in range(10):
        # The consumer wakes a little late, by varying amounts under a tick:
        # timestamps come from the slot, not the wakeup.
        frames.append(clock.present())
        now.t = clock.next_slot + (0.004 if k % 2 else 0.011)
    assert frames[0].pts == 0 and frames[0].audio_pts == 0
    start = frames[0].slot
    for k, p in enumerate(frames):
        assert p.slot == pytest.approx(start + k / 30)
        assert p.pts == round((p.slot - start) * VIDEO_CLOCK_RATE)
        assert p.audio_pts == round((p.slot - start) * AUDIO_CLOCK_RATE)
        assert p.pts == pytest.approx(3000 * k, abs=1)
        assert p.audio_pts == pytest.approx(1600 * k, abs=1)
    assert VIDEO_CLOCK_RATE == 90_000 and AUDIO_CLOCK_RATE == 48_000


def test_pts_monotonic_and_one_clock_through_rate_changes():
    result = simulate(Producer(block=12, period=0.5), fps=30, capacity=24, duration=6.0)
    pts = [p.pts for p in result.presented]
    apts = [p.audio_pts for p in result.presented]
    assert pts[0] == 0 and apts[0] == 0
    assert all(b > a for a, b in zip(pts, pts[1:]))
    assert all(b > a for a, b in zip(apts, apts[1:]))
    for p in result.presented:
        # Same instant on both clocks.
        assert p.audio_pts / AUDIO_CLOCK_RATE == pytest.approx(p.pts / VIDEO_CLOCK_RATE, abs=1e-4)


# ---- set_fps --------------------------------------------------------------------------


def test_first_tick_at_target_fps():
    now, buf, clock = _make(fps=30)
    p = clock.present()
    assert p.fps == 30
    assert clock.next_slot == pytest.approx(1 / 30)


def test_set_fps_takes_effect_on_next_tick_interval():
    now, buf, clock = _make(fps=30)
    clock.present()
    first_next = clock.next_slot
    assert first_next == pytest.approx(1 / 30)
    buf.set_fps(10)
    # The slot already scheduled stands; the interval after it uses the new rate.
    assert clock.next_slot == first_next
    now.t = first_next
    p = clock.present()
    assert p.fps == 10
    assert clock.fps == 10
    assert clock.next_slot == pytest.approx(first_next + 0.1)
    buf.set_fps(60)
    now.t = clock.next_slot
    slot = now.t
    clock.present()
    assert clock.next_slot == pytest.approx(slot + 1 / 60)


def test_set_fps_below_production_rate_caps_it():
    now, buf, clock = _make(fps=30, capacity=64)
    buf.rate.returned(0.0)
    for k in range(1, 5):
        now.t = 0.1 * k
        _emit(buf, [_frame(k)] * 5)  # 50 fps
    assert clock.effective_fps() == 30
    buf.set_fps(12)
    assert clock.effective_fps() == 12
    clock.present()
    assert clock.next_slot == pytest.approx(now.t + 1 / 12)


# ---- effective fps --------------------------------------------------------------------


def test_effective_fps_is_min_of_target_and_rate():
    now, buf, clock = _make(fps=30, capacity=64)
    assert clock.effective_fps() == 30  # nothing measured yet
    buf.rate.returned(0.0)
    for k in range(1, 5):
        now.t = 0.5 * k
        buf.record_emit([FrameItem(video={})] * 10, None)  # 20 fps, never queued
        buf.rate.returned(now.t)
    assert buf.supply.margin() is None
    assert clock.effective_fps() == pytest.approx(20.0)


def test_margin_correction_is_small_and_bounded():
    now, buf, clock = _make(fps=100, capacity=64)
    buf.rate.record(0.0, 20, 1.0)  # 20 fps
    # A little more cushion than the goal: tick faster, at most MAX_CORRECTION faster.
    buf.put_nowait([FrameItem(video={})] * 3)
    now.t = 100.0
    buf.put_nowait([FrameItem(video={})])
    assert buf.supply.margin() == pytest.approx(3.0)
    goal = clock.margin_goal()
    assert goal >= EmissionClock.MARGIN_GOAL
    expected = 1 + max(
        -EmissionClock.MAX_CORRECTION,
        min(EmissionClock.MAX_CORRECTION, (3.0 - goal) / (20 * 2.0)),
    )
    assert clock.effective_fps() == pytest.approx(20 * expected)
    assert clock.effective_fps() <= 20 * (1 + EmissionClock.MAX_CORRECTION) + 1e-9
    # Ran dry: tick slower, at most MAX_CORRECTION slower.
    buf.flush()
    buf.put_nowait([FrameItem(video={})])
    for _ in range(10):
        buf.take()
    now.t = 200.0
    buf.put_nowait([FrameItem(video={})])
    assert buf.supply.margin() < 0
    assert clock.effective_fps() == pytest.approx(20 * (1 - EmissionClock.MAX_CORRECTION))
    assert EmissionClock.MAX_CORRECTION <= 0.1


def test_far_too_much_cushion_is_worked_off_faster_but_bounded():
    now, buf, clock = _make(fps=100, capacity=64)
    buf.rate.record(0.0, 20, 1.0)  # 20 fps
    buf.put_nowait([FrameItem(video={})] * 40)
    now.t = 100.0
    buf.put_nowait([FrameItem(video={})])
    assert buf.supply.margin() == pytest.approx(40.0)
    # Latency from a stall: speed up by more than the normal nudge, never past the cap.
    assert clock.effective_fps() == pytest.approx(20 * (1 + EmissionClock.MAX_CATCH_UP))
    assert EmissionClock.MAX_CATCH_UP <= 0.25


def test_latency_is_worked_off_a_little_above_target_when_production_is_at_target():
    """A model producing at the target rate can only lose queued latency if the clock
    briefly ticks faster than the target: by at most MAX_CORRECTION."""
    now, buf, clock = _make(fps=30, capacity=64)
    buf.rate.record(0.0, 30, 1.0)  # exactly the target
    buf.put_nowait([FrameItem(video={})] * 20)
    now.t = 100.0
    buf.put_nowait([FrameItem(video={})])
    assert clock.effective_fps() == pytest.approx(30 * (1 + EmissionClock.MAX_CORRECTION))


def test_margin_correction_never_exceeds_target_for_a_faster_model():
    """A model clearly faster than the target is held to it by backpressure: the
    clock never ticks faster than the target for it, however much is queued."""
    now, buf, clock = _make(fps=30, capacity=64)
    buf.rate.record(0.0, 40, 1.0)
    assert 40 > 30 * (1 + EmissionClock.RATE_TOLERANCE)
    buf.put_nowait([FrameItem(video={})] * 20)
    now.t = 100.0
    buf.put_nowait([FrameItem(video={})])
    assert clock.effective_fps() == 30


# ---- simulations: pacing, latency, underruns -------------------------------------------


def test_block_producer_is_paced_evenly_at_its_rate():
    """12-frame blocks every 0.5 s (24 fps of production), target 30, capacity 24."""
    duration, warm = 30.0, 3.0
    result = simulate(Producer(block=12, period=0.5), fps=30, capacity=24, duration=duration)
    end = duration - 0.5
    rate = result.new_rate(warm, end)
    intervals = result.intervals(warm, end)
    latencies = result.latencies(warm, end)
    mean_interval = float(intervals.mean())

    assert rate == pytest.approx(24.0, rel=0.01)
    assert 1 / mean_interval == pytest.approx(24.0, rel=0.01)
    assert float(intervals.std()) < 0.5e-3
    assert result.held(warm, end) == 0  # no underrun after warm-up
    assert latencies.max() < (12 + 3) * mean_interval
    assert result.buffer.dropped == 0
    assert result.blocked_s == 0.0  # never backed up into the producer


def test_per_frame_producer_slower_than_target_converges_to_its_rate():
    duration, warm = 20.0, 3.0
    result = simulate(Producer(block=1, period=1 / 15), fps=30, capacity=4, duration=duration)
    end = duration - 0.5
    intervals = result.intervals(warm, end)
    assert result.new_rate(warm, end) == pytest.approx(15.0, rel=0.01)
    assert 1 / float(intervals.mean()) == pytest.approx(15.0, rel=0.01)
    assert float(intervals.std()) < 0.5e-3
    assert result.held(warm, end) == 0
    assert result.latencies(warm, end).max() < 3 / 15
    assert result.clock.fps == pytest.approx(15.0, rel=0.01)


def test_producer_faster_than_target_presented_at_exactly_target():
    duration, warm = 10.0, 2.0
    result = simulate(Producer(block=1, period=1 / 60), fps=30, capacity=4, duration=duration)
    frames = result.window(warm)
    intervals = result.intervals(warm)
    assert all(p.fps == 30 for p in frames)
    assert intervals == pytest.approx(np.full(len(intervals), 1 / 30), abs=1e-9)
    assert result.held(warm) == 0
    # The producer is throttled by backpressure, not by dropping frames.
    assert result.buffer.dropped == 0
    assert result.blocked_s > 0
    assert max(result.depths) <= 4
    # Latency stays bounded by the buffer.
    assert result.latencies(warm).max() <= (4 + 1) / 30 + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_jittered_block_producer_has_no_underruns(seed):
    duration, warm = 30.0, 3.0
    result = simulate(Producer(block=12, period=0.5, jitter=0.005, seed=seed),
                      fps=30, capacity=24, duration=duration)
    end = duration - 0.5
    intervals = result.intervals(warm, end)
    assert result.held(warm, end) == 0
    assert result.new_rate(warm, end) == pytest.approx(24.0, rel=0.02)
    assert float(intervals.std()) < 1e-3
    assert result.latencies(warm, end).max() < (12 + 3) * float(intervals.mean())


@pytest.mark.parametrize("seed", range(4))
def test_jittered_per_frame_producer_has_no_underruns(seed):
    duration, warm = 30.0, 3.0
    result = simulate(Producer(block=1, period=1 / 15, jitter=0.005, seed=seed),
                      fps=30, capacity=4, duration=duration)
    end = duration - 0.5
    assert result.held(warm, end) == 0
    assert result.new_rate(warm, end) == pytest.approx(15.0, rel=0.02)


def test_reported_compute_time_sets_the_pace():
    """A producer reporting compute_time is paced by it, not by inter-emit time."""
    # 12 frames every 0.5 s of wall time, but reporting 0.6 s of compute: 20 fps.
    result = simulate(
        Producer(block=12, period=0.5, report_compute_time=True, compute_time=0.6),
        fps=30, capacity=24, duration=10.0,
    )
    assert result.buffer.rate.rate() == pytest.approx(20.0)
    fps = [p.fps for p in result.window(3.0)]
    # Paced from the reported rate, corrected (within bounds) towards what really
    # arrives, so neither running dry nor piling up latency.
    assert min(fps) >= 20 * (1 - EmissionClock.MAX_CORRECTION) - 1e-9
    assert max(fps) <= 20 * (1 + EmissionClock.MAX_CATCH_UP) + 1e-9
    assert result.held(3.0) == 0


def test_compute_time_paces_from_the_first_block():
    """With compute_time the very first block is paced at the model's rate (24 fps),
    so it lasts until the second block: no hold once frames started. Without it the
    first block plays at the target (30 fps) and runs dry."""
    reported = simulate(Producer(block=12, period=0.5, report_compute_time=True, compute_time=0.5),
                        fps=30, capacity=24, duration=6.0)
    first_new = next(p.slot for p in reported.presented if p.is_new)
    assert first_new == pytest.approx(0.5, abs=1 / 30)
    assert reported.held(first_new) == 0
    after_first = [p.fps for p in reported.window(first_new)]
    assert max(after_first) < 26

    measured = simulate(Producer(block=12, period=0.5), fps=30, capacity=24, duration=6.0)
    first_new = next(p.slot for p in measured.presented if p.is_new)
    assert measured.held(first_new, 1.5) > 0


def test_pause_with_monitoring_disabled_keeps_the_rate():
    """An intentional pause with disable_monitoring: the estimate is frozen, the last
    frame held, and pacing resumes at the model's rate afterwards (the pause is not
    counted as slow generation)."""
    now, buf, clock = _make(fps=30, capacity=24, default_size=(4, 4))
    frames: list[PresentedFrame] = []
    rates_at_emit: list[tuple[float, float | None]] = []
    # 12-frame blocks every 0.5 s; after the block at 7.5 s the model pauses (with
    # monitoring disabled) for five seconds, then works 0.5 s on the next block.
    emits = [0.5 * k for k in range(1, 16)] + [13.0 + 0.5 * k for k in range(1, 14)]
    pause_at, resume_at = 7.6, 13.0

    def step_to(t: float) -> None:
        while clock.next_slot is None or clock.next_slot <= t:
            now.t = 0.0 if clock.next_slot is None else clock.next_slot
            frames.append(clock.present())
        now.t = t

    for t in emits:
        if pause_at is not None and t > pause_at:
            step_to(pause_at)
            buf.rate.set_monitoring(False, now.t)
            step_to(resume_at)
            buf.rate.set_monitoring(True, now.t)
            pause_at = None
        step_to(t)
        items = [FrameItem(video={"main_video": _frame(1, (4, 4))}) for _ in range(12)]
        buf.record_emit(items, None)
        assert buf.put_nowait(items) == 12
        buf.rate.returned(now.t)
        rates_at_emit.append((now.t, buf.rate.rate()))
    step_to(emits[-1] + 0.49)

    # Right after resuming, the estimate is still the model's rate, not frames over
    # (pause + work).
    for t, rate in rates_at_emit:
        if t > 1.0:
            assert rate == pytest.approx(24.0), t
    during = [p for p in frames if 8.0 <= p.slot < 13.0]
    assert min(p.fps for p in during) > 20.0
    assert all(np.array_equal(p.video["main_video"], _frame(1, (4, 4))) for p in during)
    resumed = [p for p in frames if 13.5 <= p.slot]
    assert min(p.fps for p in resumed) > 20.0
    settled = [p for p in frames if 16.0 <= p.slot < 19.0]
    assert sum(1 for p in settled if not p.is_new) == 0
    assert sum(1 for p in settled if p.is_new) / 3.0 == pytest.approx(24.0, rel=0.05)


# ---- a late consumer ------------------------------------------------------------------


def test_slightly_late_consumer_stays_on_the_grid():
    now, buf, clock = _make(fps=10)
    clock.present()
    for k in range(1, 6):
        now.t = clock.next_slot + 0.03  # under a tick late
        p = clock.present()
        assert p.slot == pytest.approx(0.1 * k)
        assert clock.next_slot == pytest.approx(0.1 * (k + 1))  # no drift


@pytest.mark.parametrize("ticks_late", [1.5, 2.5, 5.0])
def test_consumer_more_than_a_tick_behind_skips_ahead(ticks_late):
    now, buf, clock = _make(fps=10)
    _emit(buf, [_frame(v) for v in range(6)])
    clock.present()
    interval = 0.1
    now.t = clock.next_slot + ticks_late * interval
    late = clock.present()
    # No burst: the next slot is in the future, at most one interval away.
    assert clock.next_slot > now.t
    assert clock.next_slot <= now.t + interval + 1e-9
    # And from there, one frame per interval again.
    now.t = clock.next_slot
    following = clock.present()
    assert following.slot > late.slot
    assert following.pts > late.pts
    assert clock.next_slot == pytest.approx(following.slot + interval)


# ---- next_frame -----------------------------------------------------------------------


async def test_next_frame_presents_immediately_when_slot_is_due():
    now, buf, clock = _make(fps=30)
    first = await asyncio.wait_for(clock.next_frame(), 30)
    assert first.pts == 0
    now.t = clock.next_slot + 0.001  # due already
    second = await asyncio.wait_for(clock.next_frame(), 30)
    assert second.slot == pytest.approx(1 / 30)
    assert clock.presented == 2


async def test_next_frame_never_presents_early_beyond_the_wake_tolerance():
    # Timers wake up to 1 ms late; the clock asks WAKE_EARLY_S early to centre that.
    buf = OutputBuffer(4, 50)
    clock = EmissionClock(buf, VIDEO, default_size=(2, 2))
    for _ in range(10):
        p = await asyncio.wait_for(clock.next_frame(), 30)
        # A lower bound only: a loaded machine can wake the clock later, never earlier.
        assert time.monotonic() >= p.slot - EmissionClock.WAKE_EARLY_S
    assert clock.presented == 10


def _first_of_block_latencies(result: SimResult, start: float, end: float) -> np.ndarray:
    """Arrival -> presentation of each block's first frame (arrival: the emit time)."""
    firsts = {}
    for p in result.window(start, end):
        if p.is_new and p.emitted_at not in firsts:
            firsts[p.emitted_at] = p.slot - p.emitted_at
    return np.array(list(firsts.values()))


@pytest.mark.parametrize("fps", [24, 30])
def test_steady_block_producer_has_each_block_start_on_the_next_tick(fps):
    """12 frames every 0.5 s: in steady state each block's first frame goes out on the
    first tick after it lands, its frames spread evenly over the period, and the
    queue runs dry just as the next block arrives (no frame held, none left over)."""
    duration, warm = 30.0, 8.0
    result = simulate(Producer(block=12, period=0.5), fps=fps, capacity=24, duration=duration)
    end = duration - 0.5
    tick = 1 / 24
    firsts = _first_of_block_latencies(result, warm, end)
    assert len(firsts) >= 40
    assert firsts.max() < tick
    assert result.held(warm, end) == 0
    intervals = result.intervals(warm, end)
    assert 1 / float(intervals.mean()) == pytest.approx(24.0, rel=0.01)
    assert float(intervals.std()) < 0.5e-3
    # Every frame's latency is its place in the block plus under a tick: nothing
    # queued from the block before.
    assert result.latencies(warm, end).max() < 12 * tick


def test_a_rate_that_reads_high_still_settles_at_the_cushion():
    """compute_time that leaves out the model's overhead (0.49 s reported for every
    0.5 s block) reads the rate 2 % high; the clock paces by what arrives instead, so
    the blocks still start on the tick after they land and none runs dry (ticking
    at the rate read, a little fast, would run dry every few blocks)."""
    duration, warm = 40.0, 20.0
    result = simulate(
        Producer(block=12, period=0.5, report_compute_time=True, compute_time=0.49),
        fps=30, capacity=24, duration=duration,
    )
    end = duration - 0.5
    assert result.buffer.rate.rate() == pytest.approx(12 / 0.49)
    assert result.held(warm, end) == 0
    assert _first_of_block_latencies(result, warm, end).max() < 1 / 24
    assert result.new_rate(warm, end) == pytest.approx(24.0, rel=0.01)


@pytest.mark.parametrize("seed", range(3))
def test_cushion_grows_for_a_jittery_producer(seed):
    """The same blocks, each 20 ms (half a frame) late or early at random: the clock
    keeps a cushion of frames in hand, so no late block makes it hold a frame, and
    pays for it in latency that a steady producer does not."""
    duration, warm = 40.0, 8.0
    end = duration - 0.5
    steady = simulate(Producer(block=12, period=0.5), fps=24, capacity=24, duration=duration)
    jittery = simulate(Producer(block=12, period=0.5, jitter=0.02, seed=seed),
                       fps=24, capacity=24, duration=duration)
    assert jittery.held(warm, end) == 0
    assert jittery.clock.margin_goal() > steady.clock.margin_goal() + 1.0
    assert np.median(_first_of_block_latencies(jittery, warm, end)) > np.median(
        _first_of_block_latencies(steady, warm, end)
    ) + 1 / 24


def test_cushion_stays_bounded():
    now, buf, clock = _make(fps=30, capacity=24)
    # Nothing measured yet: the cautious cushion of a session's first seconds.
    assert clock.margin_goal() == EmissionClock.UNMEASURED_GOAL
    # Blocks of 12 arriving wildly off any pace.
    for k, t in enumerate((0.0, 0.5, 1.0, 2.5, 2.6, 4.0, 4.1, 6.0, 6.05, 8.0)):
        now.t = t
        while buf.depth():
            buf.take()
        buf.record_emit([FrameItem(video={})] * 12, None)
        buf.put_nowait([FrameItem(video={})] * 12)
    assert buf.supply.spread() > buf.capacity / 4 / EmissionClock.SPREAD_FACTOR
    assert clock.margin_goal() == EmissionClock.MARGIN_GOAL + buf.capacity / 4
