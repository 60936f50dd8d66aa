"""The encode worker: the one thread a session's recording work runs on, fed by the media loop.

Encoding never runs on the media loop. The loop offers each presented slot, and when the
worker has `queue_frames` slots waiting already, the slot is dropped rather than stalling
the loop or growing memory: counted here, and passed on in order as a drop (so it is
counted against the recording it would have been in). Everything else the loop asks
(start, stop, a clip, a settled command) goes through the same queue, so the worker
sees it in the order the loop asked it, among the frames.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, TypeVar

__all__ = ["EncodeWorker"]

Frame = TypeVar("Frame")

_FRAME = "frame"
_DROPPED = "dropped"
_LAST = "close"


class EncodeWorker(Generic[Frame]):
    """A thread that runs `on_frame` for each offered frame and the submitted tasks, in
    order. A task or frame that raises goes to `on_failure(kind, exc)` (called inside
    the handler of the exception) and the worker goes on."""

    def __init__(
        self,
        *,
        queue_frames: int,
        on_frame: Callable[[Frame], None],
        on_dropped: Callable[[], None],
        on_failure: Callable[[str, Exception], None],
        name: str = "reactor-recording",
    ) -> None:
        self.queue_frames = queue_frames
        self.dropped_frames = 0
        self._on_frame = on_frame
        self._on_dropped = on_dropped
        self._on_failure = on_failure
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._queued_frames = 0
        self._queued_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    @property
    def queued_frames(self) -> int:
        """Frames offered and not yet taken by the worker."""
        with self._queued_lock:
            return self._queued_frames

    def start(self) -> None:
        self._thread.start()

    def offer(self, frame: Frame) -> bool:
        """Queue `frame` for `on_frame`; False when the worker is `queue_frames`
        behind and the frame was dropped instead."""
        with self._queued_lock:
            if self._queued_frames >= self.queue_frames:
                self.dropped_frames += 1
                drop = True
            else:
                self._queued_frames += 1
                drop = False
        if drop:
            self._queue.put((_DROPPED, None))
            return False
        self._queue.put((_FRAME, frame))
        return True

    def submit(self, kind: str, task: Callable[[], None]) -> None:
        """Run `task` on the worker after what is queued; `kind` names it to `on_failure`."""
        self._queue.put((kind, task))

    def finish(self, task: Callable[[], None]) -> None:
        """Run `task` after what is queued, then end the thread."""
        self._queue.put((_LAST, task))

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _work(self) -> None:
        while True:
            kind, item = self._queue.get()
            try:
                if kind == _FRAME:
                    with self._queued_lock:
                        self._queued_frames -= 1
                    self._on_frame(item)
                elif kind == _DROPPED:
                    self._on_dropped()
                else:
                    item()
            except Exception as exc:
                self._on_failure(kind, exc)
            if kind == _LAST:
                return
