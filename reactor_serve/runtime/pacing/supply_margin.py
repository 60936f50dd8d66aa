"""`SupplyMargin`: how far ahead of the emission clock the producer keeps the queue.

The clock wants a small cushion of queued frames: large enough that the producer's
timing jitter never runs the queue dry, small enough that frames wait little. This
estimator measures both sides of that trade from the arrivals alone: the margin (how
long, in ticks, what was queued would still have lasted when the next frames came),
the spread (how far each arrival came off the producer's own pace: the jitter the
cushion has to cover) and that pace (frames per second along a line through the
recent arrivals).

It holds no lock and reads no clock: the `OutputBuffer` calls it under its own lock
and passes the time in, so every number here follows from the calls made, and a
test drives it with made-up times.
"""

from __future__ import annotations

import collections
import math

__all__ = ["SupplyMargin"]


class SupplyMargin:
    """The supply margin, its spread and the producer's pace, from the arrivals."""

    # How far back the margin looks (seconds), and the bound it is kept above, so one
    # long intentional stall does not dominate the estimate for long afterwards.
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

    def __init__(self) -> None:
        self._margin: float | None = None
        self._margin_at: float | None = None
        self._last_arrival_at: float | None = None
        self._underruns = 0
        # Stale frames were dropped and nothing has arrived since (see stale_dropped).
        self._stale_gap = False
        # (time, frames delivered before it) of recent arrivals: the producer's pace.
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque()
        self._pauses_seen = 0
        self._first_arrival_at = 0.0
        # Frames per second along that line: what the producer has been delivering.
        self._pace: float | None = None
        # The clock's next slot and tick interval, as it last scheduled them.
        self._next_tick: tuple[float, float] | None = None
        # How far arrivals come off the producer's own pace (frames), and how much of
        # that average is measurement rather than its zero start.
        self._spread = 0.0
        self._spread_weight = 0.0

    # ---- what the clock reads ---------------------------------------------------

    def margin(self) -> float | None:
        """Smoothed supply margin at each arrival, in frames: how long what was queued
        would still have lasted, counted in ticks from the arrival (a fraction of a
        tick for the time until the next one). Near 0, an arrival's first frame is
        presented at the next tick; negative, the queue had already run dry for that
        many ticks, each showing a frame again. None before the first arrival."""
        return self._margin

    def spread(self) -> float:
        """Smoothed spread of arrival times, in frames: how far each arrival came off
        the pace of the ones before it, early or late. The producer's timing jitter,
        which the cushion has to cover."""
        if self._spread_weight <= 0.0:
            return 0.0
        return self._spread / self._spread_weight

    @property
    def jitter_measured(self) -> bool:
        """Whether enough arrivals have come (past a session's start) for `spread()`
        to say how much the producer's timing jitters."""
        return self._spread_weight > 0.0

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

    # ---- what the queue reports -------------------------------------------------

    def ran_dry(self, monitoring: bool) -> None:
        """A tick found the queue empty. It counts as a stall unless the production
        rate is not being measured (an intended pause) or stale frames were dropped
        and their replacements are still being made."""
        if monitoring and not self._stale_gap:
            self._underruns += 1

    def stale_dropped(self) -> None:
        """The queued frames were dropped as stale: the ticks until the next arrival
        are the model catching up with a change, not a stall."""
        self._underruns = 0
        self._stale_gap = True

    def reset(self) -> None:
        """The queue was emptied on purpose (a flush, a discarded backlog): the next
        arrival starts the measurement over, and the ticks until it are no stall."""
        self._underruns = 0
        self._margin = None
        self._spread = self._spread_weight = 0.0

    def arrived(
        self,
        now: float,
        *,
        queued: int,
        delivered: int,
        fps: float,
        pauses: int,
        monitoring: bool,
    ) -> None:
        """Frames arrived at `now`, with `queued` frames still waiting and `delivered`
        frames queued before them in all. `fps` is the target rate (the tick interval
        until the clock has noted one); `pauses` and `monitoring` are the production
        rate's, so an intended pause is no lateness."""
        tick = self._next_tick
        interval = tick[1] if tick is not None else 1.0 / fps
        previous, self._last_arrival_at = self._last_arrival_at, now
        underruns, self._underruns = self._underruns, 0
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
            self._note_lateness(now, delivered, pauses, monitoring)
        # Sampled once per arrival, with the time to the next tick: a steady block
        # producer then gives the same sample every block.
        until_tick = 0.0
        if tick is not None and interval > 0:
            until_tick = min(1.0, max(0.0, (tick[0] - now) / interval))
        if underruns:
            # Each tick that found the queue empty showed a frame again: a whole
            # frame of stall, however soon after it the arrival came. (Counting
            # only the part of a tick it was late by would let a clock running a
            # little fast settle into a hold every few blocks, each one putting
            # the arrivals back ahead of the ticks.)
            sample = -float(underruns)
        else:
            sample = queued + until_tick
        sample = max(sample, self.MARGIN_FLOOR)
        if self._margin is None or self._margin_at is None:
            self._margin = sample
        else:
            elapsed = now - self._margin_at
            alpha = 1.0 - math.exp(-elapsed / self.MARGIN_TIME_CONSTANT_S)
            self._margin += alpha * (sample - self._margin)
        self._margin_at = now

    def _note_lateness(self, now: float, delivered: int, pauses: int, monitoring: bool) -> None:
        """Updates the spread from how far this arrival is off the producer's own pace.

        Measured from arrival times and frame counts alone, not from the margin: the
        clock's own corrections move the margin, and must not read as jitter. The
        pace is a straight line fitted through the recent arrivals (frames so far
        against time): a line takes a constant error in any rate out, one arrival
        off its schedule moves it little, and a producer that drifts from it (each
        block timed from the last) strays further the longer it goes."""
        arrivals = self._arrivals
        if pauses != self._pauses_seen or not monitoring:
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
            deviation = abs(expected - delivered)
            elapsed = now - arrivals[-1][0]
            beta = 1.0 - math.exp(-elapsed / self.SPREAD_TIME_CONSTANT_S)
            self._spread += beta * (deviation - self._spread)
            # Dividing by this weight, the first seconds of a session see the jitter
            # measured so far at full weight instead of a fraction of it.
            self._spread_weight += beta * (1.0 - self._spread_weight)
        arrivals.append((now, delivered))
        while len(arrivals) > self.PACE_MAX_ARRIVALS or (
            len(arrivals) > self.PACE_MIN_ARRIVALS
            and now - arrivals[0][0] > self.PACE_WINDOW_S
        ):
            arrivals.popleft()
