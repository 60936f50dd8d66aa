"""The test process's loop-stall reporter (tests/support/loop_stalls.py), on a real
loop blocked on purpose and on a fake clock."""

import asyncio
import io
import time

from loop_stalls import LoopStallWatcher


class Clock:
    def __init__(self):
        self.now = 10.0

    def __call__(self):
        return self.now


def test_a_running_loop_that_misses_its_beats_is_reported_once_with_the_blocking_stack():
    clock, out = Clock(), io.StringIO()
    watcher = LoopStallWatcher(threshold_s=5.0, stream=lambda: out, clock=clock)
    loop = asyncio.new_event_loop()
    try:
        watcher.watch(loop)
        seen = []

        def blocked_here():
            # The loop runs this callback and does not turn while it does.
            seen.append(watcher.check())  # running, but not at a previous look
            clock.now += 6.0
            seen.append(watcher.check())  # stalled 6 s: reported
            seen.append(watcher.check())  # the same stall: not again
            loop.stop()

        loop.call_soon(blocked_here)
        loop.run_forever()
        assert seen == [[], [6.0], []]
        report = out.getvalue()
        assert "has not turned for 6.0 s" in report and "blocked_here" in report
        # The beat that comes once the loop turns again ends the stall.
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert watcher.check() == []  # not running now
    finally:
        loop.close()


def test_a_loop_that_is_not_running_or_just_started_is_not_stalled():
    clock, out = Clock(), io.StringIO()
    watcher = LoopStallWatcher(threshold_s=5.0, stream=lambda: out, clock=clock)
    loop = asyncio.new_event_loop()
    try:
        watcher.watch(loop)
        clock.now += 60.0
        assert watcher.check() == []  # idle between tests: no beats expected

        def first_turn():
            # Started after a long pause: the overdue beat has not had its turn yet.
            assert watcher.check() == []
            loop.stop()

        loop.call_soon(first_turn)
        loop.run_forever()
        assert out.getvalue() == ""
    finally:
        loop.close()


def test_each_loop_it_makes_is_watched_and_the_thread_reports_a_real_stall():
    out = io.StringIO()
    watcher = LoopStallWatcher(threshold_s=0.6, stream=lambda: out)
    loop = watcher.new_loop()
    try:
        async def stall():
            await asyncio.sleep(0.6)  # beats, and the watcher's looks, while running
            time.sleep(2.0)  # blocks the loop well past the threshold

        loop.run_until_complete(stall())
    finally:
        loop.close()
    assert "has not turned for" in out.getvalue() and "time.sleep(2.0)" in out.getvalue()
