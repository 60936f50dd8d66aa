"""Reporting a stalled event loop in the test process, with every thread's stack.

A test's client sends its pings and reads its frames on the test's event loop. When
that loop stops turning (a call that blocks, a lock, a machine out of CPU), the
server sees a silent client, and the test fails far from the cause. So each loop the
tests run on gets a heartbeat, and a watcher thread writes every thread's stack to
stderr once a running loop has missed its beats for `threshold_s`: pytest shows it
with the failing test's captured output (and the load script's failure log keeps it).

tests/conftest.py gives pytest-asyncio `LoopStallWatcher.new_loop` as its one loop
factory (the `pytest_asyncio_loop_factories` hook): each test's loop is watched.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, TextIO

__all__ = ["LoopStallWatcher"]


class LoopStallWatcher:
    """Watches loops' heartbeats from a daemon thread (started on the first `watch`)."""

    BEAT_S = 0.25

    def __init__(
        self,
        threshold_s: float = 5.0,
        stream: Callable[[], TextIO] = lambda: sys.stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_s = threshold_s
        self._stream = stream
        self._clock = clock
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """A new event loop, watched."""
        loop = asyncio.new_event_loop()
        self.watch(loop)
        return loop

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give `loop` a heartbeat; it is watched while it runs."""
        # [last beat, running at the last look, reported this stall]
        state = [self._clock(), False, False]
        with self._lock:
            self._loops[loop] = state

        def beat() -> None:
            state[0] = self._clock()
            state[2] = False
            if not loop.is_closed():
                loop.call_later(self.BEAT_S, beat)

        loop.call_soon(beat)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loop-stall-watcher",
                                            daemon=True)
            self._thread.start()

    def check(self) -> list[float]:
        """Look at every watched loop once; report each newly stalled one. Returns
        the stalls reported (seconds since the last beat)."""
        reported = []
        with self._lock:
            watched = list(self._loops.items())
        for loop, state in watched:
            running = loop.is_running()
            # A loop must have been running at the last look too: one started a moment
            # ago has its overdue beat still to come, and is not stalled.
            stalled = self._clock() - state[0]
            if running and state[1] and not state[2] and stalled > self.threshold_s:
                state[2] = True
                reported.append(stalled)
                self._report(stalled)
            state[1] = running
        return reported

    def _report(self, stalled: float) -> None:
        frames = sys._current_frames()
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        lines = [f"\n=== the event loop has not turned for {stalled:.1f} s; every thread:\n"]
        for ident, frame in frames.items():
            lines.append(f"--- thread {names.get(ident, ident)}\n")
            lines.extend(traceback.format_stack(frame))
        try:
            stream = self._stream()
            stream.write("".join(lines))
            stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed while the process ends

    def _run(self) -> None:
        while True:
            time.sleep(self.BEAT_S * 2)
            self.check()
