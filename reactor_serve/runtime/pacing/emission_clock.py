"""`EmissionClock`: presents one frame per tick, evenly spaced, on the media loop.

The tick rate is `fps_eff = min(target fps, measured production rate)` (that rate
capped by what the arrivals deliver, where one from compute_time reads high), nudged
by the supply margin (how long the queue would still have lasted when the next
frames arrived): more than the cushion aimed for is latency, so tick slightly
faster; less, or a queue that ran dry, tick slightly slower. The cushion is a
fraction of a tick plus a multiple of how much the producer's arrival times jitter,
so a steady block producer has each block's first frame presented on the tick after
it arrives and the queue running dry just as the next block lands, while a producer
whose timing jitters keeps frames in hand. The nudge is small and bounded, so
intervals stay even; an integral trim removes the offset a biased rate estimate
would leave. An empty queue holds the last frame; before the first frame and after a
flush the client sees black. Timestamps come from the slots, not from when the
consumer happened to ask: 90 kHz for video, 48 kHz for audio, one clock for both.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.runtime.input_latency import FrameAnswer
from reactor_serve.runtime.pacing.frames import black_frame
from reactor_serve.runtime.pacing.output_buffer import OutputBuffer

__all__ = ["EmissionClock", "PresentedFrame", "VIDEO_CLOCK_RATE", "AUDIO_CLOCK_RATE"]

VIDEO_CLOCK_RATE = 90_000
AUDIO_CLOCK_RATE = 48_000


@dataclass(slots=True)
class PresentedFrame:
    """What the client is shown at one slot."""

    video: dict[str, np.ndarray]
    audio: dict[str, np.ndarray]
    pts: int
    audio_pts: int
    slot: float
    is_new: bool
    emitted_at: float | None
    seq: int | None
    fps: float
    # Commands whose first answer this slot's new frame is (runtime/input_latency.py).
    answers: tuple[FrameAnswer, ...] = ()
    # What the model attached to this slot's new frame, per video track: a repeated
    # frame carries none (its metadata went out with it once).
    metadata: dict[str, bytes] = field(default_factory=dict)


class EmissionClock:
    """Paces an `OutputBuffer` to one client. Not thread-safe: one consumer."""

    # The supply margin aimed for at each arrival, in ticks: a fraction of one (the
    # arrival's first frame goes out that long after it lands, so timer noise does
    # not make it miss its tick), plus SPREAD_FACTOR times the spread of arrival
    # times (producer jitter, about 0.8 of its standard deviation), so a late block
    # finds frames still queued instead of an empty buffer.
    MARGIN_GOAL = 0.3
    SPREAD_FACTOR = 5.0
    # Until the buffer has measured that jitter (a few seconds into a session), a
    # whole frame: a session's first seconds must not be the ones that stall.
    UNMEASURED_GOAL = 1.0
    # Seconds over which excess (or missing) cushion is worked off; and the largest
    # relative speed-up or slow-down that correction may apply.
    CORRECTION_HORIZON_S = 2.0
    MAX_CORRECTION = 0.08
    MAX_CATCH_UP = 0.25
    # A session starts with its supply at a random phase to the ticks and a rate
    # measured from few, often slow, first blocks; the horizon starts at half of
    # the above and grows to it over this many seconds from the first frame, so that
    # start settles within a few blocks while later noise is still followed gently.
    SETTLE_S = 4.0
    # A production rate measured from compute_time leaves out the model's overhead
    # around it, so it reads a little high (the arrivals' own rate caps it, but
    # only once a few have come), and proportional correction alone would then
    # settle off the cushion. A trim integrates the remaining error over this many
    # seconds (critically damped with the horizon above), within TRIM_LIMIT.
    TRIM_TIME_S = 8.0
    TRIM_LIMIT = 0.04
    # Latency can only be worked off by presenting faster than frames come. When the
    # model produces at about the target rate, that means briefly ticking faster than
    # the target, by at most MAX_CORRECTION; a model faster than the target by more
    # than this is held to it by backpressure instead, so the clock never outruns it.
    RATE_TOLERANCE = 0.03
    MIN_FPS = 1.0
    # The event loop's timers round their wait up to whole milliseconds (epoll), so a
    # wake lands 0 to 1 ms after the time asked for. Asking half a millisecond early
    # centres it on the slot. (Pts come from the slot itself, so this jitter never
    # reaches the video's timeline; a finer timer per frame costs more CPU than it buys.)
    WAKE_EARLY_S = 0.0005

    def __init__(
        self,
        buffer: OutputBuffer,
        tracks: Sequence[TrackDecl],
        clock: Callable[[], float] = time.monotonic,
        default_size: tuple[int, int] = (480, 640),
    ) -> None:
        self.buffer = buffer
        self.clock = clock
        self.video_tracks = [t.name for t in tracks if t.kind == "video"]
        self.audio_tracks = [t.name for t in tracks if t.kind == "audio"]
        self._default_size = default_size
        self._last: dict[str, np.ndarray] = {}
        self._flushes_seen = buffer.flushes
        self._start: float | None = None
        self._next_slot: float | None = None
        self._fps = buffer.target_fps
        self.presented = 0
        self.new_frames = 0
        self._trim = 0.0
        self._first_frame_at: float | None = None
        # Smoothed distance of each presentation from its slot: the pacing jitter.
        self.jitter_ms = 0.0

    @property
    def fps(self) -> float:
        """The effective rate of the most recent tick."""
        return self._fps

    @property
    def next_slot(self) -> float | None:
        return self._next_slot

    def margin_goal(self) -> float:
        """The cushion aimed for, in frames: never more than a quarter of the buffer."""
        if not self.buffer.supply.jitter_measured:
            return min(self.UNMEASURED_GOAL, self.MARGIN_GOAL + self.buffer.capacity / 4)
        jitter = self.SPREAD_FACTOR * self.buffer.supply.spread()
        return self.MARGIN_GOAL + min(jitter, self.buffer.capacity / 4)

    def effective_fps(self) -> float:
        """The rate for the next interval, from the target, the measured production
        rate and the supply margin."""
        return self._pace()[0]

    def _pace(self) -> tuple[float, float | None]:
        """(the rate for the next interval, the margin error to integrate into the trim
        or None where the trim must hold: nothing measured, or the rate at a bound)."""
        target = self.buffer.target_fps
        rate = self.buffer.rate.rate()
        if rate is None:
            return target, None
        if rate > target * (1.0 + self.RATE_TOLERANCE):
            base, ceiling = rate, target
        else:
            # Frames cannot be presented faster than they come: where the rate from
            # the model's own time reads above what its arrivals deliver, pace by
            # the arrivals. (Not for a model faster than the target, above: held back
            # by backpressure, its arrivals only echo the clock.)
            delivered = self.buffer.supply.arrival_rate()
            if delivered is not None:
                rate = min(rate, delivered)
            base, ceiling = min(rate, target), target * (1.0 + self.MAX_CORRECTION)
        margin = self.buffer.supply.margin()
        if margin is None:
            return max(self.MIN_FPS, min(ceiling, base)), None
        excess = margin - self.margin_goal()
        # The trim integrates the error at the settled gain, so the quicker start
        # does not wind it up.
        error = excess / (base * self.CORRECTION_HORIZON_S)
        proportional = excess / (base * self._horizon())
        # Far more queued than the cushion (after an undeclared stall, say) is
        # worked off faster, so latency does not linger for many seconds.
        speed_up_limit = min(
            self.MAX_CATCH_UP, self.MAX_CORRECTION + 0.02 * max(0.0, excess - 2.0)
        )
        wanted = base * (1.0 + proportional + self._trim)
        correction = max(-self.MAX_CORRECTION, min(speed_up_limit, proportional + self._trim))
        fps = max(self.MIN_FPS, min(ceiling, base * (1.0 + correction)))
        # No trim while the rate is pinned at a bound in the direction the error
        # pushes: an error it cannot act on (a model held back by backpressure, say)
        # would only wind it up.
        if wanted != fps and (excess > 0) == (wanted > fps):
            return fps, None
        return fps, error

    def _horizon(self) -> float:
        if self._first_frame_at is None or self.SETTLE_S <= 0:
            return self.CORRECTION_HORIZON_S
        settled = (self.clock() - self._first_frame_at) / self.SETTLE_S
        return self.CORRECTION_HORIZON_S * min(1.0, max(0.5, settled))

    async def next_frame(self) -> PresentedFrame:
        """Wait for the next slot and present it."""
        if self._next_slot is not None:
            delay = self._next_slot - self.clock() - self.WAKE_EARLY_S
            if delay > 0:
                await asyncio.sleep(delay)
        return self.present()

    def present(self) -> PresentedFrame:
        """Present the slot that is due now and schedule the next one."""
        now = self.clock()
        if self._next_slot is None:
            self._start = self._next_slot = now
        slot = self._next_slot
        assert self._start is not None
        interval_fps, error = self._pace()
        if error is not None:
            self._trim += error * (1.0 / interval_fps) / self.TRIM_TIME_S
            self._trim = max(-self.TRIM_LIMIT, min(self.TRIM_LIMIT, self._trim))
        self._fps = interval_fps
        interval = 1.0 / interval_fps
        following = slot + interval
        if following <= now:
            # The consumer fell more than a tick behind: skip ahead rather than burst.
            following = now + interval
        self._next_slot = following
        self.buffer.supply.note_next_tick(following, interval)

        if self.buffer.flushes != self._flushes_seen:
            self._flushes_seen = self.buffer.flushes
            self._last = {
                name: black_frame(*frame.shape[:2]) for name, frame in self._last.items()
            }
        item = self.buffer.take()
        video: dict[str, np.ndarray] = {}
        audio: dict[str, np.ndarray] = {}
        if item is not None:
            self._last.update(item.video)
            audio = item.audio
            self.new_frames += 1
            if self._first_frame_at is None:
                self._first_frame_at = now
        for name in self.video_tracks:
            frame = self._last.get(name)
            if frame is None:
                frame = black_frame(*(self.buffer.last_size(name) or self._default_size))
            video[name] = frame
        elapsed = slot - self._start
        self.jitter_ms += 0.05 * (abs(now - slot) * 1000.0 - self.jitter_ms)
        self.presented += 1
        return PresentedFrame(
            video=video,
            audio=audio,
            pts=round(elapsed * VIDEO_CLOCK_RATE),
            audio_pts=round(elapsed * AUDIO_CLOCK_RATE),
            slot=slot,
            is_new=item is not None,
            emitted_at=item.emitted_at if item is not None else None,
            seq=item.seq if item is not None else None,
            fps=interval_fps,
            answers=item.answers if item is not None else (),
            metadata=item.metadata if item is not None else {},
        )
