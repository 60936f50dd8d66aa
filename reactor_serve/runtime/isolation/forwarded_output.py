"""`ForwardedOutput`: the model process's output port, forwarding to the media process.

The model host emits into it as into an `OutputBuffer`. Each video frame is written
once, straight into a shared-memory slot (a CUDA tensor is copied device-to-host into
the slot itself); the emit then travels as slot references, and returns when the
media process has queued it in its buffer, so `emit` keeps its backpressure. Audio
is small and travels in the message.

Slots come back when the media process's views of them die, through the ring's slot
states (see `frame_ring`): an emit short of slots polls them, sleeping between looks
(`SLOT_POLL_S`), since no message says when one is freed.

`flush()` and `restart()` start a new *epoch*: the media process discards any emit
of an older epoch still waiting for room, exactly as a flush discards the rest of a
waiting emit in one process.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any, Callable

from reactor_serve.runtime.isolation.frame_ring import (
    FrameWriter,
    RingAnnouncement,
    SlotRef,
)
from reactor_serve.runtime.isolation.process_channel import ProcessChannel
from reactor_serve.runtime.pacing.output_buffer import FrameItem, check_fps

__all__ = ["ForwardedOutput", "SeatLink"]


class SeatLink:
    """One seat's end of the model process's channel: what the seat's output port
    sends is tagged `("seat", seat, op, *args)` for the media process to route to
    that seat's buffer."""

    def __init__(self, channel: ProcessChannel, seat: int) -> None:
        self._channel = channel
        self.seat = seat

    def send(self, *message: Any) -> bool:
        return self._channel.send("seat", self.seat, *message)

    def send_ring(self, announcement: RingAnnouncement) -> bool:
        return self._channel.send_ring(announcement)


class ForwardedOutput:
    """An `OutputPort` whose buffer is in the media process."""

    # Slots beyond the buffer's capacity: the frame the client is shown (held until
    # the next one) and frames the encoder still holds.
    SPARE_SLOTS = 4
    # How long an emit short of slots sleeps between looks at the slot states: short
    # against a frame interval, long enough that waiting costs next to no CPU.
    SLOT_POLL_S = 0.003

    def __init__(
        self,
        channel: ProcessChannel | SeatLink,
        capacity: int,
        fps: float,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = 1 << 30,
        *,
        writer: FrameWriter | None = None,
        ring_lock: threading.Lock | None = None,
    ) -> None:
        self._channel = channel
        self.clock = clock
        self._target_fps = check_fps(fps)
        # Past `max_bytes` of rings, an emit waits for the media process to free slots.
        # Seats of one model process share one `writer` (the media process reads it
        # with one reader); `ring_lock`, shared with it, keeps each new ring's
        # announcement ahead of every ref into that ring, whichever seat sends first.
        self._writer = writer or FrameWriter(
            "reactor-frames", capacity + self.SPARE_SLOTS, max_bytes
        )
        self._owns_writer = writer is None
        self._ring_lock = ring_lock or threading.Lock()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._epoch = 0
        # Emits on their way, by id, to wake when the media process answers "placed".
        self._crossings: dict[int, _Crossing] = {}
        # record_emit() -> put(): when the model emitted, and its compute_time.
        self._recorded: dict[int, tuple[float, float | None]] = {}
        self.closed = False

    # ---- what the model calls (`self.output_buffer`) --------------------------------

    @property
    def target_fps(self) -> float:
        return self._target_fps

    def set_fps(self, fps: float) -> None:
        self._target_fps = check_fps(fps)
        self._channel.send("set_fps", self._target_fps)

    def flush(self) -> None:
        self._channel.send("flush", self._next_epoch())

    def drop_stale(self) -> None:
        self._channel.send("drop_stale", self._next_epoch())

    # ---- what the host calls ------------------------------------------------------------

    def restart(self) -> None:
        self._channel.send("restart", self._next_epoch())

    def set_monitoring(self, enabled: bool) -> None:
        self._channel.send("monitoring", enabled, self.clock())

    def record_emit(self, items: list[FrameItem], compute_time: float | None) -> None:
        # Sent with the emit itself (see _begin): the media process measures the rate.
        self._recorded[id(items)] = (self.clock(), compute_time)

    async def put(self, items: list[FrameItem], drop: bool = False) -> None:
        loop = asyncio.get_running_loop()
        placed = loop.create_future()
        crossing = self._begin(items, drop, lambda: loop.call_soon_threadsafe(_resolve, placed))
        try:
            while (outcome := self._advance(crossing)) is _SHORT:
                # Wait for a slot without holding the model loop: handlers run meanwhile.
                await asyncio.sleep(self.SLOT_POLL_S)
            if outcome is _SENT:
                await placed
        finally:
            self._end(crossing)

    def put_blocking(
        self,
        items: list[FrameItem],
        drop: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        placed = threading.Event()
        crossing = self._begin(items, drop, placed.set)
        try:
            while (outcome := self._advance(crossing)) is _SHORT:
                if should_stop():
                    return False
                time.sleep(self.SLOT_POLL_S)
            if outcome is _FAILED:
                return not should_stop()
            while not placed.wait(0.05):
                if should_stop() or self.closed:
                    return False
            return True
        finally:
            self._end(crossing)

    # ---- what the channel's reader calls --------------------------------------------

    def placed(self, emit_id: int) -> None:
        """The media process queued (or discarded) emit `emit_id`."""
        with self._lock:
            crossing = self._crossings.get(emit_id)
        if crossing is not None:
            crossing.wake()

    def close(self) -> None:
        """The media process is gone: wake every waiting emit."""
        with self._lock:
            self.closed = True
            waiting = [c.wake for c in self._crossings.values()]
        for wake in waiting:
            wake()
        if self._owns_writer:
            self._writer.close()

    # ---- the crossing -------------------------------------------------------------------

    def _next_epoch(self) -> int:
        with self._lock:
            self._epoch += 1
            return self._epoch

    def _begin(self, items: list[FrameItem], drop: bool, wake: Callable[[], None]) -> _Crossing:
        at, compute_time = self._recorded.pop(id(items), (self.clock(), None))
        with self._lock:
            crossing = _Crossing(next(self._ids), items, drop, self._epoch, at, compute_time, wake)
            self._crossings[crossing.emit_id] = crossing
        return crossing

    def _end(self, crossing: _Crossing) -> None:
        with self._lock:
            self._crossings.pop(crossing.emit_id, None)

    def _advance(self, crossing: _Crossing) -> object:
        """Write as many of the emit's frames into slots as there are free, and send
        them. _SENT: all sent (wait for "placed"); _SHORT: out of slots (look again
        after SLOT_POLL_S); _FAILED: nothing more will be placed (a flush
        came, or the media process is gone)."""
        items = crossing.items
        while crossing.position < len(items):
            # Unlocked reads: a flush or close landing just after is seen by the
            # next part, or by the media process, which discards an old epoch's emit.
            if self.closed or self._epoch != crossing.epoch:
                return _FAILED
            part: list[tuple[dict[str, SlotRef], dict[str, Any], tuple[Any, ...], dict[str, bytes]]] = []
            while crossing.position < len(items):
                written = self._write_item(items[crossing.position])
                if written is None:
                    break
                part.append(written)
                crossing.position += 1
            if not part:
                return _SHORT
            last = crossing.position == len(items)
            # The first part carries when the model emitted and how many frames the
            # emit has (the production rate); the last one the id to answer.
            sent = self._channel.send(
                "emit",
                crossing.emit_id if last else 0,
                crossing.epoch,
                crossing.at if crossing.first else None,
                crossing.compute_time,
                len(items),
                crossing.drop,
                part,
            )
            crossing.first = False
            if not sent:
                return _FAILED
        return _SENT

    def _write_item(
        self, item: FrameItem
    ) -> tuple[dict[str, SlotRef], dict[str, Any], tuple[Any, ...], dict[str, bytes]] | None:
        refs: dict[str, SlotRef] = {}
        for track, frame in item.video.items():
            with self._ring_lock:
                written = self._writer.write(frame)
                if written is not None and written[1] is not None:
                    self._channel.send_ring(written[1])
            if written is None:
                # This item's other tracks never cross: their slots go back now.
                for ref in refs.values():
                    self._writer.release(ref.generation, ref.index)
                return None
            refs[track] = written[0]
        return refs, item.audio, item.answers, item.metadata


_SENT, _SHORT, _FAILED = object(), object(), object()


class _Crossing:
    """One emit on its way to the media process."""

    __slots__ = ("emit_id", "items", "drop", "epoch", "at", "compute_time", "wake",
                 "position", "first")

    def __init__(
        self,
        emit_id: int,
        items: list[FrameItem],
        drop: bool,
        epoch: int,
        at: float,
        compute_time: float | None,
        wake: Callable[[], None],
    ) -> None:
        self.emit_id = emit_id
        self.items = items
        self.drop = drop
        self.epoch = epoch
        self.at = at
        self.compute_time = compute_time
        self.wake = wake
        self.position = 0
        self.first = True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
