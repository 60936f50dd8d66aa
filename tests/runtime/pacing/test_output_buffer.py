"""Tests for reactor_serve.runtime.pacing.output_buffer.OutputBuffer.

Pacing state is checked with a simulated clock. The cross-thread tests (a producer
waiting for space while a consumer on another thread takes) wait with generous
timeouts and assert only on what happened, never on how long it took.
"""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest

from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer
from reactor_serve.runtime.pacing.supply_margin import SupplyMargin

WAIT = 30.0  # generous: only a broken wakeup takes anywhere near this long


class SimClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _items(n: int, value: int = 0) -> list[FrameItem]:
    return [
        FrameItem(video={"main_video": np.full((2, 2, 3), (value + i) % 256, np.uint8)})
        for i in range(n)
    ]


def _asking():
    """A should_stop that never stops, and an event set once put_blocking asked it: it
    asks holding the buffer's lock and goes on to wait for space without letting go,
    so whatever takes the lock after the event finds the emit waiting."""
    asked = threading.Event()

    def should_stop() -> bool:
        asked.set()
        return False

    return asked, should_stop


async def _until(predicate, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)  # the poll interval of a wait with a deadline


# ---- construction and set_fps ---------------------------------------------------------


def test_rejects_capacity_below_one():
    with pytest.raises(ValueError, match="buffer_size"):
        OutputBuffer(0, 30)


@pytest.mark.parametrize("bad", [0, 0.0, -1, -30.0, math.nan, math.inf])
def test_constructor_rejects_bad_fps(bad):
    with pytest.raises(ValueError, match="fps"):
        OutputBuffer(4, bad)


def test_set_fps_changes_target():
    buf = OutputBuffer(4, 30)
    assert buf.target_fps == 30.0
    buf.set_fps(24)
    assert buf.target_fps == 24.0
    assert isinstance(buf.target_fps, float)
    buf.set_fps(12.5)
    assert buf.target_fps == 12.5


@pytest.mark.parametrize("bad", [0, 0.0, -5, -0.1, math.nan, -math.inf, math.inf])
def test_set_fps_rejects_non_positive_or_non_finite(bad):
    buf = OutputBuffer(4, 30)
    with pytest.raises(ValueError, match="fps") as info:
        buf.set_fps(bad)
    assert repr(bad) in str(info.value)
    assert buf.target_fps == 30.0  # unchanged


# ---- capacity and put_nowait ----------------------------------------------------------


def test_capacity_bound():
    buf = OutputBuffer(3, 30)
    assert buf.put_nowait(_items(2)) == 2
    assert buf.put_nowait(_items(2)) == 1
    assert buf.depth() == 3
    assert buf.put_nowait(_items(5)) == 0
    assert buf.depth() == 3
    assert buf.emitted == 3


def test_put_nowait_partial_takes_the_first_items_in_order():
    buf = OutputBuffer(4, 30)
    items = _items(6)
    assert buf.put_nowait(items) == 4
    taken = list(buf.drain())
    assert taken == items[:4]
    assert all(a is b for a, b in zip(taken, items[:4]))
    assert buf.depth() == 0
    assert buf.taken == 4


def test_put_nowait_empty_list():
    buf = OutputBuffer(2, 30)
    assert buf.put_nowait([]) == 0
    assert buf.depth() == 0
    assert buf.supply.margin() is None


def test_take_never_waits_and_is_fifo():
    buf = OutputBuffer(4, 30)
    assert buf.take() is None
    items = _items(3)
    buf.put_nowait(items)
    assert buf.take() is items[0]
    assert buf.take() is items[1]
    assert buf.take() is items[2]
    assert buf.take() is None


# ---- record_emit: stamps --------------------------------------------------------------


def test_seq_strictly_increases_across_emits():
    clock = SimClock()
    buf = OutputBuffer(100, 30, clock=clock)
    seqs: list[int] = []
    for n in (1, 4, 2, 7):
        clock.t += 0.1
        items = _items(n)
        buf.record_emit(items, None)
        seqs.extend(item.seq for item in items)
        buf.put_nowait(items)
    assert len(seqs) == 14
    assert all(b > a for a, b in zip(seqs, seqs[1:]))
    assert seqs[0] >= 1
    # Seq survives a flush: numbering never goes back.
    buf.flush()
    later = _items(1)
    buf.record_emit(later, None)
    assert later[0].seq > seqs[-1]


def test_emitted_at_stamped_from_the_clock():
    clock = SimClock(12.5)
    buf = OutputBuffer(8, 30, clock=clock)
    first = _items(3)
    buf.record_emit(first, None)
    clock.t = 13.25
    second = _items(2)
    buf.record_emit(second, None)
    assert [i.emitted_at for i in first] == [12.5] * 3
    assert [i.emitted_at for i in second] == [13.25] * 2


def test_record_emit_feeds_the_rate_with_frame_count_and_compute_time():
    clock = SimClock()
    buf = OutputBuffer(100, 30, clock=clock)
    buf.record_emit(_items(10), 0.5)
    assert buf.rate.rate() == pytest.approx(20.0)

    clock2 = SimClock()
    buf2 = OutputBuffer(100, 30, clock=clock2)
    buf2.rate.returned(0.0)
    clock2.t = 0.25
    buf2.record_emit(_items(6), None)
    assert buf2.rate.rate() == pytest.approx(24.0)


# ---- async put ------------------------------------------------------------------------


async def test_async_put_when_room_returns_and_marks_return():
    clock = SimClock()
    buf = OutputBuffer(4, 30, clock=clock)
    buf.record_emit(_items(1), None)  # first emit: marks nothing yet
    items = _items(2)
    buf.record_emit(items, None)
    await buf.put(items)
    assert buf.depth() == 2
    # put() marked where the model's own time starts again.
    clock.t = 0.5
    buf.record_emit(_items(12), None)
    assert buf.rate.rate() == pytest.approx(24.0)


async def test_async_put_waits_when_full_and_resumes_when_consumer_takes():
    buf = OutputBuffer(2, 30)
    items = _items(5)
    producer = asyncio.create_task(buf.put(items))
    await _until(lambda: buf.depth() == 2)
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not producer.done()  # blocked: three items still pending

    taken: list[FrameItem] = []
    stop = threading.Event()

    def consumer() -> None:
        while len(taken) < 5 and not stop.is_set():
            item = buf.take()
            if item is not None:
                taken.append(item)
            else:
                stop.wait(0.002)  # the poll interval of a wait with a deadline

    th = threading.Thread(target=consumer)
    th.start()
    try:
        await asyncio.wait_for(producer, WAIT)
    finally:
        th.join(WAIT)
        stop.set()
    assert not th.is_alive()
    assert taken == items  # every item, in order, nothing dropped
    assert buf.dropped == 0


async def test_async_put_blocked_resumes_on_single_take_from_other_thread():
    buf = OutputBuffer(1, 30)
    first, second = _items(2)
    await buf.put([first])
    producer = asyncio.create_task(buf.put([second]))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not producer.done()
    th = threading.Thread(target=buf.take)
    th.start()
    await asyncio.wait_for(producer, WAIT)
    th.join(WAIT)
    assert buf.depth() == 1
    assert buf.take() is second


async def test_async_put_drop_discards_what_does_not_fit():
    buf = OutputBuffer(3, 30)
    items = _items(5)
    await asyncio.wait_for(buf.put(items, drop=True), WAIT)
    assert buf.depth() == 3
    assert buf.dropped == 2
    await asyncio.wait_for(buf.put(_items(4), drop=True), WAIT)
    assert buf.dropped == 6
    assert list(buf.drain()) == items[:3]


async def test_async_put_without_drop_counts_nothing_dropped():
    buf = OutputBuffer(2, 30)
    await buf.put(_items(2))
    assert buf.dropped == 0


async def test_async_put_woken_by_flush():
    buf = OutputBuffer(2, 30)
    await buf.put(_items(2))
    pending = _items(2, value=100)
    producer = asyncio.create_task(buf.put(pending))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not producer.done()
    threading.Thread(target=buf.flush).start()
    await asyncio.wait_for(producer, WAIT)
    assert buf.flushes == 1
    # The queued frames are gone; only (some of) the woken emit's frames can follow.
    remaining = list(buf.drain())
    assert all(any(item is p for p in pending) for item in remaining)


async def test_async_put_from_another_loop_thread():
    """The model loop lives on its own thread; the consumer on this loop."""
    buf = OutputBuffer(2, 30)
    items = _items(6)
    done = threading.Event()
    errors: list[BaseException] = []

    def model_thread() -> None:
        try:
            asyncio.run(buf.put(items))
        except BaseException as exc:  # pragma: no cover - failure path
            errors.append(exc)
        finally:
            done.set()

    th = threading.Thread(target=model_thread)
    th.start()
    taken: list[FrameItem] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while len(taken) < 6 and loop.time() < deadline:
        item = buf.take()
        if item is not None:
            taken.append(item)
        else:
            await asyncio.sleep(0.002)  # the poll interval of a wait with a deadline
    th.join(WAIT)
    assert done.is_set() and not errors
    assert taken == items


# ---- put_blocking ---------------------------------------------------------------------


def test_put_blocking_with_room_returns_true():
    buf = OutputBuffer(4, 30)
    assert buf.put_blocking(_items(3)) is True
    assert buf.depth() == 3


def test_put_blocking_waits_for_consumer():
    buf = OutputBuffer(2, 30)
    items = _items(5)
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(buf.put_blocking(items)))
    th.start()
    taken: list[FrameItem] = []
    deadline = threading.Event()
    timer = threading.Timer(WAIT, deadline.set)
    timer.start()
    try:
        while len(taken) < 5 and not deadline.is_set():
            item = buf.take()
            if item is None:
                deadline.wait(0.002)  # the poll interval of a wait with a deadline
            else:
                taken.append(item)
    finally:
        timer.cancel()
    th.join(WAIT)
    assert result == [True]
    assert taken == items


def test_put_blocking_is_blocked_while_full():
    buf = OutputBuffer(1, 30)
    buf.put_nowait(_items(1))
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(buf.put_blocking(_items(1))))
    th.start()
    th.join(0.2)  # a negative check: a busy machine can only keep it waiting longer
    assert th.is_alive() and result == []  # still waiting for space
    buf.take()
    th.join(WAIT)
    assert result == [True]
    assert buf.depth() == 1


def test_put_blocking_returns_false_when_should_stop_becomes_true():
    buf = OutputBuffer(1, 30)
    buf.put_nowait(_items(1))
    stop = threading.Event()
    result: list[bool] = []
    th = threading.Thread(
        target=lambda: result.append(buf.put_blocking(_items(3), should_stop=stop.is_set))
    )
    th.start()
    th.join(0.1)  # a negative check: a busy machine can only keep it waiting longer
    assert th.is_alive()
    stop.set()  # nobody notifies: put_blocking must notice by itself
    th.join(WAIT)
    assert not th.is_alive()
    assert result == [False]
    assert buf.depth() == 1  # nothing more went in


def test_put_blocking_drop_discards_without_waiting():
    buf = OutputBuffer(2, 30)
    assert buf.put_blocking(_items(5), drop=True) is True
    assert buf.depth() == 2
    assert buf.dropped == 3


def test_put_blocking_marks_return_for_the_rate():
    clock = SimClock()
    buf = OutputBuffer(4, 30, clock=clock)
    items = _items(4)
    buf.record_emit(items, None)
    clock.t = 3.0  # e.g. it waited; the return is what counts
    assert buf.put_blocking(items)
    clock.t = 3.5
    buf.record_emit(_items(12), None)
    assert buf.rate.rate() == pytest.approx(24.0)


def test_put_blocking_woken_by_flush():
    buf = OutputBuffer(2, 30)
    buf.put_nowait(_items(2))
    pending = _items(2, value=50)
    result: list[bool] = []
    asked, should_stop = _asking()
    th = threading.Thread(
        target=lambda: result.append(buf.put_blocking(pending, should_stop=should_stop)))
    th.start()
    assert asked.wait(WAIT), "put_blocking never ran"
    th.join(0.1)  # a negative check: a busy machine can only keep it waiting longer
    assert th.is_alive()
    buf.flush()
    th.join(WAIT)
    assert not th.is_alive() and len(result) == 1
    remaining = list(buf.drain())
    assert all(any(item is p for p in pending) for item in remaining)


# ---- flush ----------------------------------------------------------------------------


def test_flush_empties_and_counts():
    buf = OutputBuffer(4, 30)
    buf.put_nowait(_items(4))
    assert buf.flushes == 0
    buf.flush()
    assert buf.depth() == 0
    assert buf.take() is None
    assert buf.flushes == 1
    buf.flush()
    assert buf.flushes == 2


def test_flush_resets_margin():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.put_nowait(_items(3))
    clock.t = 5.0
    buf.put_nowait(_items(1))
    assert buf.supply.margin() is not None
    buf.flush()
    assert buf.supply.margin() is None


def test_restart_flushes_and_restarts_rate():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.record_emit(_items(4), 0.1)
    buf.put_nowait(_items(4))
    assert buf.rate.rate() is not None
    buf.restart()
    assert buf.depth() == 0
    assert buf.flushes == 1
    assert buf.rate.rate() is None


# ---- margin ---------------------------------------------------------------------------


def test_margin_none_before_any_put():
    assert OutputBuffer(4, 30).supply.margin() is None


def test_margin_samples_depth_before_the_put():
    clock = SimClock()
    buf = OutputBuffer(16, 30, clock=clock)
    buf.put_nowait(_items(3))
    # First sample: the queue was empty (and never ran dry): margin 0, not 3.
    assert buf.supply.margin() == pytest.approx(0.0)
    clock.t = 100.0  # long enough that the new sample replaces the old one
    buf.put_nowait(_items(5))
    assert buf.supply.margin() == pytest.approx(3.0)  # depth before, not 8 after
    clock.t = 200.0
    buf.take()
    buf.take()
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(6.0)


def test_margin_is_smoothed_over_time():
    clock = SimClock()
    buf = OutputBuffer(16, 30, clock=clock)
    buf.put_nowait(_items(4))  # margin 0
    tau = SupplyMargin.MARGIN_TIME_CONSTANT_S
    clock.t = tau
    buf.put_nowait(_items(1))  # sample 4, one time constant later
    assert buf.supply.margin() == pytest.approx(4.0 * (1 - math.exp(-1)))
    # A sample at the same instant moves nothing.
    before = buf.supply.margin()
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(before)


def test_margin_negative_after_underruns():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.put_nowait(_items(1))
    assert buf.take() is not None
    assert buf.take() is None
    assert buf.take() is None
    clock.t = 100.0
    buf.put_nowait(_items(2))
    assert buf.supply.margin() == pytest.approx(-2.0)
    # Underruns are counted per put: the next put with frames still queued is positive.
    clock.t = 200.0
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(2.0)


def test_first_arrival_of_a_session_is_no_stall():
    """Before the first frame (and after a flush) the clock shows black on an empty
    queue: nothing was due, so those ticks do not count as running dry."""
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    for _ in range(20):
        assert buf.take() is None
    buf.put_nowait(_items(2))
    assert buf.supply.margin() == pytest.approx(0.0)
    buf.flush()
    for _ in range(5):
        assert buf.take() is None
    clock.t = 100.0
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(0.0)


def test_margin_counts_underruns_since_last_put_only():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.put_nowait(_items(1))
    buf.take()
    buf.take()  # one underrun
    clock.t = 100.0
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(-1.0)
    clock.t = 200.0
    buf.take()
    buf.put_nowait(_items(1))  # ran to empty exactly, no underrun
    assert buf.supply.margin() == pytest.approx(0.0)


def test_margin_floor_bounds_long_stalls():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.put_nowait(_items(1))
    for _ in range(100):
        buf.take()
    clock.t = 100.0
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(SupplyMargin.MARGIN_FLOOR)
    assert SupplyMargin.MARGIN_FLOOR < 0


def test_underruns_not_counted_while_monitoring_disabled():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.rate.set_monitoring(False, 0.0)
    for _ in range(5):
        buf.take()
    buf.rate.set_monitoring(True, 0.0)
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(0.0)


def test_flush_clears_pending_underruns():
    clock = SimClock()
    buf = OutputBuffer(8, 30, clock=clock)
    buf.take()
    buf.take()
    buf.flush()
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(0.0)


def test_margin_counts_the_time_to_the_next_tick():
    """An arrival is measured against the tick that will present it: 0.25 of a tick
    before it, an empty queue gives 0.25, and two queued frames 2.25."""
    clock = SimClock()
    buf = OutputBuffer(16, 20, clock=clock)
    clock.t = 10.0
    buf.supply.note_next_tick(10.0125, 0.05)
    buf.put_nowait(_items(2))
    assert buf.supply.margin() == pytest.approx(0.25)
    clock.t = 100.0
    buf.supply.note_next_tick(100.0125, 0.05)
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(2.25)
    # A consumer running late (its next slot already past) counts no fraction.
    clock.t = 200.0
    buf.supply.note_next_tick(199.9, 0.05)
    for _ in range(3):
        buf.take()
    buf.put_nowait(_items(1))
    assert buf.supply.margin() == pytest.approx(0.0)


def _steady_blocks(buf: OutputBuffer, clock: SimClock, blocks: int, frame_by_frame: bool,
                   late: dict[int, float] | None = None) -> list[float]:
    """12-frame blocks every 0.5 s on a fixed schedule (some `late` by seconds),
    presented at 24 fps from a tick 10 ms after each block's nominal time."""
    margins = []
    tick = 1 / 24
    for k in range(blocks):
        arrival = 0.5 * k + (late or {}).get(k, 0.0)
        clock.t = arrival
        buf.supply.note_next_tick(0.5 * k + 0.01, tick)
        if frame_by_frame:
            for n, item in enumerate(_items(12)):
                clock.t = arrival + n * 0.0005
                buf.put_nowait([item])
        else:
            buf.put_nowait(_items(12))
        margins.append(buf.supply.margin())
        for _ in range(12):
            buf.take()
    return margins


@pytest.mark.parametrize("frame_by_frame", [False, True])
def test_a_steady_block_producer_shows_a_steady_margin_and_no_spread(frame_by_frame):
    """Measured once per arrival: a block put frame by frame is one arrival, not a
    sawtooth of 0..11 frames queued that would read as jitter."""
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    margins = _steady_blocks(buf, clock, 20, frame_by_frame)
    assert margins[-1] == pytest.approx(0.24)  # 10 ms of a 41.7 ms tick
    assert buf.supply.spread() == pytest.approx(0.0, abs=1e-9)


def test_spread_measures_late_arrivals():
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    # The same schedule, with a block now and then 20 ms (half a frame) late.
    _steady_blocks(buf, clock, 30, False, late={k: 0.02 for k in range(6, 30, 4)})
    assert buf.supply.spread() > 0.1


def test_a_sessions_irregular_start_is_not_read_as_jitter():
    """The first blocks of a session come late and early while the connection and
    the encoder start up; after that the producer is steady, and shows no spread."""
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    _steady_blocks(buf, clock, 30, False, late={1: 0.03, 2: -0.02, 3: 0.01})
    assert buf.supply.spread() == pytest.approx(0.0, abs=1e-9)


def test_spread_ignores_how_the_consumer_paces():
    """The clock's own corrections move the margin, not the producer's timing: a
    steady producer shows no spread however unevenly its frames are taken."""
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    for k in range(30):
        clock.t = 0.5 * k
        buf.put_nowait(_items(12))
        while buf.depth() > k % 3:  # 0, 1 or 2 frames left over
            buf.take()
    assert 0.5 < buf.supply.margin() < 2.0
    assert buf.supply.spread() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("declared", [True, False])
def test_a_declared_pause_is_no_lateness(declared):
    """A model that pauses with monitoring disabled meant to: its steady blocks after
    the pause show no spread. The same gap undeclared is a late block."""
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    times = [0.5 * k for k in range(10)] + [10.0 + 0.5 * k for k in range(10)]
    for t in times:
        if declared and t == 10.0:
            buf.rate.set_monitoring(False, 5.0)
            buf.rate.set_monitoring(True, 9.5)
        clock.t = t
        buf.put_nowait(_items(12))
        while buf.depth():
            buf.take()
    if declared:
        assert buf.supply.spread() == pytest.approx(0.0, abs=1e-9)
    else:
        assert buf.supply.spread() > 1.0


def test_arrival_rate_is_what_the_producer_delivers():
    clock = SimClock()
    buf = OutputBuffer(24, 30, clock=clock)
    few = SupplyMargin.PACE_MIN_ARRIVALS
    for k in range(few):
        assert buf.supply.arrival_rate() is None  # too few arrivals to fit a line through
        clock.t = 0.5 * k
        buf.record_emit(_items(12), 0.45)  # compute_time that reads 10 % high
        buf.put_nowait(_items(12))
        while buf.depth():
            buf.take()
    for k in range(few, 12):
        clock.t = 0.5 * k + (0.01 if k % 2 else 0.0)
        buf.record_emit(_items(12), 0.45)
        buf.put_nowait(_items(12))
        while buf.depth():
            buf.take()
    assert buf.rate.rate() == pytest.approx(12 / 0.45)
    assert buf.supply.arrival_rate() == pytest.approx(24.0, rel=0.02)
    buf.flush()
    clock.t = 100.0
    buf.put_nowait(_items(12))
    assert buf.supply.arrival_rate() is None


def test_flush_resets_the_spread():
    clock = SimClock()
    buf = OutputBuffer(24, 24, clock=clock)
    _steady_blocks(buf, clock, 30, False, late={k: 0.02 for k in range(6, 30, 4)})
    assert buf.supply.spread() > 0.1
    buf.flush()
    assert buf.supply.spread() == 0.0


def test_full_put_takes_no_margin_sample():
    clock = SimClock()
    buf = OutputBuffer(2, 30, clock=clock)
    buf.put_nowait(_items(2))  # margin 0
    clock.t = 100.0
    assert buf.put_nowait(_items(1)) == 0
    assert buf.supply.margin() == pytest.approx(0.0)


# ---- counters -------------------------------------------------------------------------


def test_counters():
    buf = OutputBuffer(3, 30)
    buf.put_nowait(_items(2))
    buf.take()
    buf.put_blocking(_items(4), drop=True)
    assert buf.emitted == 4
    assert buf.taken == 1
    assert buf.dropped == 2
    assert buf.depth() == 3


async def test_flush_discards_the_rest_of_an_emit_that_was_waiting():
    buf = OutputBuffer(2, 30)
    await buf.put(_items(2))
    producer = asyncio.create_task(buf.put(_items(3, value=100)))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not producer.done()
    buf.flush()
    await asyncio.wait_for(producer, WAIT)
    # After a flush the client sees black, not the tail of a pre-flush block.
    assert list(buf.drain()) == []


def test_put_blocking_discards_the_rest_after_a_flush():
    buf = OutputBuffer(1, 30)
    buf.put_nowait(_items(1))
    done = threading.Event()

    asked, should_stop = _asking()

    def produce():
        buf.put_blocking(_items(3, value=50), should_stop=should_stop)
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    # The flush must find the emit waiting, not come before it.
    assert asked.wait(WAIT), "put_blocking never ran"
    assert not done.wait(0.1)  # a negative check: load can only keep it waiting longer
    buf.flush()
    assert done.wait(WAIT)
    thread.join()
    assert list(buf.drain()) == []


@pytest.mark.parametrize("fps", [np.float32(24), np.int64(15), 12.5])
def test_set_fps_accepts_numpy_and_python_numbers(fps):
    buf = OutputBuffer(2, 30)
    buf.set_fps(fps)
    assert buf.target_fps == float(fps) and type(buf.target_fps) is float


def test_set_fps_rejects_bool():
    with pytest.raises(ValueError, match="fps"):
        OutputBuffer(2, 30).set_fps(True)
