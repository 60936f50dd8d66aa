"""`OutputBuffer`: the one bridge for frames from the model's thread to the media loop.

A bounded, thread-safe queue of `FrameItem`s. Producers (the model loop's `emit`, or
the older API's `emit_block` on its own thread) wait for space or drop; the consumer
(`EmissionClock` on the media loop) takes one item per tick and never waits. The
buffer also owns what both sides need to agree on: the target fps, the measured
production rate, and the supply margin (how many frames were still queued when the
next ones arrived), which the clock uses to keep latency low without running dry.
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

from reactor_serve.runtime._waiters import LoopWaiters
from reactor_serve.runtime.production_rate import ProductionRate

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


class OutputPort(Protocol):
    """The producer's side of an output buffer, as the model host uses it: an
    `OutputBuffer` in this process, or a port forwarding to one in the media process."""

    def set_fps(self, fps: float) -> None: ...

    def flush(self) -> None: ...

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
        self._underruns_since_put = 0
        self._margin: float | None = None
        self._margin_at: float | None = None
        # How much the margin varies from one arrival to the next (frames): the
        # producer's timing jitter, which the cushion has to cover.
        self._spread = 0.0
        self.dropped = 0
        self.emitted = 0
        self.taken = 0

    # ---- what models call -------------------------------------------------------

    def set_fps(self, fps: float) -> None:
        """Change the target frame rate; the emission clock uses it from its next tick."""
        self._target_fps = check_fps(fps)

    def flush(self) -> None:
        """Drop every queued frame; the client sees black until the next emit."""
        with self._cond:
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
            self._items.clear()
            self._discards += 1
            self._underruns_since_put = 0
            self._margin = None
            self._spread = 0.0
            self._cond.notify_all()
            self._async_waiters.wake_all()
        self.rate.restart()

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
        """Smoothed |arrival margin - its average|, in frames."""
        return self._spread

    def margin(self) -> float | None:
        """Smoothed frames still queued when new frames arrived (negative: ran dry)."""
        return self._margin

    def restart(self) -> None:
        """Start a new session: empty queue, fresh rate measurement."""
        self.flush()
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
            return []
        placed = self._put_locked(pending)
        rest = pending[placed:]
        if rest and drop:
            self.dropped += len(rest)
            return []
        return rest

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
        depth = len(self._items)
        sample = float(depth) if depth > 0 else -float(self._underruns_since_put)
        sample = max(sample, self.MARGIN_FLOOR)
        self._underruns_since_put = 0
        now = self.clock()
        if self._margin is None or self._margin_at is None:
            self._margin = sample
        else:
            elapsed = now - self._margin_at
            alpha = 1.0 - math.exp(-elapsed / self.MARGIN_TIME_CONSTANT_S)
            beta = 1.0 - math.exp(-elapsed / self.SPREAD_TIME_CONSTANT_S)
            self._spread += beta * (abs(sample - self._margin) - self._spread)
            self._margin += alpha * (sample - self._margin)
        self._margin_at = now

    # ---- consumer side ----------------------------------------------------------

    def take(self) -> FrameItem | None:
        """The next frame, or None when the queue is empty (never waits)."""
        with self._cond:
            if not self._items:
                if self.rate.monitoring:
                    self._underruns_since_put += 1
                return None
            item = self._items.popleft()
            self.taken += 1
            self._cond.notify_all()
            self._async_waiters.wake_all()
            return item

    def drain(self) -> Iterable[FrameItem]:
        """Take everything queued now (tests and shutdown)."""
        while (item := self.take()) is not None:
            yield item
