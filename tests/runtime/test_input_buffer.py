"""Tests for reactor_serve.runtime.input_buffer.InputBuffer.

Cross-thread tests push from a plain thread while the test's loop awaits `read()`;
they wait with generous timeouts and assert only on what was read.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from reactor_serve.interface import BufferClosed
from reactor_serve.runtime.input_buffer import InputBuffer

WAIT = 30.0  # generous: only a broken wakeup takes anywhere near this long


def _frame(value: int, size: tuple[int, int] = (4, 6)) -> np.ndarray:
    return np.full((*size, 3), value % 256, dtype=np.uint8)


def _values(frames: list[np.ndarray]) -> list[int]:
    return [int(f[0, 0, 0]) for f in frames]


def _push_later(buf: InputBuffer, values: list[int], delay: float = 0.02) -> threading.Thread:
    def run() -> None:
        stop = threading.Event()
        for v in values:
            stop.wait(delay)  # a camera's pace: what is read is asserted, not when
            buf.push(_frame(v))

    th = threading.Thread(target=run)
    th.start()
    return th


# ---- try_read -------------------------------------------------------------------------


def test_try_read_returns_latest_n_oldest_first_and_clears_backlog():
    buf = InputBuffer("cam", capacity=8)
    for v in range(1, 6):
        buf.push(_frame(v))
    frames = buf.try_read(2)
    assert frames is not None
    assert _values(frames) == [4, 5]
    assert len(buf) == 0  # backlog (1, 2, 3) discarded too
    assert buf.try_read(1) is None
    assert buf.discarded == 3
    assert buf.received == 5


def test_try_read_one_is_the_latest_frame():
    buf = InputBuffer("cam")
    for v in (7, 8, 9):
        buf.push(_frame(v))
    assert _values(buf.try_read()) == [9]


def test_try_read_returns_frames_with_the_pushed_content():
    buf = InputBuffer("cam")
    frame = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    buf.push(frame)
    (got,) = buf.try_read(1)
    assert got.shape == (5, 7, 3) and got.dtype == np.uint8
    assert np.array_equal(got, frame)


def test_try_read_with_too_few_returns_none_and_leaves_buffer_untouched():
    buf = InputBuffer("cam", capacity=8)
    buf.push(_frame(1))
    buf.push(_frame(2))
    assert buf.try_read(3) is None
    assert len(buf) == 2
    assert buf.discarded == 0
    buf.push(_frame(3))
    assert _values(buf.try_read(3)) == [1, 2, 3]


def test_try_read_on_empty_buffer():
    assert InputBuffer("cam").try_read() is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None])
def test_invalid_n_rejected(bad):
    buf = InputBuffer("cam")
    with pytest.raises(ValueError, match="n must be"):
        buf.try_read(bad)


async def test_invalid_n_rejected_by_read():
    buf = InputBuffer("cam")
    with pytest.raises(ValueError, match="n must be"):
        await buf.read(0)


# ---- read -----------------------------------------------------------------------------


async def test_read_returns_at_once_when_frames_are_there():
    buf = InputBuffer("cam")
    for v in (1, 2, 3):
        buf.push(_frame(v))
    frames = await asyncio.wait_for(buf.read(2), WAIT)
    assert _values(frames) == [2, 3]
    assert len(buf) == 0


async def test_read_waits_for_frames_pushed_from_another_thread():
    buf = InputBuffer("cam")
    task = asyncio.create_task(buf.read(1))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not task.done()
    th = _push_later(buf, [42])
    frames = await asyncio.wait_for(task, WAIT)
    th.join(WAIT)
    assert _values(frames) == [42]


async def test_read_n_waits_for_all_n_frames():
    buf = InputBuffer("cam")
    buf.push(_frame(1))
    task = asyncio.create_task(buf.read(3))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not task.done()  # one is not enough
    th = _push_later(buf, [2, 3])
    frames = await asyncio.wait_for(task, WAIT)
    th.join(WAIT)
    assert _values(frames) == [1, 2, 3]
    assert len(buf) == 0


async def test_read_repeatedly_from_a_stream():
    buf = InputBuffer("cam")
    th = _push_later(buf, list(range(1, 21)), delay=0.005)
    seen: list[int] = []
    while not seen or seen[-1] < 20:
        frames = await asyncio.wait_for(buf.read(1), WAIT)
        seen.extend(_values(frames))
    th.join(WAIT)
    # Latest-n: always fresher than what came before, never a repeat.
    assert seen == sorted(set(seen))
    assert seen[-1] == 20


async def test_cancelled_read_leaves_buffer_usable():
    buf = InputBuffer("cam")
    task = asyncio.create_task(buf.read(1))
    await asyncio.sleep(0.02)  # started or not, the cancelled read must leave it usable
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    buf.push(_frame(5))
    assert _values(await asyncio.wait_for(buf.read(1), WAIT)) == [5]


async def test_read_n_above_capacity_still_works():
    buf = InputBuffer("cam", capacity=4)
    task = asyncio.create_task(buf.read(10))
    await asyncio.sleep(0.02)  # any turn of the loop starts the read, which grows the buffer
    th = _push_later(buf, list(range(1, 11)), delay=0.002)
    frames = await asyncio.wait_for(task, WAIT)
    th.join(WAIT)
    assert _values(frames) == list(range(1, 11))


def test_try_read_n_above_capacity_eventually_succeeds():
    buf = InputBuffer("cam", capacity=2)
    for v in range(5):
        buf.push(_frame(v))
    assert buf.try_read(5) is None  # only 2 were kept
    for v in range(10, 15):
        buf.push(_frame(v))
    assert _values(buf.try_read(5)) == [10, 11, 12, 13, 14]


# ---- close / reset --------------------------------------------------------------------


async def test_close_wakes_pending_read_with_buffer_closed():
    buf = InputBuffer("cam")
    task = asyncio.create_task(buf.read(2))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not task.done()
    th = threading.Thread(target=buf.close)
    th.start()
    with pytest.raises(BufferClosed, match="cam"):
        await asyncio.wait_for(task, WAIT)
    th.join(WAIT)
    assert buf.closed


async def test_read_after_close_raises_and_try_read_returns_none():
    buf = InputBuffer("cam")
    buf.push(_frame(1))
    buf.close()
    with pytest.raises(BufferClosed):
        await asyncio.wait_for(buf.read(1), WAIT)
    assert buf.try_read(1) is None
    assert len(buf) == 0


async def test_frames_pushed_while_closed_are_dropped():
    buf = InputBuffer("cam")
    buf.close()
    received = buf.received
    for v in range(3):
        buf.push(_frame(v))
    assert len(buf) == 0
    assert buf.received == received
    assert buf.try_read(1) is None
    with pytest.raises(BufferClosed):
        await asyncio.wait_for(buf.read(1), WAIT)
    # And they do not reappear after reopening.
    buf.reset()
    assert len(buf) == 0
    assert buf.try_read(1) is None


async def test_reset_reopens_with_no_leftovers():
    buf = InputBuffer("cam")
    for v in (1, 2, 3):
        buf.push(_frame(v))
    buf.close()
    buf.reset()
    assert not buf.closed
    assert len(buf) == 0
    assert buf.try_read(1) is None
    buf.push(_frame(9))
    assert _values(await asyncio.wait_for(buf.read(1), WAIT)) == [9]


def test_reset_while_open_drops_leftovers():
    buf = InputBuffer("cam")
    buf.push(_frame(1))
    buf.push(_frame(2))
    buf.reset()
    assert len(buf) == 0
    buf.push(_frame(3))
    assert _values(buf.try_read(1)) == [3]


async def test_read_after_reset_waits_again():
    buf = InputBuffer("cam")
    buf.close()
    buf.reset()
    task = asyncio.create_task(buf.read(1))
    await asyncio.sleep(0.05)  # a negative check: load can only keep it waiting longer
    assert not task.done()  # open and empty: waits instead of raising
    th = _push_later(buf, [4])
    assert _values(await asyncio.wait_for(task, WAIT)) == [4]
    th.join(WAIT)


# ---- memory ---------------------------------------------------------------------------


def test_memory_is_bounded():
    buf = InputBuffer("cam", capacity=8)
    for v in range(1000):
        buf.push(_frame(v))
        assert len(buf) <= 8
    assert len(buf) == 8
    assert buf.received == 1000
    assert buf.discarded == 992
    assert _values(buf.try_read(8)) == [v % 256 for v in range(992, 1000)]


def test_default_capacity_bounds_memory():
    buf = InputBuffer("cam")
    for v in range(1000):
        buf.push(_frame(v))
    assert len(buf) == InputBuffer.DEFAULT_CAPACITY


# ---- validation -----------------------------------------------------------------------


def test_push_wrong_dtype_raises_naming_track_and_dtype():
    buf = InputBuffer("webcam")
    with pytest.raises(ValueError) as info:
        buf.push(np.zeros((4, 6, 3), dtype=np.float32))
    message = str(info.value)
    assert "webcam" in message
    assert "float32" in message
    assert "(4, 6, 3)" in message
    assert len(buf) == 0


@pytest.mark.parametrize(
    "shape, detail",
    [((4, 6), "2 dimensions"), ((4, 6, 4), "4 channels"), ((4, 6, 1), "1 channels")],
)
def test_push_wrong_shape_raises_naming_track_and_shape(shape, detail):
    buf = InputBuffer("webcam")
    with pytest.raises(ValueError) as info:
        buf.push(np.zeros(shape, dtype=np.uint8))
    message = str(info.value)
    assert "webcam" in message
    assert str(shape) in message
    assert detail in message
    assert len(buf) == 0


def test_push_batch_rejected():
    buf = InputBuffer("webcam")
    with pytest.raises(ValueError, match="one frame at a time"):
        buf.push(np.zeros((2, 4, 6, 3), dtype=np.uint8))
    assert len(buf) == 0


def test_push_non_array_rejected():
    buf = InputBuffer("webcam")
    with pytest.raises(ValueError, match="webcam.*list"):
        buf.push([[[0, 0, 0]]])


def test_push_single_frame_batch_and_torch_tensor_accepted():
    buf = InputBuffer("webcam")
    buf.push(np.full((1, 4, 6, 3), 3, np.uint8))
    buf.push(torch.full((4, 6, 3), 4, dtype=torch.uint8))
    frames = buf.try_read(2)
    assert [f.shape for f in frames] == [(4, 6, 3), (4, 6, 3)]
    assert all(isinstance(f, np.ndarray) for f in frames)
    assert _values(frames) == [3, 4]


def test_audio_track_accepts_int16_and_rejects_others():
    buf = InputBuffer("mic", kind="audio")
    chunk = np.arange(960, dtype=np.int16)[None, :]
    buf.push(chunk)
    (got,) = buf.try_read(1)
    assert np.array_equal(got, chunk)
    with pytest.raises(ValueError, match="mic"):
        buf.push(np.zeros((1, 960), dtype=np.float32))


async def test_a_read_waiting_for_frames_says_so_and_starves_until_enough_arrive():
    buf = InputBuffer("webcam")
    waits = []
    buf.on_wait = lambda: waits.append(buf.starving)
    assert not buf.starving  # nobody reads
    buf.push(np.full((4, 6, 3), 1, np.uint8))
    reader = asyncio.ensure_future(buf.read(2))
    await asyncio.sleep(0.01)  # any turn of the loop runs the read to its wait
    assert waits == [True] and buf.starving  # one frame of the two it waits for
    buf.push(np.full((4, 6, 3), 2, np.uint8))
    assert not buf.starving
    assert _values(await reader) == [1, 2]
    assert waits == [True]  # it had what it needed: no second wait


def test_drain_hands_over_every_frame_held_without_counting_them_discarded():
    buf = InputBuffer("webcam")
    for value in (1, 2, 3):
        buf.push(np.full((4, 6, 3), value, np.uint8))
    assert _values(buf.drain()) == [1, 2, 3]
    assert buf.drain() == [] and buf.discarded == 0


# ---- batches ---------------------------------------------------------------------------


async def test_a_waiting_read_wakes_on_a_whole_batch_and_takes_its_latest_frame():
    buf = InputBuffer("cam")
    reader = asyncio.ensure_future(buf.read(1))
    await asyncio.sleep(0.01)  # any turn of the loop runs the read to its wait
    assert buf.starving
    th = threading.Thread(target=buf.push_all, args=([_frame(v) for v in (1, 2, 3, 4)],))
    th.start()
    assert _values(await asyncio.wait_for(reader, WAIT)) == [4]
    th.join(WAIT)
    assert buf.received == 4 and buf.discarded == 3


async def test_a_batch_with_a_bad_frame_lands_none_of_its_frames():
    # Every frame is checked before any lands: a read waiting meanwhile never sees the
    # first frames of a batch that later turns out to be refused.
    buf = InputBuffer("cam")
    reader = asyncio.ensure_future(buf.read(1))
    await asyncio.sleep(0.01)
    with pytest.raises(ValueError, match="'cam'"):
        buf.push_all([_frame(1), _frame(2), np.zeros((4, 6), np.uint8)])
    assert len(buf) == 0 and buf.received == 0 and buf.starving
    buf.push_all([_frame(5)])
    assert _values(await asyncio.wait_for(reader, WAIT)) == [5]


def test_a_batch_from_a_session_no_longer_attached_is_dropped_whole():
    buf = InputBuffer("cam")
    session, other = object(), object()
    buf.attach(session)
    buf.push_all([_frame(1), _frame(2)], owner=other)
    assert len(buf) == 0 and buf.discarded == 2
    buf.push_all([_frame(3), _frame(4)], owner=session)
    assert _values(buf.try_read(2)) == [3, 4]
