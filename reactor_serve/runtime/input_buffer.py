"""`InputBuffer`: frames from the client's input track, read by the model.

Latest-n semantics: reads return the most recent frames and discard the older
backlog, so a model always works on fresh input, and memory stays bounded however
fast the client sends. The transport pushes from the media loop; the model reads on
its own loop (`await read(n)`) or from any thread (`try_read(n)`).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import numpy as np

from reactor_serve.interface.models import BufferClosed
from reactor_serve.runtime.loop_waiters import LoopWaiters
from reactor_serve.runtime.pacing.frames import audio_chunk, video_batch

__all__ = ["InputBuffer"]

# The owner of a detached buffer: no session's frames match it.
_NOBODY = object()


class InputBuffer:
    """One input track's frames. Open when created; `close()` ends reads, `reset()` reopens."""

    DEFAULT_CAPACITY = 8

    def __init__(self, name: str, kind: str = "video", capacity: int = DEFAULT_CAPACITY) -> None:
        self.name = name
        self.kind = kind
        self._capacity = max(1, capacity)
        self._frames: collections.deque[np.ndarray] = collections.deque(maxlen=self._capacity)
        self._lock = threading.Lock()
        self._waiters = LoopWaiters()
        self._wanted = 1
        self._closed = False
        # The session whose frames are accepted (see `attach`); None: anyone's.
        self._owner: object | None = None
        self.received = 0
        self.discarded = 0
        # Called (on the reading loop) each time a read starts to wait for frames that
        # are not there: a rank of a model run on every rank reports that its step
        # waits for input (runtime/ranks/model_rank.py).
        self.on_wait: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, frame: Any, owner: object | None = None) -> None:
        """Add a frame from the client (any thread). Dropped while the buffer is closed,
        and when `owner` (the pushing session) is not the session attached now: a frame
        still in flight from an ended session must never reach the next one."""
        self.push_all([frame], owner)

    def push_all(self, frames: list[Any], owner: object | None = None) -> None:
        """Add `frames`, oldest first, as one arrival: a read waiting for frames wakes
        once they are all in, so it takes the latest of them whatever the threads do
        meanwhile (the ranks of a model run on every rank must read the same frame).
        Every frame is checked before any lands: a bad one refuses the whole batch."""
        arrays = [self._array(frame) for frame in frames]
        with self._lock:
            if self._closed or (owner is not None and owner is not self._owner):
                self.discarded += len(arrays)
                return
            for array in arrays:
                if len(self._frames) == self._frames.maxlen:
                    self.discarded += 1
                self._frames.append(array)
                self.received += 1
            if arrays and len(self._frames) >= self._wanted and self._waiters:
                self._waiters.wake_all()

    def _array(self, frame: Any) -> np.ndarray:
        if self.kind != "video":
            return audio_chunk(frame, self.name)
        array = video_batch(frame, self.name)
        if array.shape[0] != 1:
            raise ValueError(f"input track {self.name!r}: push one frame at a time")
        return array[0]

    def try_read(self, n: int = 1) -> list[np.ndarray] | None:
        """The latest `n` frames, oldest first, discarding older backlog; or None (and
        the buffer untouched) when fewer than `n` are there or the buffer is closed."""
        self._check_n(n)
        with self._lock:
            return self._take_locked(n)

    async def read(self, n: int = 1) -> list[np.ndarray]:
        """Wait until `n` frames are there and return the latest `n`.

        Raises BufferClosed if the buffer is closed before or while waiting.
        """
        self._check_n(n)
        while True:
            with self._lock:
                if self._closed:
                    raise BufferClosed(f"input track {self.name!r} is closed")
                frames = self._take_locked(n)
                if frames is not None:
                    return frames
                self._wanted = n
                waiter = self._waiters.add()
            if self.on_wait is not None:
                self.on_wait()
            try:
                await waiter
            finally:
                with self._lock:
                    self._waiters.discard(waiter)

    @property
    def starving(self) -> bool:
        """A read waits for more frames than the buffer holds."""
        with self._lock:
            return bool(self._waiters) and len(self._frames) < self._wanted

    def drain(self) -> list[np.ndarray]:
        """Every frame held, oldest first, leaving none (nothing is discarded: the
        caller passes them on)."""
        with self._lock:
            frames = list(self._frames)
            self._frames.clear()
            return frames

    def close(self) -> None:
        """End input: pending and future `read()` calls raise BufferClosed."""
        with self._lock:
            self._closed = True
            self._frames.clear()
            self._waiters.wake_all(BufferClosed(f"input track {self.name!r} is closed"))

    def reset(self) -> None:
        """Reopen for a new client, with no leftover frames."""
        with self._lock:
            self._closed = False
            self._frames.clear()

    def attach(self, owner: object) -> None:
        """The runtime's side of a new session, for every model kind: reopen with no
        leftover frames and accept frames from `owner` only. The model's own
        `reset()` / `close()` (the reference's buffer cleanup) keep working as before."""
        with self._lock:
            self._owner = owner
            self._closed = False
            self._frames.clear()

    def detach(self) -> None:
        """The session ended: drop its frames and any it still pushes. The buffer's
        open/closed state is the model's (the reference closes it in @disconnected)."""
        with self._lock:
            self._owner = _NOBODY
            self.discarded += len(self._frames)
            self._frames.clear()

    def __len__(self) -> int:
        return len(self._frames)

    def _take_locked(self, n: int) -> list[np.ndarray] | None:
        if self._closed or len(self._frames) < n:
            return None
        frames = list(self._frames)[-n:]
        self.discarded += len(self._frames) - n
        self._frames.clear()
        return frames

    def _check_n(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        with self._lock:
            if n > self._capacity:
                # Grow so a model asking for n frames can ever get them.
                self._capacity = n
                self._frames = collections.deque(self._frames, maxlen=n)
