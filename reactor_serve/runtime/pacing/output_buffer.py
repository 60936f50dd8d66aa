"""`OutputBuffer`: the one bridge for frames from the model's thread to the media loop.

A bounded, thread-safe queue of `FrameItem`s. Producers (the model loop's `emit`, or
the older API's `emit_block` on its own thread) wait for space or drop; the consumer
(`EmissionClock` on the media loop) takes one item per tick and never waits. The
buffer also owns what both sides need to agree on: the target fps, the measured
production rate, and the supply margin (`SupplyMargin`, fed here under the buffer's
lock), which the clock uses to keep latency low without running dry.
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
from reactor_serve.runtime.pacing.supply_margin import SupplyMargin

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
    # Per video track, the bytes the model attached to this frame (TrackPayload).
    metadata: dict[str, bytes] = field(default_factory=dict)


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
        # Fed under the lock; the clock reads it without, one value written whole at a time.
        self.supply = SupplyMargin()
        self._target_fps = float(fps)
        self._items: collections.deque[FrameItem] = collections.deque()
        self._cond = threading.Condition()
        self._async_waiters = LoopWaiters()
        self._seq = 0
        self._flushes = 0
        # Counts discards (`discard_backlog`): like a flush for waiting producers, but
        # the clock keeps showing the last frame.
        self._discards = 0
        self.stale_dropped = 0
        self.dropped = 0
        # The model's own time for its last emit (a batched step's, for every session
        # in the batch), in ms; None until an emit reports one.
        self.step_ms: float | None = None
        self.emitted = 0
        self.taken = 0
        # Answers of frames removed unseen (flushed, dropped as stale, dropped when
        # full): the next frame taken answers those commands instead, so no command
        # goes unanswered because the frame that first showed it never did.
        self._carried: list[FrameAnswer] = []
        # The size of the last frame taken per video track, kept across sessions and
        # model restarts: a new session's black frames before its first one then
        # match the picture the model makes, so the client's video never jumps size.
        self._last_sizes: dict[str, tuple[int, int]] = {}

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
            self.supply.reset()
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
            self.supply.reset()
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
            self.supply.stale_dropped()
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
        if compute_time is not None:
            self.step_ms = compute_time * 1000.0
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
        self.supply.arrived(
            self.clock(),
            queued=len(self._items),
            delivered=self.emitted,
            fps=self._target_fps,
            pauses=self.rate.pauses,
            monitoring=self.rate.monitoring,
        )
        taken = items[:room]
        self._items.extend(taken)
        self.emitted += len(taken)
        return len(taken)

    # ---- consumer side ----------------------------------------------------------

    def take(self) -> FrameItem | None:
        """The next frame, or None when the queue is empty (never waits)."""
        with self._cond:
            if not self._items:
                self.supply.ran_dry(self.rate.monitoring)
                return None
            item = self._items.popleft()
            if self._carried:
                item.answers = (*self._carried, *item.answers)
                self._carried.clear()
            self.taken += 1
            for name, frame in item.video.items():
                self._last_sizes[name] = (int(frame.shape[0]), int(frame.shape[1]))
            self._cond.notify_all()
            self._async_waiters.wake_all()
            return item

    def last_size(self, track: str) -> tuple[int, int] | None:
        """(height, width) of the last frame taken on video `track`, if any was."""
        return self._last_sizes.get(track)

    def drain(self) -> Iterable[FrameItem]:
        """Take everything queued now (tests and shutdown)."""
        while (item := self.take()) is not None:
            yield item
