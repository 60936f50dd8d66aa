"""Frames between two processes through shared memory: one write in, views out.

The writing process (`FrameWriter`) owns rings of equal-sized slots in anonymous
shared memory; the reading process (`FrameReader`) maps the same memory from a file
descriptor passed over a Unix socket and hands out numpy views of the slots. A slot
goes back to the writer when the last view of it (slices, reshapes,
`torch.from_numpy` included) dies.

Slots come back through the memory itself, not through messages: after its slots,
each ring has a page of slot states, one byte per slot, that both sides map. The
writer marks a slot held when it takes it; the reader's finalizer marks it free with
one store (no lock, no message: it may run on any thread, inside the garbage
collector too); the writer finds free slots by reading the states when it writes, and
unmaps a superseded ring once all its slots are free. A message per frame, and a
thread on each side to send and receive it, cost more than the frame's copy.

Why anonymous memory: a memfd (or, where there is none, an unnamed temporary file)
has no name anyone must remove, so the kernel frees it when the last descriptor and
mapping are gone, even after `kill -9` of either side. Named /dev/shm entries and
`multiprocessing.shared_memory` outlive crashes (or need a resource tracker process).

Protocol, in the order things must reach the reader:

1. `write()` returns `(ref, announcement)`; the announcement is not None on the first
   frame of a new ring (a new generation). Deliver it before the ref, even when the
   frame itself is dropped: `send_announcement(conn, announcement)` sends a
   `RingAnnouncement` (fd -1) as an ordinary message, then the fd by SCM_RIGHTS.
   A frame dropped before its ref is sent goes back with the writer's `release()`.
2. The reader's loop: `msg = conn.recv()`; if it is a `RingAnnouncement`,
   `reader.attach(receive_announcement(conn, msg))` (which must be the next thing read
   from that connection); if it is a `SlotRef`, `reader.view(ref)`.
3. When a slot's last view dies, the reader marks it free in the ring's states; the
   writer sees that at its next `write()` (or `free_slots()`): nothing is sent.
   A writer that waits for a slot polls (`free_slots()`, or `write()` again).

Refs may be viewed later than they arrive (after newer rings were attached): each
announcement lists the slots of older rings the writer still holds, so the reader
keeps an older ring mapped until the refs still to come for it are viewed (or
`discard`ed); after that, its views alone keep it mapped. A ref the caller will
never view must be `discard`ed, or its slot stays held and the reader keeps that ring
until `close()`.

A slot state is one byte, written by one side at a time (the writer only takes free
slots, the reader only frees slots it was given), so a plain store suffices; the
reader frees a slot only after its last view is gone, long after its last read of it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import mmap
import os
import socket
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "FrameReader",
    "FrameWriter",
    "RingAnnouncement",
    "SlotRef",
    "receive_announcement",
    "send_announcement",
    "torch_numpy_dtype",
]

_PAGE = mmap.PAGESIZE
# memfd names are limited to 249 bytes; the name only helps people reading
# /proc/<pid>/maps, so it is cut rather than refused.
_MEMFD_NAME_MAX = 249
# The one byte that carries the fd, so a misordered read is recognised as one.
_FD_MARKER = b"R"
# A slot's state byte. A new ring's memory is zero-filled, so every slot starts free;
# the reader frees by storing _FREE, and anything else reads as held.
_FREE = 0
_HELD = 1
_FREE_BYTE = bytes([_FREE])


class SlotRef(NamedTuple):
    """Where one written frame lies: small and picklable, it travels in a message (a
    tuple, because a frame's messages are pickled and unpickled on the hot path)."""

    generation: int
    index: int
    shape: tuple[int, ...]
    dtype: str  # numpy dtype str, e.g. "|u1", "<i2", "<f4"
    # Which write of the writer filled the slot: tells a ref still to be viewed from
    # one viewed already, whose slot may since have been written again.
    serial: int = 0


@dataclass
class RingAnnouncement:
    """A new ring the reader must map before it sees refs into it.

    Picklable except for `fd`, which only means something in the process that holds
    it; `send_announcement` sends it separately by SCM_RIGHTS.
    """

    generation: int
    slot_bytes: int
    slots: int
    fd: int
    # Older rings' slots the writer still held when it made this one,
    # {generation: {index: serial}}: viewed already, or refs still on their way.
    pending: dict[int, dict[int, int]] = dataclasses.field(default_factory=dict)


def _anonymous_memory(name: str, size: int) -> int:
    """A descriptor of `size` bytes of shared memory that no name keeps alive."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create(name[:_MEMFD_NAME_MAX], os.MFD_CLOEXEC)
    else:
        # macOS has no memfd: an already-unlinked temporary file is the same thing
        # once we hold its descriptor (tmpfs-backed where /dev/shm exists).
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryFile(prefix=name, dir=directory) as file:
            fd = os.dup(file.fileno())
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _new_generation() -> int:
    # Random rather than counted: after the writing process restarts, its rings
    # must not be mistaken for the old process's rings that the reader still maps.
    return int.from_bytes(os.urandom(8), "little") >> 1


def torch_numpy_dtype(torch_dtype: Any) -> np.dtype:
    """The numpy dtype a torch dtype is shared as; TypeError when it has none
    (bfloat16, say)."""
    # torch names its numpy-compatible dtypes as numpy does ("torch.uint8"), so no
    # tensor (and no torch op) is needed to find the slot's dtype.
    name = str(torch_dtype).removeprefix("torch.")
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(
            f"a torch tensor of dtype {torch_dtype} has no numpy equivalent to share; "
            f"convert it (e.g. .to(torch.float32)) before writing"
        ) from None


def _is_torch_tensor(frame: Any) -> bool:
    # A tensor can only exist if torch was imported, so this never imports torch.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(frame, torch.Tensor)


def _frame_layout(frame: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """The frame's shape, dtype and size in bytes."""
    if isinstance(frame, np.ndarray):
        dtype = frame.dtype
        if dtype.hasobject:
            raise TypeError(f"cannot share an array of dtype {dtype} (it holds Python objects)")
        return frame.shape, dtype, frame.nbytes
    if not _is_torch_tensor(frame):
        raise TypeError(f"expected a numpy array or a torch tensor, got {type(frame).__name__}")
    dtype = torch_numpy_dtype(frame.dtype)
    shape = tuple(int(n) for n in frame.shape)
    return shape, dtype, math.prod(shape) * dtype.itemsize


def _copy_into(slot: np.ndarray, frame: Any) -> None:
    """The one write: `frame`, whatever its strides or device, straight into `slot`."""
    if isinstance(frame, np.ndarray):
        np.copyto(slot, frame, casting="no")
    else:
        import torch

        # For a CUDA tensor this is one device-to-host copy into shared memory.
        torch.from_numpy(slot).copy_(frame.detach())


def _slot_bytes_for(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / _PAGE)) * _PAGE


def _ring_bytes(slot_bytes: int, slots: int) -> int:
    """A ring's memory: its slots, then a page (or more) of slot states."""
    return slot_bytes * slots + _slot_bytes_for(slots)


class _WriterRing:
    """One generation on the writing side: the memory, its slot states, and the
    serial of each slot's last write."""

    def __init__(self, name: str, slot_bytes: int, slots: int) -> None:
        self.generation = _new_generation()
        self.slot_bytes = slot_bytes
        self.slots = slots
        self.size = _ring_bytes(slot_bytes, slots)
        self.fd = _anonymous_memory(f"reactor-frames-{name}-{self.generation:x}", self.size)
        try:
            self.memory = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        # Where the state bytes start; read and written through the mmap itself, so
        # no array holds the mapping open when it is unmapped.
        self._states = slot_bytes * slots
        self._all_free = bytes(slots)
        self.serials = [0] * slots
        # Per slot, the array last written through it, (shape, dtype, array): a stream
        # of same-shaped frames makes no array per write.
        self._views: list[tuple[tuple[int, ...], np.dtype, np.ndarray] | None] = [None] * slots
        self.announced = False
        self.closed = False

    def take(self) -> int | None:
        """Mark a free slot held and return it; None when none is free. Lowest index
        first, so a lightly used ring touches few pages."""
        found = self.memory.find(_FREE_BYTE, self._states, self._states + self.slots)
        if found < 0:
            return None
        self.memory[found] = _HELD
        return found - self._states

    def give_back(self, index: int) -> None:
        self.memory[self._states + index] = _FREE

    def _state_bytes(self) -> bytes:
        return self.memory[self._states : self._states + self.slots]

    def free_count(self) -> int:
        return self._state_bytes().count(_FREE)

    def idle(self) -> bool:
        return self._state_bytes() == self._all_free

    def held(self) -> dict[int, int]:
        return {
            index: self.serials[index]
            for index, state in enumerate(self._state_bytes())
            if state != _FREE
        }

    def slot(self, index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        cached = self._views[index]
        if cached is not None and cached[0] == shape and cached[1] == dtype:
            return cached[2]
        if self.closed:
            raise RuntimeError("the frame writer was closed during this write")
        view = np.ndarray(shape, dtype, buffer=self.memory, offset=index * self.slot_bytes)
        self._views[index] = (shape, dtype, view)
        return view

    def unmap(self) -> None:
        self.closed = True
        self._views = [None] * self.slots
        try:
            self.memory.close()
        except BufferError:
            # A write on another thread still holds a view (only when close() races
            # write()); the mapping goes when that view dies, never under it.
            pass
        os.close(self.fd)


class FrameWriter:
    """The writing side: owns the rings, picks free slots, writes frames.

    Thread-safe: `write` (the model's thread), `release`, `free_slots`, `reclaim` and
    `close` may run on different threads; the reader frees slots from its process
    with no call here. Writes from several threads are safe too, but each write and
    the sending of its announcement and ref must then be serialised by the caller, so
    that an announcement reaches the reader before any ref into its ring.
    """

    def __init__(self, name: str, slots: int, max_bytes: int = 1 << 30) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.name = name
        self._slots = int(slots)
        self._max_bytes = int(max_bytes)
        # Never taken by a slot's release (the reader frees slots in the memory), so
        # a plain lock: a finalizer run on this thread while it holds it takes nothing.
        self._lock = threading.Lock()
        self._rings: dict[int, _WriterRing] = {}
        self._live_bytes = 0
        self._current: _WriterRing | None = None
        self._serial = 0
        self._closed = False

    def write(self, frame: Any) -> tuple[SlotRef, RingAnnouncement | None] | None:
        """Write `frame` (numpy array, or torch tensor on any device) into a free slot.

        Returns the ref and, on the first frame of a new ring, the announcement the
        reader must receive before the ref; None when no slot is free and `max_bytes`
        forbids a new ring (try again once the reader has freed one, or drop the
        frame). Raises ValueError when the frame is too large for `max_bytes` even
        with no other ring alive.
        """
        shape, dtype, nbytes = _frame_layout(frame)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"frame writer {self.name!r} is closed")
            taken = self._take(nbytes)
            if taken is None:
                return None
            ring, index = taken
            self._serial += 1
            serial = ring.serials[index] = self._serial
        # The copy runs outside the lock so other threads never wait for a frame's
        # copy; the slot is ours alone until the reader frees it.
        try:
            _copy_into(ring.slot(index, shape, dtype), frame)
        except BaseException:
            self.release(ring.generation, index)
            raise
        announcement = None
        if not ring.announced:
            with self._lock:
                if not ring.announced:
                    # Announced with its first successful write, so a failed copy
                    # never loses the announcement of the ring the next frame lands in.
                    ring.announced = True
                    announcement = self._announcement(ring)
        return SlotRef(ring.generation, index, shape, dtype.str, serial), announcement

    def _announcement(self, ring: _WriterRing) -> RingAnnouncement:
        pending = {
            generation: held
            for generation, older in self._rings.items()
            if older is not ring and (held := older.held())
        }
        return RingAnnouncement(ring.generation, ring.slot_bytes, ring.slots, ring.fd, pending)

    def _take(self, nbytes: int) -> tuple[_WriterRing, int] | None:
        """A slot for a frame of `nbytes`, marked held: in the current ring, or in a new
        one (a larger frame, or every slot held); the caller holds the lock."""
        current = self._current
        if current is not None and nbytes <= current.slot_bytes:
            index = current.take()
            if index is not None:
                if len(self._rings) > 1:
                    self._reclaim()
                return current, index
            slot_bytes = current.slot_bytes
        else:
            slot_bytes = _slot_bytes_for(nbytes)
        size = _ring_bytes(slot_bytes, self._slots)
        if size > self._max_bytes:
            raise ValueError(
                f"a frame of {nbytes} bytes needs a ring of {self._slots} slots of "
                f"{slot_bytes} bytes and their states, {size} bytes, more than "
                f"max_bytes={self._max_bytes}"
            )
        self._reclaim()
        if self._live_bytes + size > self._max_bytes:
            return None
        ring = _WriterRing(self.name, slot_bytes, self._slots)
        self._rings[ring.generation] = ring
        self._live_bytes += ring.size
        self._current = ring
        # The ring just superseded may have no frame out (a shape change).
        self._reclaim()
        index = ring.take()
        assert index is not None  # a new ring's slots are all free
        return ring, index

    def _reclaim(self) -> None:
        for generation, ring in list(self._rings.items()):
            if ring is not self._current and ring.idle():
                del self._rings[generation]
                self._live_bytes -= ring.size
                ring.unmap()

    def reclaim(self) -> None:
        """Unmap the superseded rings whose slots the reader has all freed (`write`
        does this itself; for a writer that has stopped writing)."""
        with self._lock:
            self._reclaim()

    def release(self, generation: int, index: int) -> None:
        """Free a slot whose ref will never reach the reader (a frame dropped before
        it was sent); unknown or already free slots are ignored. A slot whose ref was
        sent is freed by the reader, never here."""
        with self._lock:
            ring = self._rings.get(generation)
            if ring is not None and 0 <= index < ring.slots:
                ring.give_back(index)

    def free_slots(self) -> int:
        """How many frames fit without a new ring (`slots` before the first write), as
        the slot states say now: the reader frees slots at any time."""
        with self._lock:
            if self._closed:
                return 0
            return self._slots if self._current is None else self._current.free_count()

    def close(self) -> None:
        """Unmap every ring this side holds; the reader's views stay valid."""
        with self._lock:
            self._closed = True
            rings = list(self._rings.values())
            self._rings.clear()
            self._live_bytes = 0
            self._current = None
        for ring in rings:
            ring.unmap()


class _ReaderRing:
    """One generation on the reading side: the mapping and what became of its slots."""

    def __init__(self, announcement: RingAnnouncement, memory: mmap.mmap) -> None:
        self.generation = announcement.generation
        self.slot_bytes = announcement.slot_bytes
        self.slots = announcement.slots
        self.memory = memory
        self.states = announcement.slot_bytes * announcement.slots
        self.granted: set[int] = set()
        # Per slot, the serial of the last ref viewed or discarded.
        self.seen: dict[int, int] = {}
        # None while this is the attached ring; once superseded, the refs still to
        # come for it ({index: serial}), and it is forgotten when none are left.
        self.awaiting: dict[int, int] | None = None


class FrameReader:
    """The reading side: maps announced rings, hands out views.

    `attach`, `view`, `discard` and `close` may run on different threads (typically
    `attach` on the thread reading the connection and `view` where frames are used).
    A slot is freed, in the ring's states, by whichever thread drops its last view
    (the garbage collector's included), with no lock taken.
    """

    def __init__(self) -> None:
        # Never taken by a slot's release, which may run on a thread holding it.
        self._lock = threading.Lock()
        # The attached ring and the superseded ones that refs are still due for.
        self._rings: dict[int, _ReaderRing] = {}
        self._current: _ReaderRing | None = None
        self._closed = False

    def attach(self, announcement: RingAnnouncement) -> None:
        """Map the announced ring and close its fd. It takes new refs from now on;
        an older ring stays for the refs its `pending` says are still due."""
        fd = announcement.fd
        try:
            if announcement.slots < 1 or announcement.slot_bytes < 1:
                raise ValueError(
                    f"ring {announcement.generation}: slots and slot_bytes must be positive, "
                    f"got {announcement.slots} and {announcement.slot_bytes}"
                )
            size = _ring_bytes(announcement.slot_bytes, announcement.slots)
            actual = os.fstat(fd).st_size
            if actual < size:
                raise ValueError(
                    f"ring {announcement.generation}: {announcement.slots} slots of "
                    f"{announcement.slot_bytes} bytes and their states need {size} bytes, "
                    f"the memory has {actual}"
                )
            memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            if self._closed:
                raise RuntimeError("frame reader is closed")
            if announcement.generation in self._rings:
                raise ValueError(f"ring {announcement.generation} is already attached")
            for generation, ring in list(self._rings.items()):
                due = announcement.pending.get(generation, {})
                ring.awaiting = {
                    index: serial
                    for index, serial in due.items()
                    if ring.seen.get(index, -1) < serial
                }
                if not ring.awaiting:
                    # Its views (each view's ctypes owner references the mmap) keep
                    # the mapping exactly as long as they live; it is never closed
                    # under one.
                    del self._rings[generation]
            self._current = _ReaderRing(announcement, memory)
            self._rings[announcement.generation] = self._current

    def view(self, ref: SlotRef) -> np.ndarray:
        """A writable view of the frame `ref` names; the slot is released when this
        view and every view derived from it are gone. One view per ref."""
        with self._lock:
            ring, dtype, count = self._take(ref)
            ring.granted.add(ref.index)
        nbytes = count * dtype.itemsize
        # Per grant, a ctypes owner of just this slot: numpy collapses view bases onto
        # it and torch.from_numpy keeps the array (so the owner) alive, so it dies only
        # with the last derived view, and its finalizer is the release.
        owner = (ctypes.c_char * max(nbytes, 1)).from_buffer(
            ring.memory, ref.index * ring.slot_bytes
        )
        finalizer = weakref.finalize(owner, _free_slot, ring, ref.index)
        # A view alive at interpreter exit is not a release the writer can act on.
        finalizer.atexit = False
        return np.frombuffer(owner, dtype=dtype, count=count).reshape(ref.shape)

    def discard(self, ref: SlotRef) -> None:
        """Give back a ref that will never be viewed (a dropped frame): its slot is
        released at once, and an older ring is not kept waiting for it."""
        with self._lock:
            ring, _, _ = self._take(ref)
        ring.memory[ring.states + ref.index] = _FREE

    def _take(self, ref: SlotRef) -> tuple[_ReaderRing, np.dtype, int]:
        """Check `ref` against its ring and mark it seen; the caller holds the lock."""
        if self._closed:
            raise RuntimeError("frame reader is closed")
        ring = self._rings.get(ref.generation)
        if ring is None:
            raise ValueError(
                f"ref names ring {ref.generation}, which is not attached (or is superseded "
                f"and has no refs due)"
            )
        if not 0 <= ref.index < ring.slots:
            raise ValueError(
                f"slot {ref.index} is outside ring {ring.generation} of {ring.slots} slots"
            )
        try:
            dtype = np.dtype(ref.dtype)
        except TypeError:
            raise ValueError(f"ref has an unknown dtype {ref.dtype!r}") from None
        if dtype.hasobject:
            raise ValueError(f"ref has dtype {ref.dtype!r}, which holds Python objects")
        if any(not isinstance(n, int) or n < 0 for n in ref.shape):
            raise ValueError(f"ref has an invalid shape {ref.shape!r}")
        count = math.prod(ref.shape)
        nbytes = count * dtype.itemsize
        if nbytes > ring.slot_bytes:
            raise ValueError(
                f"a {ref.shape} {dtype} frame ({nbytes} bytes) does not fit a slot of "
                f"{ring.slot_bytes} bytes"
            )
        if ref.index in ring.granted:
            raise ValueError(f"slot {ref.index} of ring {ring.generation} already has a view")
        if ref.serial <= ring.seen.get(ref.index, -1):
            # Viewed (and released) before: the slot may hold a newer frame by now.
            raise ValueError(
                f"stale ref: slot {ref.index} of ring {ring.generation} was viewed already"
            )
        ring.seen[ref.index] = ref.serial
        if ring.awaiting is not None:
            if ring.awaiting.get(ref.index, ref.serial + 1) <= ref.serial:
                del ring.awaiting[ref.index]
            if not ring.awaiting:
                del self._rings[ring.generation]
        return ring, dtype, count

    def close(self) -> None:
        """Forget the mappings; outstanding views stay valid until they die (and still
        free their slots: a writer that lives on may use them again)."""
        with self._lock:
            self._closed = True
            self._rings.clear()
            self._current = None


def _free_slot(ring: _ReaderRing, index: int) -> None:
    """A view's finalizer: its slot goes back to the writer. Two stores and no lock:
    it may run inside the garbage collector, on a thread holding any lock."""
    # Ungranted first: once the state says free, the writer may fill the slot again
    # and its next ref may be viewed at once.
    ring.granted.discard(index)
    ring.memory[ring.states + index] = _FREE


def _socket_of(conn: Any) -> socket.socket:
    # A duplicate descriptor of the connection's socket, so closing it leaves the
    # connection open.
    return socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)


def send_announcement(conn: Any, announcement: RingAnnouncement) -> None:
    """Send `announcement` over a `multiprocessing.connection.Connection` on a Unix
    socket: the metadata as one ordinary message (a `RingAnnouncement` with fd -1),
    then the fd by SCM_RIGHTS. Hold the connection's send lock around the call if other
    threads send on it. The fd stays the writer's (it is open while the ring lives)."""
    conn.send(dataclasses.replace(announcement, fd=-1))
    with _socket_of(conn) as sock:
        socket.send_fds(sock, [_FD_MARKER], [announcement.fd])


def receive_announcement(conn: Any, metadata: RingAnnouncement) -> RingAnnouncement:
    """The announcement whose metadata `conn.recv()` just returned, with the fd read
    from `conn` (the next thing on it). The caller owns the fd; `attach` closes it."""
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    with _socket_of(conn) as sock:
        message, fds, _, _ = socket.recv_fds(sock, len(_FD_MARKER), 1, flags)
    if message != _FD_MARKER or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ConnectionError(
            f"expected the fd of ring {metadata.generation} after its announcement, "
            f"got {message!r} with {len(fds)} descriptors"
        )
    if not flags:
        os.set_inheritable(fds[0], False)
    return dataclasses.replace(metadata, fd=fds[0])
