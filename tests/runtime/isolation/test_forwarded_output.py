"""`ForwardedOutput` short of slots: with every slot held by the media process's
views, an emit waits (polling the ring's slot states; no message says a slot was
freed) without blocking the model's loop, goes on when views die, and gives up on a
flush. The media process is played by a thread on the other end of a real socket."""

from __future__ import annotations

import asyncio
import gc
import mmap
import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest

from reactor_serve.runtime.isolation.forwarded_output import ForwardedOutput
from reactor_serve.runtime.isolation.frame_ring import FrameReader
from reactor_serve.runtime.isolation.process_channel import (
    ChannelClosed,
    ProcessChannel,
    channel_pair,
)
from reactor_serve.runtime.pacing.output_buffer import FrameItem

SHAPE = (16, 16, 3)  # one page per slot
CAPACITY = 2  # + SPARE_SLOTS: 6 slots


class _Media:
    """The media process's side: views every frame that crosses and holds it until
    told to let go; answers "placed" for each complete emit."""

    def __init__(self, channel: ProcessChannel) -> None:
        self.channel = channel
        self.reader = FrameReader()
        self.held: list[np.ndarray] = []
        self.values: list[int] = []
        self.ops: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                self._handle(self.channel.receive(self.reader))
        except ChannelClosed:
            pass

    def _handle(self, message: tuple) -> None:
        op = message[0]
        with self.changed:
            self.ops.append(op)
            if op == "emit":
                emit_id, part = message[1], message[-1]
                for video, *_ in part:
                    view = self.reader.view(video["main"])
                    self.held.append(view)
                    self.values.append(int(view[0, 0, 0]))
                if emit_id:
                    self.channel.send("placed", emit_id)
            self.changed.notify_all()

    def wait_for_frames(self, count: int) -> None:
        # A bound only against a hang; what arrives is asserted by the caller.
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.values) >= count, timeout=30)

    def let_go(self) -> None:
        with self.changed:
            self.held.clear()
        gc.collect()


class _Ends:
    def __init__(self) -> None:
        model_end, theirs = channel_pair()
        self.media = _Media(ProcessChannel(Connection(theirs.detach())))
        page = mmap.PAGESIZE
        slots = CAPACITY + ForwardedOutput.SPARE_SLOTS
        # Room for one ring (its slots and a page of states): no growing past it.
        self.output = ForwardedOutput(model_end, CAPACITY, 30, max_bytes=(slots + 1) * page)
        self.model_end = model_end
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        # The model process's channel reader: "placed" answers wake the emits.
        try:
            while True:
                message = self.model_end.receive(FrameReader())
                if message[0] == "placed":
                    self.output.placed(message[1])
        except ChannelClosed:
            pass

    def close(self) -> None:
        self.output.close()
        self.model_end.close()
        self.media.channel.close()


@pytest.fixture
def ends():
    made = _Ends()
    yield made
    made.close()


def _items(count: int) -> list[FrameItem]:
    return [FrameItem(video={"main": np.full(SHAPE, n + 1, np.uint8)}) for n in range(count)]


def test_an_emit_short_of_slots_waits_without_blocking_the_loop_and_goes_on_when_views_die(ends):
    slots = CAPACITY + ForwardedOutput.SPARE_SLOTS

    async def emit_while_the_media_holds_every_slot() -> int:
        emit = asyncio.create_task(ends.output.put(_items(slots + 4)))
        await asyncio.to_thread(ends.media.wait_for_frames, slots)
        ticks = 0
        # The emit waits for slots; the loop keeps running meanwhile.
        for _ in range(20):
            # A negative check: the emit cannot finish while every slot is held.
            await asyncio.sleep(0.01)
            ticks += 1
        assert not emit.done()
        assert len(ends.media.values) == slots
        ends.media.let_go()
        await asyncio.wait_for(emit, 30)
        return ticks

    assert asyncio.run(emit_while_the_media_holds_every_slot()) == 20
    assert ends.media.values == list(range(1, slots + 5))
    # The frames of the second part landed in the freed slots, intact.
    np.testing.assert_array_equal(ends.media.held[-1], np.full(SHAPE, slots + 4, np.uint8))
    assert "released" not in ends.media.ops


def test_a_blocking_emit_short_of_slots_gives_up_on_a_flush(ends):
    slots = CAPACITY + ForwardedOutput.SPARE_SLOTS
    outcome: list[bool] = []
    emitter = threading.Thread(
        target=lambda: outcome.append(ends.output.put_blocking(_items(slots + 4)))
    )
    emitter.start()
    ends.media.wait_for_frames(slots)
    assert emitter.is_alive() and outcome == []  # waiting for a slot
    ends.output.flush()
    emitter.join(timeout=30)
    assert outcome == [True]  # a flush ends an emit's wait, as in one process
    with ends.media.changed:
        assert ends.media.changed.wait_for(lambda: "flush" in ends.media.ops, timeout=30)
    assert len(ends.media.values) == slots  # the rest of the emit never crossed


def test_a_blocking_emit_short_of_slots_stops_when_asked(ends):
    slots = CAPACITY + ForwardedOutput.SPARE_SLOTS
    stop = threading.Event()
    outcome: list[bool] = []
    emitter = threading.Thread(
        target=lambda: outcome.append(
            ends.output.put_blocking(_items(slots + 1), should_stop=stop.is_set)
        )
    )
    emitter.start()
    ends.media.wait_for_frames(slots)
    stop.set()
    emitter.join(timeout=30)
    assert outcome == [False]
