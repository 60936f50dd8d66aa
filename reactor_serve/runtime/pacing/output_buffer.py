"""`OutputBuffer`: the one bridge for frames from the model's thread to the media loop.

A bounded, thread-safe queue of `FrameItem`s. Producers (the model loop's `emit`, or
the older API's `emit_block` on its own thread) wait for space or drop; the consumer
(`EmissionClock` on the media loop) takes one item per tick and never waits. The
buffer also owns what both sides need to agree on: the target fps, the measured
production rate, and the supply margin (how long, in frames, what was queued would
still have lasted when the next frames arrived), which the clock uses to keep latency
low without running dry.
"""

from __future__ import annotations

import collections
import math
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from reactor_serve.runtime.input_latency import FrameAnswer
from reactor_serve.runtime.loop_waiters import LoopWaiters
from reactor_serve.runtime.pacing.production_rate import ProductionRate

__all__ = ["FrameItem", "OutputBuffer", "OutputPort", "check_fps"]


@dataclass(slots=True)
class FrameItem:
    """One presentation slot's worth of output: a frame per video track and the audio
    that plays with it (48 kHz int16, per audio track)."""

    # numpy arrays; in a model process, before they cross to the media process, a
    # frame may still be a torch tensor on its device (see OutputSplitter).
    video: dict[str, Any]
    audio: dict[str, np.ndarray] = field(default_factory=dict)
    emitted_at: float = 0.0
    seq: int = 0
    # Commands this frame is the first answer to (see runtime/input_latency.py).
    answers: tuple[FrameAnswer, ...] = ()


class OutputPort(Protocol):
    """The producer's side of an output buffer, as the model host uses it: an
    `OutputBuffer` in this process, or a port forwarding to one in the media process."""

    def set_fps(self, fps: float) -> None: ...

    def flush(self) -> None: ...

    def drop_stale(self) -> None: ...

    def restart(self) -> None: ...

    def set_monitoring(self, enabled: bool) -> None: ...

    def record_emit(self, items: list[FrameItem], compute_time: float | None) -> None: ...

    async def put(self, items: list[FrameItem], drop: bool = False) -> None: ...

    def put_blocking(
        self,
        items: list[FrameItem],
        drop: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> bool: ...


def check_fps(fps: Any) -> float:
    """`fps` as a float; raises ValueError unless it is a positive finite number."""
    if (
        isinstance(fps, bool)
        or not isinstance(fps, numbers.Real)
        or not math.isfinite(fps)
        or fps <= 0
    ):
        raise ValueError(f"fps must be a positive number, got {fps!r}")
    return float(fps)


class OutputBuffer:
    """Bounded thread-safe frame queue with the state that paces it."""

    # How far back the supply margin looks (seconds), and the bounds it is kept in, so
    # one long intentional stall does not dominate the estimate for long afterwards.
    MARGIN_TIME_CONSTANT_S = 0.5
    MARGIN_FLOOR = -3.0
    # The spread is remembered longer than the margin: one late block is a warning
    # that the next may be late too.
    SPREAD_TIME_CONSTANT_S = 5.0
    # The producer's own pace, that each arrival's lateness is measured against: a
    # line through the arrivals of the last PACE_WINDOW_S, never fewer than
    # PACE_MIN_ARRIVALS (three gaps, so that one arrival off its schedule does not
    # set the pace) and never more than PACE_MAX_ARRIVALS (so a fast per-frame
    # producer costs little per put). How far a drifting producer can stray from
    # the line grows with the window, which so sets how much drift the cushion covers.
    PACE_WINDOW_S = 6.0
    PACE_MIN_ARRIVALS = 4
    PACE_MAX_ARRIVALS = 256
    # The first seconds of a session (or after a flush) are left out: the session's
    # own start (the connection, the first frames encoded) delays those arrivals
    # for reasons that do not recur, and would read as seconds of jitter.
    PACE_START_S = 2.0
    # Puts closer together than this many ticks are one arrival: a block emitted frame
    # by frame brings its own frames, and counting them as margin would make a steady
    # block producer look as if its supply swung by a block every period.
    SAME_ARRIVAL_TICKS = 0.5

    def __init__(
        self,
        capacity: int,
        fps: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer_size must be at least 1, got {capacity}")
        check_fps(fps)
        self.capacity = int(capacity)
        self.clock = clock
        self.rate = ProductionRate()
        self._target_fps = float(fps)
        self._items: collections.deque[FrameItem] = collections.deque()
        self._cond = threading.Condition()
        self._async_waiters = LoopWaiters()
        self._seq = 0
        self._flushes = 0
        # Counts discards (`discard_backlog`): like a flush for waiting producers, but
        # the clock keeps showing the last frame.
        self._discards = 0
        # Stale frames were dropped and nothing has arrived since (see drop_stale).
        self._stale_gap = False
        self.stale_dropped = 0
        self._underruns_since_put = 0
        self._margin: float | None = None
        self._margin_at: float | None = None
        self._last_put_at: float | None = None
        # (time, frames emitted before it) of recent arrivals: the producer's pace.
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque()
        self._pauses_seen = 0
        self._first_arrival_at = 0.0
        # Frames per second along that line: what the producer has been delivering.
        self._pace: float | None = None
        # The clock's next slot and tick interval, as it last scheduled them.
        self._next_tick: tuple[float, float] | None = None
        # How far arrivals come off the producer's own pace (frames): its timing
        # jitter, which the cushion has to cover.
        self._spread = 0.0
        self._spread_weight = 0.0
        self.dropped = 0
        self.emitted = 0
        self.taken = 0
        # Answers of frames removed unseen (flushed, dropped as stale, dropped when
        # full): the next frame taken answers those commands instead, so no command
        # goes unanswered because the frame that first showed it never did.
        self._carried: list[FrameAnswer] = []

    # ---- what models call -------------------------------------------------------

    def set_fps(self, fps: float) -> None:
        """Change the target frame rate; the emission clock uses it from its next tick."""
        self._target_fps = check_fps(fps)

    def flush(self) -> None:
        """Drop every queued frame; the client sees black until the next emit."""
        with self._cond:
            self._carry_locked(self._items)
            self._items.clear()
            self._flushes += 1
            self._underruns_since_put = 0
            self._margin = None
            self._spread = 0.0
            self._cond.notify_all()
            self._async_waiters.wake_all()

    def discard_backlog(self) -> None:
        """Drop every queued frame, and the rest of any emit waiting for space, without
        the black frame of `flush()`: the client keeps seeing the last frame until a
        fresh one comes. Used when a paused session resumes (the queue then holds
        frames made while nobody watched) and the production rate starts over."""
        with self._cond:
            self.dropped += len(self._items)
            self._carry_locked(self._items)
            self._items.clear()
            self._discards += 1
            self._underruns_since_put = 0
            self._margin = None
            self._spread = 0.0
            self._cond.notify_all()
            self._async_waiters.wake_all()
        self.rate.restart()

    def drop_stale(self) -> None:
        """Drop every queued frame, and the rest of any emit waiting for space: they
        were made before the model's state changed. The client keeps seeing the last
        frame until the first one made after the change arrives; the ticks that find
        the queue empty meanwhile are no stall of the producer's, and the production
        rate goes on."""
        with self._cond:
            self.stale_dropped += len(self._items)
            self._carry_locked(self._items)
            self._items.clear()
            self._discards += 1
            self._underruns_since_put = 0
            self._stale_gap = True
            self._cond.notify_all()
            self._async_waiters.wake_all()

    # ---- state the clock reads --------------------------------------------------

    @property
    def target_fps(self) -> float:
        return self._target_fps

    @property
    def flushes(self) -> int:
        """Counts flushes, so the clock knows to show black instead of the last frame."""
        return self._flushes

    def depth(self) -> int:
        return len(self._items)

    def margin_spread(self) -> float:
        """Smoothed spread of arrival times, in frames: how far each arrival came off
        the pace of the ones before it, early or late. The producer's timing jitter,
        which the cushion has to cover."""
        if self._spread_weight <= 0.0:
            return 0.0
        return self._spread / self._spread_weight

    @property
    def jitter_measured(self) -> bool:
        """Whether enough arrivals have come (past a session's start) for
        `margin_spread()` to say how much the producer's timing jitters."""
        return self._spread_weight > 0.0

    def margin(self) -> float | None:
        """Smoothed supply margin at each arrival, in frames: how long what was queued
        would still have lasted, counted in ticks from the arrival (a fraction of a
        tick for the time until the next one). Near 0, an arrival's first frame is
        presented at the next tick; negative, the queue had already run dry for that
        many ticks, each showing a frame again."""
        return self._margin

    def arrival_rate(self) -> float | None:
        """Frames per second the producer has been delivering, from a line through
        its recent arrivals (wall-clock time, so a rate from compute_time that
        leaves out some of the model's overhead can be checked against it); None
        until a few arrivals have come."""
        return self._pace

    def note_next_tick(self, slot: float, interval: float) -> None:
        """The clock's next slot and its interval, so arrivals are measured against
        the tick they will be presented at, not rounded to whole frames."""
        self._next_tick = (slot, interval)

    def restart(self) -> None:
        """Start a new session: empty queue, fresh rate measurement."""
        self.flush()
        with self._cond:
            self._carried.clear()  # the last session's commands, answered to nobody
        self.rate.restart()

    def set_monitoring(self, enabled: bool) -> None:
        """Pause or resume measuring the production rate (an intentional pause)."""
        self.rate.set_monitoring(enabled, self.clock())

    # ---- producer side ----------------------------------------------------------

    def record_emit(
        self,
        items: list[FrameItem],
        compute_time: float | None,
        at: float | None = None,
        frames: int | None = None,
    ) -> None:
        """Stamp one emit's items (time, sequence numbers) and count it for the rate.

        `at`: when the model emitted, if not now (it emitted in another process; the
        monotonic clock is the machine's, the same in both). `frames`: the emit's size
        when `items` is only its first part."""
        now = self.clock() if at is None else at
        self.rate.record(now, len(items) if frames is None else frames, compute_time)
        self.stamp(items, now)

    def stamp(self, items: list[FrameItem], at: float) -> None:
        """Give `items` their sequence numbers and emission time."""
        with self._cond:
            for item in items:
                self._seq += 1
                item.seq = self._seq
                item.emitted_at = at

    def put_nowait(self, items: list[FrameItem]) -> int:
        """Queue as many of `items` as fit; returns how many were taken."""
        with self._cond:
            return self._put_locked(items)

    async def put(self, items: list[FrameItem], drop: bool = False) -> None:
        """Queue `items` from an event loop: wait for space, or with `drop` discard
        what does not fit."""
        pending = items
        flushes = self._flushes, self._discards
        while True:
            with self._cond:
                pending = self._place_locked(pending, drop, flushes)
                if not pending:
                    break
                waiter = self._async_waiters.add()
            try:
                await waiter
            finally:
                with self._cond:
                    self._async_waiters.discard(waiter)
        self.rate.returned(self.clock())

    def put_blocking(
        self,
        items: list[FrameItem],
        drop: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Queue `items` from a plain thread. Returns False if `should_stop` became true
        while waiting (the rest are discarded)."""
        pending = items
        stopped = False
        flushes = self._flushes, self._discards
        with self._cond:
            while True:
                # Asked before placing too: a producer in another process may have
                # flushed after this emit was sent and before it got here.
                if should_stop():
                    stopped = True
                    self._carry_locked(pending)
                    break
                pending = self._place_locked(pending, drop, flushes)
                if not pending:
                    break
                # A timeout, because should_stop() is a plain flag nobody notifies on.
                self._cond.wait(timeout=0.05)
        self.rate.returned(self.clock())
        return not stopped

    def _place_locked(
        self, pending: list[FrameItem], drop: bool, flushes: tuple[int, int]
    ) -> list[FrameItem]:
        """Queue what fits; returns what is still waiting for space (none with `drop`).

        A flush while the emit waited discards the rest of it: the client was meant to
        see black, not the tail of a block from before the flush."""
        if flushes != (self._flushes, self._discards):
            self._carry_locked(pending)
            return []
        placed = self._put_locked(pending)
        rest = pending[placed:]
        if rest and drop:
            self.dropped += len(rest)
            self._carry_locked(rest)
            return []
        return rest

    def _carry_locked(self, removed: Iterable[FrameItem]) -> None:
        for item in removed:
            if item.answers:
                self._carried.extend(item.answers)

    def _put_locked(self, items: list[FrameItem]) -> int:
        room = self.capacity - len(self._items)
        if room <= 0 or not items:
            return 0
        self._note_arrival_locked()
        taken = items[:room]
        self._items.extend(taken)
        self.emitted += len(taken)
        return len(taken)

    def _note_arrival_locked(self) -> None:
        now = self.clock()
        tick = self._next_tick
        interval = tick[1] if tick is not None else 1.0 / self._target_fps
        previous, self._last_put_at = self._last_put_at, now
        underruns, self._underruns_since_put = self._underruns_since_put, 0
        self._stale_gap = False
        if (
            self._margin is not None
            and previous is not None
            and now - previous < self.SAME_ARRIVAL_TICKS * interval
        ):
            return
        if self._margin is None:
            # The first arrival of a session (or after a flush): nothing was due
            # before it, so the ticks that found the queue empty were no stall, and
            # the pace starts over.
            underruns = 0
            self._arrivals.clear()
            self._pace = None
            self._spread = self._spread_weight = 0.0
            self._first_arrival_at = now
        elif now - self._first_arrival_at >= self.PACE_START_S:
            self._note_lateness_locked(now)
        # Sampled once per arrival, with the time to the next tick: a steady block
        # producer then gives the same sample every block.
        until_tick = 0.0
        if tick is not None and interval > 0:
            until_tick = min(1.0, max(0.0, (tick[0] - now) / interval))
        depth = len(self._items)
        if underruns:
            # Each tick that found the queue empty showed a frame again: a whole
            # frame of stall, however soon after it the arrival came. (Counting
            # only the part of a tick it was late by would let a clock running a
            # little fast settle into a hold every few blocks, each one putting
            # the arrivals back ahead of the ticks.)
            sample = -float(underruns)
        else:
            sample = depth + until_tick
        sample = max(sample, self.MARGIN_FLOOR)
        if self._margin is None or self._margin_at is None:
            self._margin = sample
        else:
            elapsed = now - self._margin_at
            alpha = 1.0 - math.exp(-elapsed / self.MARGIN_TIME_CONSTANT_S)
            self._margin += alpha * (sample - self._margin)
        self._margin_at = now

    def _note_lateness_locked(self, now: float) -> None:
        """Updates the spread from how far this arrival is off the producer's own pace.

        Measured from arrival times and frame counts alone, not from the margin: the
        clock's own corrections move the margin, and must not read as jitter. The
        pace is a straight line fitted through the recent arrivals (frames so far
        against time): a line takes a constant error in any rate out, one arrival
        off its schedule moves it little, and a producer that drifts from it (each
        block timed from the last) strays further the longer it goes."""
        arrivals = self._arrivals
        pauses = self.rate.pauses
        if pauses != self._pauses_seen or not self.rate.monitoring:
            # An intended pause (monitoring disabled) is no lateness: measure the
            # pace afresh from here.
            self._pauses_seen = pauses
            arrivals.clear()
            self._pace = None
        if len(arrivals) >= self.PACE_MIN_ARRIVALS:
            # Least squares in one pass, times and counts taken from the first.
            t0, e0 = arrivals[0]
            n = len(arrivals)
            sum_t = sum_e = sum_tt = sum_te = 0.0
            for t, e in arrivals:
                t -= t0
                e -= e0
                sum_t += t
                sum_e += e
                sum_tt += t * t
                sum_te += t * e
            mean_t, mean_e = sum_t / n, sum_e / n
            pace = (sum_te - n * mean_t * mean_e) / (sum_tt - n * mean_t * mean_t)
            mean_t += t0
            mean_e += e0
            self._pace = pace if pace > 0 else None
            # Frames the pace would have brought by now, against those that came:
            # more, the arrival is late; fewer, early.
            expected = mean_e + pace * (now - mean_t)
            deviation = abs(expected - self.emitted)
            elapsed = now - arrivals[-1][0]
            beta = 1.0 - math.exp(-elapsed / self.SPREAD_TIME_CONSTANT_S)
            self._spread += beta * (deviation - self._spread)
            # How much of the average is measurement rather than its zero start:
            # dividing by it, the first seconds of a session see the jitter measured
            # so far at full weight instead of a fraction of it.
            self._spread_weight += beta * (1.0 - self._spread_weight)
        arrivals.append((now, self.emitted))
        while len(arrivals) > self.PACE_MAX_ARRIVALS or (
            len(arrivals) > self.PACE_MIN_ARRIVALS
            and now - arrivals[0][0] > self.PACE_WINDOW_S
        ):
            arrivals.popleft()

    # ---- consumer side ----------------------------------------------------------

    def take(self) -> FrameItem | None:
        """The next frame, or None when the queue is empty (never waits)."""
        with self._cond:
            if not self._items:
                if self.rate.monitoring and not self._stale_gap:
                    self._underruns_since_put += 1
                return None
            item = self._items.popleft()
            if self._carried:
                item.answers = (*self._carried, *item.answers)
                self._carried.clear()
            self.taken += 1
            self._cond.notify_all()
            self._async_waiters.wake_all()
            return item

    def drain(self) -> Iterable[FrameItem]:
        """Take everything queued now (tests and shutdown)."""
        while (item := self.take()) is not None:
            yield item
