"""Stepped generation: one unit of the model's work per step the client asks for.

A session opened stepped streams nothing. Its producer (a pipeline's generator, a run
loop's `run()`, a `VideoModel`'s session thread) starts at the first step, and every
emit (a pipeline's yield, a run loop's `emit`, the older API's `emit_block`) is one
unit: its frames answer the step that ran it, and the emit does not return until the
next step has applied its state and commands (`StepGate`). So each step's output is
made with exactly what that step carried, whichever kind the model is.

`StepOutcome` is what a step comes to, on the side that runs the model; the frames
themselves travel the way streamed ones do, through the output buffer.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Callable

__all__ = ["StepFailure", "StepGate", "StepOutcome"]


class StepFailure:
    """Why a step did not produce (the wire's StepFailureCode names)."""

    REFUSED = "refused"  # the request was refused whole: nothing it carried applied
    NOT_READY = "not_ready"  # another step is still running
    FAILED = "failed"  # the model raised while producing
    COMMAND_FAILED = "command_failed"  # a state value's or command's handler raised
    RESULT_TOO_LARGE = "result_too_large"  # made more than one message may carry
    SESSION_ENDED = "session_ended"


@dataclass(frozen=True)
class StepOutcome:
    """What one step came to: `failure` None when it produced, with the seconds the
    unit took; else a `StepFailure`, the `message` saying why and, for a refused or
    failed command, its `entry` (`state.<field>` or the command's name)."""

    failure: str | None = None
    message: str = ""
    entry: str | None = None
    elapsed_s: float = 0.0


class StepGate:
    """Lets a stepped session's producer do one unit of work per step.

    `arm(done)` starts a step (`done(outcome)` is called once, from whichever thread
    the unit ends on); the producer calls `produced(seconds)` after each emit and then
    `wait()` / `wait_blocking()` until the next step is armed. `close(outcome)` ends
    it all: the producer is released and a step in flight answered with `outcome`.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._permits = 0
        self._closed = False
        self._done: Callable[[StepOutcome], None] | None = None
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self.started = False  # the producer was started (by the first step)
        self.steps = 0

    @property
    def busy(self) -> bool:
        """A step is running (armed, its unit not produced yet)."""
        with self._lock:
            return self._done is not None

    def arm(self, done: Callable[[StepOutcome], None]) -> bool:
        """Start a step; False when the gate is closed or a step is running."""
        with self._lock:
            if self._closed or self._done is not None:
                return False
            self._done = done
            self.steps += 1
            if self.started:
                self._permits += 1
                self._wake_locked()
            return True

    def produced(self, elapsed_s: float) -> None:
        """A unit was emitted: the step that ran it is answered."""
        with self._lock:
            done, self._done = self._done, None
        if done is not None:
            done(StepOutcome(elapsed_s=elapsed_s))

    async def wait(self) -> None:
        """Until the next step is armed, or the gate closes (model loop)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._closed:
                    return
                if self._permits:
                    self._permits -= 1
                    return
                future: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, future)
            await future

    def wait_blocking(self, should_stop: Callable[[], bool]) -> None:
        """`wait` for a thread that may block (the older API's session thread)."""
        with self._lock:
            while not self._closed and not self._permits and not should_stop():
                self._lock.wait(0.1)
            if self._permits and not self._closed:
                self._permits -= 1

    def close(self, outcome: StepOutcome) -> None:
        with self._lock:
            self._closed = True
            done, self._done = self._done, None
            self._wake_locked()
        if done is not None:
            done(outcome)

    def _wake_locked(self) -> None:
        self._lock.notify_all()
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            try:
                loop.call_soon_threadsafe(_set_once, future)
            except RuntimeError:
                pass  # its loop closed: nothing waits any more


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
