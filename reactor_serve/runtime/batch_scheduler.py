"""`BatchScheduler`: the seats' next steps gathered into one call of a `@batched` model.

Each seat's driver (runtime/kinds/batched.py) submits its session's next step when its
output buffer has room for the frame, and waits for the result. Sessions paced at the
model's rate each ask once per frame interval, but not at the same moment, so the
scheduler's thread runs one batch per interval: it starts a batch once every
streaming seat has asked, or one interval after the last batch began, whichever comes
first, with the steps waiting then (never waiting for a seat that has not asked: a
session whose client is behind sits the tick out rather than holding the others). A
step so waits at most one interval, which the session's buffer covers, and each
session keeps its own rate: backpressure from its own buffer decides when it asks,
and a session that joins or leaves changes only how many the next batch waits for.
A batch slower than the interval is followed at once by the next, larger one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reactor_serve.interface.batching import BatchDecl, SessionStep

__all__ = ["BatchFailed", "BatchScheduler", "BatchTotals"]

log = logging.getLogger("reactor_serve.runtime")


class BatchFailed(RuntimeError):
    """The batched step raised, or returned the wrong number of outputs."""


@dataclass(frozen=True)
class BatchTotals:
    """Batched calls so far: how many, the session steps they made, their seconds."""

    batches: int = 0
    steps: int = 0
    seconds: float = 0.0

    def plus(self, steps: int, seconds: float) -> BatchTotals:
        """These totals and one more batch of `steps` that took `seconds`."""
        return BatchTotals(self.batches + 1, self.steps + steps, self.seconds + seconds)


class _Request:
    __slots__ = ("seat", "step", "future")

    def __init__(self, seat: object, step: SessionStep) -> None:
        self.seat = seat
        self.step = step
        # (output or None, seconds the batch took)
        self.future: concurrent.futures.Future[tuple[Any, float]] = concurrent.futures.Future()


class BatchScheduler:
    """Steps the streaming seats of one loaded model together, on a thread of its own."""

    def __init__(
        self,
        model: Any,
        decl: BatchDecl,
        *,
        fps: float,
        name: str = "model",
        on_batch: Callable[[int, float], None] | None = None,
        on_start: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_start` runs first on the scheduler's thread (to set per-thread state the
        model's forward pass relies on, as torch's CPU thread count)."""
        self._step = getattr(model, decl.method_name)
        self._where = f"{type(model).__qualname__}.{decl.method_name}()"
        self.max_size = decl.max_size
        self.interval = 1.0 / fps
        self._last_start = float("-inf")
        self._on_batch = on_batch
        self._on_start = on_start
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        # Seats whose sessions stream: a batch waits for these (briefly), no others.
        self._streaming: set[int] = set()
        self._closed = False
        self._totals = BatchTotals()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name=f"reactor-batch-{name}",
                                        daemon=True)
        self._thread.start()

    @property
    def totals(self) -> BatchTotals:
        return self._totals

    def join(self, seat: object) -> None:
        """`seat`'s session streams: batches wait for its steps."""
        with self._cond:
            self._streaming.add(id(seat))

    def leave(self, seat: object) -> None:
        """`seat`'s session ended: no batch waits for it, and a step it asked for that
        has not run is dropped."""
        with self._cond:
            self._streaming.discard(id(seat))
            dropped = [r for r in self._pending if r.seat is seat]
            self._pending = [r for r in self._pending if r.seat is not seat]
            self._cond.notify_all()
        for request in dropped:
            request.future.cancel()

    def submit(self, seat: object, step: SessionStep) -> concurrent.futures.Future[tuple[Any, float]]:
        """Ask for `step`; the future gives (its output, the batch's seconds) or raises
        BatchFailed."""
        request = _Request(seat, step)
        with self._cond:
            if self._closed:
                request.future.set_exception(BatchFailed("the model is shutting down"))
                return request.future
            self._pending.append(request)
            self._cond.notify_all()
        return request.future

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for request in pending:
            request.future.set_exception(BatchFailed("the model is shutting down"))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the scheduler's thread ---------------------------------------------------------

    def _main(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            while (batch := self._gather()) is not None:
                self._run(batch)
        finally:
            if self._loop is not None:
                self._loop.close()

    def _gather(self) -> list[_Request] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = self._last_start + self.interval
            while not self._closed:
                # Every streaming seat has asked (or the batch is full): go now.
                wanted = min(self.max_size, max(1, len(self._streaming)))
                left = deadline - self._clock()
                if len(self._pending) >= wanted or left <= 0 or not self._pending:
                    break
                self._cond.wait(left)
            if self._closed or not self._pending:
                return [] if not self._closed else None
            batch, self._pending = self._pending[: self.max_size], self._pending[self.max_size:]
            self._last_start = self._clock()
            return batch

    def _run(self, batch: list[_Request]) -> None:
        if not batch:
            return
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        started = time.perf_counter()
        try:
            outputs = self._step([r.step for r in live])
            if inspect.isawaitable(outputs):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                outputs = self._loop.run_until_complete(outputs)
            outputs = list(outputs) if outputs is not None else None
            if outputs is None or len(outputs) != len(live):
                got = "None" if outputs is None else f"{len(outputs)} outputs"
                raise BatchFailed(f"{self._where} returned {got} for {len(live)} session "
                                  f"step(s); return one output (or None) per step, in order")
        except Exception as exc:
            failure = exc if isinstance(exc, BatchFailed) else BatchFailed(
                f"{self._where} raised {type(exc).__name__}: {exc}")
            if failure is not exc:
                log.exception("%s raised for a batch of %d", self._where, len(live))
            for request in live:
                request.future.set_exception(failure)
            return
        seconds = time.perf_counter() - started
        self._totals = self._totals.plus(len(live), seconds)
        if self._on_batch is not None:
            try:
                self._on_batch(len(live), seconds)
            except Exception:
                log.exception("the batch listener failed")
        for request, output in zip(live, outputs):
            request.future.set_result((output, seconds))
