"""The shared-memory frame ring between real processes: frames written once by one
process are read as views by another, slots come back (through the ring's slot
states, with no message) when views die, rings are re-made on shape changes and
exhaustion, and no memory outlives the processes."""

from __future__ import annotations

import gc
import math
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing.connection import Connection

import numpy as np
import pytest
from dev_shm import dev_shm_entries
from paths import ROOT

from reactor_serve.runtime.isolation.frame_ring import (
    FrameReader,
    FrameWriter,
    RingAnnouncement,
    SlotRef,
    receive_announcement,
    send_announcement,
)


def _unique_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _mapped(name: str) -> list[str]:
    """Lines of this process's memory map that are rings of the writer `name`."""
    marker = f"memfd:reactor-frames-{name}-"
    with open("/proc/self/maps") as maps:
        return [line for line in maps if marker in line]


def _generations_mapped(name: str) -> set[str]:
    """The rings of writer `name` that this process maps (writer or reader side)."""
    return {line.rsplit("-", 1)[1].split()[0] for line in _mapped(name)}


def _pattern(shape, dtype, seed: int) -> np.ndarray:
    """A frame whose every element depends on `seed` and its position."""
    count = math.prod(shape)
    values = (np.arange(count, dtype=np.int64) * 7 + seed * 131) % 251
    if np.dtype(dtype).kind == "f":
        return (values / 7.0).astype(dtype).reshape(shape)
    return values.astype(dtype).reshape(shape)


def _assert_frames(views: list[np.ndarray], frames: list[np.ndarray]) -> None:
    # A function, so no loop variable outlives the comparison and holds a slot.
    assert len(views) == len(frames)
    for view, frame in zip(views, frames):
        assert view.dtype == frame.dtype and view.shape == frame.shape
        np.testing.assert_array_equal(view, frame)


class _Pipe:
    """A writer and a reader in this process, joined by a real socketpair Connection
    the way the model and media processes are."""

    def __init__(self, slots: int, max_bytes: int = 1 << 30) -> None:
        self.name = _unique_name()
        self.writer = FrameWriter(self.name, slots, max_bytes)
        self.reader = FrameReader()
        left, right = socket.socketpair()
        self.sending = Connection(left.detach())
        self.receiving = Connection(right.detach())
        self.announcements = 0

    def send(self, frame) -> SlotRef | None:
        result = self.writer.write(frame)
        if result is None:
            return None
        ref, announcement = result
        if announcement is not None:
            send_announcement(self.sending, announcement)
        self.sending.send(ref)
        return ref

    def receive_ref(self) -> SlotRef:
        """The next ref, attaching the ring announced before it (as the lead's reader
        thread does), without viewing it yet."""
        message = self.receiving.recv()
        if isinstance(message, RingAnnouncement):
            self.announcements += 1
            self.reader.attach(receive_announcement(self.receiving, message))
            message = self.receiving.recv()
        assert isinstance(message, SlotRef)
        return message

    def receive(self) -> np.ndarray:
        return self.reader.view(self.receive_ref())

    def round_trip(self, frame) -> np.ndarray:
        assert self.send(frame) is not None
        return self.receive()

    def give_back(self) -> None:
        """Dead views free their slots in the ring's states; the writer unmaps the
        superseded rings they emptied (as its next write would)."""
        gc.collect()
        self.writer.reclaim()

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
        self.sending.close()
        self.receiving.close()


@pytest.fixture
def pipe():
    pipes: list[_Pipe] = []

    def make(slots: int, max_bytes: int = 1 << 30) -> _Pipe:
        pipes.append(_Pipe(slots, max_bytes))
        return pipes[-1]

    yield make
    for made in pipes:
        made.close()


def test_arrays_of_each_kind_cross_equal(pipe):
    ring = pipe(slots=4)
    video = _pattern((480, 640, 3), np.uint8, 1)
    audio = _pattern((2, 960), np.int16, 2) - 100
    floats = _pattern((17, 5), np.float32, 3)
    strided = _pattern((480, 640, 3), np.uint8, 4)[::2, ::-1]

    views = [ring.round_trip(frame) for frame in (video, audio, floats, strided)]

    _assert_frames(views, [video, audio, floats, strided])
    # One ring for all of them: each fits the first frame's page-rounded slot.
    assert ring.announcements == 1
    assert views[0].flags.writeable


def test_torch_tensors_are_written_with_one_copy(pipe):
    import torch
    from torch.profiler import ProfilerActivity, profile

    ring = pipe(slots=3)
    contiguous = torch.from_numpy(_pattern((48, 64, 3), np.uint8, 5))
    permuted = torch.from_numpy(_pattern((3, 48, 64), np.uint8, 6)).permute(1, 2, 0)
    sliced = torch.from_numpy(_pattern((96, 64, 3), np.float32, 7))[::2]
    assert not permuted.is_contiguous() and not sliced.is_contiguous()

    for tensor in (contiguous, permuted, sliced):
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            assert ring.send(tensor) is not None
        ops = [event.name for event in profiled.events() if event.name.startswith("aten::")]
        # Straight into the slot: no contiguous()/clone()/to() temporary first.
        assert ops.count("aten::copy_") == 1, ops
        assert not {"aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to"} & set(ops)
        view = ring.receive()
        assert view.dtype == tensor.numpy().dtype and view.shape == tuple(tensor.shape)
        np.testing.assert_array_equal(view, tensor.numpy())


def test_tensors_and_arrays_that_cannot_be_shared_are_refused(pipe):
    import torch

    ring = pipe(slots=2)
    with pytest.raises(TypeError, match="bfloat16"):
        ring.writer.write(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="Python objects"):
        ring.writer.write(np.array([object()]))
    with pytest.raises(TypeError, match="list"):
        ring.writer.write([1, 2, 3])
    assert ring.writer.free_slots() == 2


_CHILD = r"""
import sys
import numpy as np
from multiprocessing.connection import Connection
from reactor_serve.runtime.isolation.frame_ring import FrameWriter, send_announcement

conn = Connection(int(sys.argv[1]))
writer = FrameWriter(sys.argv[2], slots=int(sys.argv[3]), max_bytes=int(sys.argv[4]))
while True:
    try:
        command = conn.recv()
    except EOFError:
        break
    if command[0] == "write":
        _, shape, seed = command
        values = (np.arange(int(np.prod(shape)), dtype=np.int64) * 7 + seed * 131) % 251
        result = writer.write(values.astype(np.uint8).reshape(shape))
        if result is None:
            conn.send(None)
            continue
        ref, announcement = result
        if announcement is not None:
            send_announcement(conn, announcement)
        conn.send(ref)
    elif command[0] == "free":
        # What the reader freed in the slot states; no release ever arrives here.
        writer.reclaim()
        conn.send(writer.free_slots())
    else:
        conn.send(("unexpected", command))
"""


class _ChildWriter:
    """A real child process that writes frames when asked; this process reads them."""

    def __init__(self, slots: int, max_bytes: int) -> None:
        self.name = _unique_name()
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno()), self.name, str(slots), str(max_bytes)],
            pass_fds=[theirs.fileno()],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.reader = FrameReader()

    def write(self, shape, seed: int) -> np.ndarray | None:
        self.conn.send(("write", shape, seed))
        message = self.conn.recv()
        if message is None:
            return None
        if isinstance(message, RingAnnouncement):
            self.reader.attach(receive_announcement(self.conn, message))
            message = self.conn.recv()
        return self.reader.view(message)

    def free_slots(self) -> int:
        """The child's free slots, once our dead views are collected: it learns of
        them from the slot states alone."""
        gc.collect()
        self.conn.send(("free",))
        return self.conn.recv()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        self.conn.close()


@pytest.fixture
def child_writer():
    children: list[_ChildWriter] = []

    def start(slots: int, max_bytes: int = 1 << 30) -> _ChildWriter:
        children.append(_ChildWriter(slots, max_bytes))
        return children[-1]

    yield start
    for child in children:
        child.kill()


def test_a_child_writes_and_views_hold_slots_until_they_die(child_writer):
    shape = (120, 160, 3)
    slot = math.ceil(math.prod(shape) / mmap.PAGESIZE) * mmap.PAGESIZE
    child = child_writer(slots=2, max_bytes=2 * slot + mmap.PAGESIZE)  # no room to grow

    first = child.write(shape, 1)
    second = child.write(shape, 2)
    assert child.write(shape, 3) is None  # both slots are held by our views

    del first
    assert child.free_slots() == 1
    third = child.write(shape, 3)
    assert third is not None
    # The slot that came back was the first one's; the second's is untouched.
    np.testing.assert_array_equal(second, _pattern(shape, np.uint8, 2))
    np.testing.assert_array_equal(third, _pattern(shape, np.uint8, 3))

    # Views derived from a view keep its slot: a slice, a reshape, a torch tensor.
    import torch

    derived = [second[10:20], third.reshape(-1, 3), torch.from_numpy(third[::2])]
    del second, third
    assert child.free_slots() == 0 and child.write(shape, 4) is None
    np.testing.assert_array_equal(derived[0], _pattern(shape, np.uint8, 2)[10:20])
    np.testing.assert_array_equal(derived[2].numpy(), _pattern(shape, np.uint8, 3)[::2])

    del derived[0]
    assert child.free_slots() == 1
    fourth = child.write(shape, 4)
    np.testing.assert_array_equal(fourth, _pattern(shape, np.uint8, 4))
    del derived[0]
    assert child.free_slots() == 0  # the torch tensor still holds the third's slot
    derived.clear()
    assert child.free_slots() == 1


def test_shape_change_and_exhaustion_make_new_generations(pipe):
    ring = pipe(slots=2)
    small_shape, large_shape = (8, 8, 3), (64, 64, 3)
    small = [ring.round_trip(_pattern(small_shape, np.uint8, seed)) for seed in (1, 2)]
    assert ring.announcements == 1

    # Exhausted (both slots held) and allowed to grow: a new ring of the same size.
    grown = ring.round_trip(_pattern(small_shape, np.uint8, 3))
    assert ring.announcements == 2
    # Larger than a slot: a ring sized for it.
    large = ring.round_trip(_pattern(large_shape, np.uint8, 4))
    assert ring.announcements == 3
    assert len(_generations_mapped(ring.name)) == 3

    # Older rings' views stay valid and correct after the new rings exist.
    _assert_frames(small, [_pattern(small_shape, np.uint8, seed) for seed in (1, 2)])
    np.testing.assert_array_equal(grown, _pattern(small_shape, np.uint8, 3))
    np.testing.assert_array_equal(large, _pattern(large_shape, np.uint8, 4))

    # A superseded ring is unmapped on both sides once all its views are gone: by
    # the reader with the last view, by the writer when it next writes.
    del small, grown
    gc.collect()
    assert len(_generations_mapped(ring.name)) == 3
    # A smaller frame fits the current ring's larger slots: no new generation.
    np.testing.assert_array_equal(
        ring.round_trip(_pattern(small_shape, np.uint8, 5)), _pattern(small_shape, np.uint8, 5)
    )
    assert ring.announcements == 3
    assert len(_generations_mapped(ring.name)) == 1
    np.testing.assert_array_equal(large, _pattern(large_shape, np.uint8, 4))


def test_write_returns_none_when_max_bytes_forbids_a_new_ring(pipe):
    page = mmap.PAGESIZE
    ring = pipe(slots=2, max_bytes=3 * page)  # room for one ring: 2 one-page slots, 1 of states
    held = [ring.round_trip(np.full(page, seed, np.uint8)) for seed in (1, 2)]
    assert ring.writer.free_slots() == 0
    assert ring.writer.write(np.zeros(page, np.uint8)) is None

    del held[0]
    ring.give_back()
    assert ring.writer.free_slots() == 1
    np.testing.assert_array_equal(ring.round_trip(np.full(page, 3, np.uint8)), np.full(page, 3))
    np.testing.assert_array_equal(held[0], np.full(page, 2))

    with pytest.raises(ValueError, match="max_bytes"):
        ring.writer.write(np.zeros(2 * page, np.uint8))  # 2 slots of 2 pages + states > 3 pages


def test_kill_9_of_the_writer_leaves_no_shared_memory(child_writer):
    before = dev_shm_entries()
    child = child_writer(slots=3)
    shape = (240, 320, 3)
    views = [child.write(shape, seed) for seed in (1, 2)]
    small = child.write((4, 4), 3)  # fits the same ring
    assert len(_generations_mapped(child.name)) == 1
    assert dev_shm_entries() == before

    child.kill()
    # The memory lives on in our mapping while our views do, unchanged.
    _assert_frames(views, [_pattern(shape, np.uint8, seed) for seed in (1, 2)])
    np.testing.assert_array_equal(small, _pattern((4, 4), np.uint8, 3))

    child.reader.close()
    del views, small
    gc.collect()
    assert _generations_mapped(child.name) == set()
    assert dev_shm_entries() == before


def test_without_memfd_an_anonymous_file_carries_the_frames(pipe, monkeypatch):
    # The macOS path (no os.memfd_create), exercised here on Linux.
    monkeypatch.delattr(os, "memfd_create")
    before = dev_shm_entries()
    ring = pipe(slots=2)
    frames = [_pattern((32, 32, 3), np.uint8, seed) for seed in (1, 2)]
    views = [ring.round_trip(frame) for frame in frames]
    _assert_frames(views, frames)
    assert dev_shm_entries() == before  # never a named entry, even while it is in use
    del views
    ring.give_back()
    assert ring.writer.free_slots() == 2


def test_refs_that_do_not_match_the_ring_are_refused(pipe):
    ring = pipe(slots=2)
    ref = ring.send(_pattern((16, 16), np.uint8, 1))
    view = ring.receive()
    with pytest.raises(ValueError, match="already has a view"):
        ring.reader.view(ref)  # a second owner would release the slot under the first
    for bad, problem in [
        (SlotRef(ref.generation, 2, (16, 16), "|u1"), "outside ring"),
        (SlotRef(ref.generation, 1, (4096, 2), "|u1"), "does not fit"),
        (SlotRef(ref.generation, 1, (-1, 16), "|u1"), "invalid shape"),
        (SlotRef(ref.generation, 1, (16, 16), "|O"), "Python objects"),
        (SlotRef(ref.generation, 1, (16, 16), "nonsense"), "unknown dtype"),
        (SlotRef(ref.generation + 1, 1, (16, 16), "|u1"), "not attached"),
    ]:
        with pytest.raises(ValueError, match=problem):
            ring.reader.view(bad)

    # A ref viewed before (its view dead, the release not yet at the writer) may
    # name a slot that holds a newer frame by the time it is viewed again.
    del view
    gc.collect()
    with pytest.raises(ValueError, match="stale"):
        ring.reader.view(ref)

    # Once a newer ring is attached with no refs of the older one due, refs of the
    # older one are refused: the writer never writes into a ring it has replaced.
    newer = ring.round_trip(_pattern((64, 64, 3), np.uint8, 2))
    with pytest.raises(ValueError, match="not attached"):
        ring.reader.view(SlotRef(ref.generation, 1, (16, 16), "|u1"))
    np.testing.assert_array_equal(newer, _pattern((64, 64, 3), np.uint8, 2))


def test_refs_viewed_after_a_newer_ring_was_attached_still_find_theirs(pipe):
    """The lead's reader thread attaches announcements as they arrive, while another
    thread views the refs that came before them later."""
    ring = pipe(slots=2)
    small, large = _pattern((8, 8, 3), np.uint8, 1), _pattern((64, 64, 3), np.uint8, 2)
    ring.send(small)
    ring.send(large)  # a new ring, announced after the small frame's ref
    late, newer = ring.receive_ref(), ring.receive_ref()
    assert ring.announcements == 2 and late.generation != newer.generation

    late_view, newer_view = ring.reader.view(late), ring.reader.view(newer)
    np.testing.assert_array_equal(late_view, small)
    np.testing.assert_array_equal(newer_view, large)
    assert len(_generations_mapped(ring.name)) == 2

    # The older ring goes on both sides once its view is gone.
    del late_view
    ring.give_back()
    assert _generations_mapped(ring.name) == {f"{newer.generation:x}"}
    np.testing.assert_array_equal(newer_view, large)


def test_an_older_ring_is_not_kept_for_refs_viewed_dropped_or_discarded(pipe):
    ring = pipe(slots=3)
    shape = (8, 8, 3)
    viewed = ring.round_trip(_pattern(shape, np.uint8, 1))
    discarded = ring.send(_pattern(shape, np.uint8, 2))
    dropped, _ = ring.writer.write(_pattern(shape, np.uint8, 3))
    ring.writer.release(dropped.generation, dropped.index)  # never sent: the caller dropped it
    del viewed
    gc.collect()

    ring.send(_pattern((64, 64, 3), np.uint8, 4))
    assert ring.receive_ref() == discarded
    newer = ring.receive()
    ring.writer.reclaim()
    assert len(_generations_mapped(ring.name)) == 2  # the discarded ref's slot is held
    ring.reader.discard(discarded)

    ring.give_back()
    assert len(_generations_mapped(ring.name)) == 1
    np.testing.assert_array_equal(newer, _pattern((64, 64, 3), np.uint8, 4))
    with pytest.raises(ValueError, match="not attached"):
        ring.reader.view(discarded)


def test_the_writer_ignores_unknown_and_repeated_releases(pipe):
    ring = pipe(slots=2)
    ref = ring.send(np.zeros(10, np.uint8))
    ring.writer.release(ref.generation + 1, 0)  # a ring from before a restart
    ring.writer.release(ref.generation, 5)
    assert ring.writer.free_slots() == 1
    ring.writer.release(ref.generation, ref.index)
    ring.writer.release(ref.generation, ref.index)
    assert ring.writer.free_slots() == 2


def test_views_that_outlive_the_reader_still_free_their_slots(pipe):
    ring = pipe(slots=2)
    view = ring.round_trip(np.zeros(10, np.uint8))
    ring.reader.close()
    np.testing.assert_array_equal(view, np.zeros(10))  # still valid
    assert ring.writer.free_slots() == 1
    del view
    gc.collect()
    assert ring.writer.free_slots() == 2  # a writer that lives on may use it again
    assert _generations_mapped(ring.name) != set()  # the writer still maps its ring
    ring.writer.close()
    assert _generations_mapped(ring.name) == set()


def test_a_view_in_a_reference_cycle_frees_its_slot_when_the_collector_runs(pipe):
    ring = pipe(slots=2)
    cycle: list = [ring.round_trip(np.ones(10, np.uint8))]
    cycle.append(cycle)
    del cycle
    assert ring.writer.free_slots() == 1
    # The finalizer runs inside the collector, here on another thread.
    collector = threading.Thread(target=gc.collect)
    collector.start()
    collector.join()
    assert ring.writer.free_slots() == 2


_CHILD_READER = r"""
import gc
import sys
from multiprocessing.connection import Connection
from reactor_serve.runtime.isolation.frame_ring import FrameReader, RingAnnouncement, receive_announcement

conn = Connection(int(sys.argv[1]))
reader = FrameReader()
views = []
while True:
    try:
        message = conn.recv()
    except EOFError:
        break
    if isinstance(message, RingAnnouncement):
        reader.attach(receive_announcement(conn, message))
    elif isinstance(message, tuple) and message and message[0] == "drop":
        del views[message[1]]
        gc.collect()
        conn.send("dropped")
    else:
        views.append(reader.view(message))
        conn.send(int(views[-1][0]))
"""


def test_a_reader_process_frees_slots_the_writer_process_sees_with_no_message():
    name = _unique_name()
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_READER, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    theirs.close()
    conn = Connection(ours.detach())
    page = mmap.PAGESIZE
    writer = FrameWriter(name, slots=3, max_bytes=4 * page)  # one ring, never grows
    try:
        for seed in (1, 2, 3):
            ref, announcement = writer.write(np.full(page, seed, np.uint8))
            if announcement is not None:
                send_announcement(conn, announcement)
            conn.send(ref)
            assert conn.recv() == seed  # viewed, and held, by the child
        assert writer.free_slots() == 0 and writer.write(np.zeros(page, np.uint8)) is None

        conn.send(("drop", 1))  # the child drops its view of the second frame
        assert conn.recv() == "dropped"
        # Nothing else came from the child: the slot state alone carries the release.
        assert not conn.poll(0.2)
        assert writer.free_slots() == 1
        ref, _ = writer.write(np.full(page, 4, np.uint8))
        assert ref.index == 1  # the freed slot, written again
        conn.send(ref)
        assert conn.recv() == 4

        # A reader killed while viewing frees nothing: its slots stay held.
        child.kill()
        child.wait(timeout=60)
        assert writer.free_slots() == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        conn.close()
        writer.close()
    assert _generations_mapped(name) == set()


def test_slots_freed_by_another_thread_while_writing_never_free_a_held_slot():
    """`write` on the model's thread while views die on another (as the media process's
    frames do), the writer polling for a free slot as `ForwardedOutput` does."""
    page = mmap.PAGESIZE
    name = _unique_name()
    writer = FrameWriter(name, slots=4, max_bytes=5 * page)  # never grows
    reader = FrameReader()
    refs: list[SlotRef | None] = []
    arrived = threading.Condition()
    mismatches: list[tuple[int, int]] = []
    frames = 1500

    def consume() -> None:
        held: list[tuple[np.ndarray, int]] = []
        for seed in range(frames):
            with arrived:
                arrived.wait_for(lambda: len(refs) > seed)
            held.append((reader.view(refs[seed]), seed % 251))
            if len(held) > 2:
                view, value = held.pop(0)
                if not (view == value).all():
                    mismatches.append((seed, value))
                del view
        held.clear()

    consumer = threading.Thread(target=consume)
    consumer.start()
    for seed in range(frames):
        waited_since = time.monotonic()
        while (result := writer.write(np.full(page, seed % 251, np.uint8))) is None:
            assert consumer.is_alive() and time.monotonic() - waited_since < 60, "no slot came back"
            time.sleep(0.0005)  # the poll interval of a wait with a deadline
        ref, announcement = result
        if announcement is not None:
            reader.attach(RingAnnouncement(announcement.generation, announcement.slot_bytes,
                                           announcement.slots, os.dup(announcement.fd)))
        with arrived:
            refs.append(ref)
            arrived.notify()
    consumer.join(timeout=60)
    assert not consumer.is_alive(), "the consumer never read every frame"
    assert mismatches == []
    gc.collect()
    assert writer.free_slots() == 4
    reader.close()
    writer.close()
    assert _generations_mapped(name) == set()
