"""How fast the model produces frames, measured from its emits.

Each emit contributes a sample of (frames, seconds of the model's own time): the
`compute_time` it reported, or else the time since its previous emit returned (so
time spent waiting for buffer space never counts as slowness). The rate is the sum
of frames over the sum of seconds across a short window: about two seconds, and never
fewer than the last few samples, so block producers are measured over whole blocks.
A session's first sample stands alone only until the second comes: the first forward
pass is often slow for reasons that do not recur (warm-up, the session's own start on
the same machine), and a rate read low there would pace the next seconds too slowly.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["ProductionRate"]


class ProductionRate:
    """Thread-safe frames-per-second estimate of the model's generation speed."""

    def __init__(self, window_s: float = 2.0, min_samples: int = 3) -> None:
        self.window_s = window_s
        self.min_samples = min_samples
        self._lock = threading.Lock()
        self._samples: collections.deque[tuple[float, int, float]] = collections.deque()
        # Running sums over the window, so rate() is O(1) on every emission tick.
        self._frames = 0
        self._seconds = 0.0
        self._last_return: float | None = None
        self._monitoring = True
        self._frozen: float | None = None
        self._first_kept = False
        self._pauses = 0

    def restart(self) -> None:
        """Forget history (a new session). The first emit after this only marks where
        the model's own time starts: how long it worked on it is unknown."""
        with self._lock:
            self._samples.clear()
            self._frames, self._seconds = 0, 0.0
            self._last_return = None
            self._monitoring = True
            self._frozen = None
            self._first_kept = False

    def record(self, now: float, frames: int, compute_time: float | None) -> None:
        """An emit of `frames` began at `now`."""
        with self._lock:
            if not self._monitoring:
                return
            if compute_time is not None and compute_time > 0:
                seconds = compute_time
            elif self._last_return is not None:
                seconds = now - self._last_return
            else:
                return
            if seconds <= 0:
                return
            if self._first_kept:
                self._first_kept = False
                _, first_frames, first_seconds = self._samples.popleft()
                self._frames -= first_frames
                self._seconds -= first_seconds
            elif not self._samples:
                self._first_kept = True
            self._samples.append((now, frames, seconds))
            self._frames += frames
            self._seconds += seconds
            while (
                len(self._samples) > self.min_samples
                and now - self._samples[0][0] > self.window_s
            ):
                _, old_frames, old_seconds = self._samples.popleft()
                self._frames -= old_frames
                self._seconds -= old_seconds

    def returned(self, now: float) -> None:
        """The emit returned to the model at `now`: its own time starts again here."""
        with self._lock:
            self._last_return = now

    def set_monitoring(self, enabled: bool, now: float) -> None:
        """Pause or resume measuring; a pause freezes the current estimate."""
        with self._lock:
            if enabled and not self._monitoring:
                # The pause itself is not generation time.
                self._last_return = now
                self._frozen = None
            elif not enabled and self._monitoring:
                self._frozen = self._rate_locked()
                self._pauses += 1
            self._monitoring = enabled

    @property
    def monitoring(self) -> bool:
        return self._monitoring

    @property
    def pauses(self) -> int:
        """How many times monitoring was disabled: a gap in production that spans one
        was intended, and says nothing of the model's timing."""
        return self._pauses

    def rate(self) -> float | None:
        """Frames per second, or None before there is anything to go on."""
        with self._lock:
            if not self._monitoring:
                return self._frozen
            return self._rate_locked()

    def _rate_locked(self) -> float | None:
        if not self._samples or self._seconds <= 0:
            return None
        return self._frames / self._seconds
