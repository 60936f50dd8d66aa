"""Setters coalesce, newest value wins; events stay bounded (issue 19, item 4)."""

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np
from conftest import connected

from reactor_serve.interface import (
    InputField,
    InputState,
    Output,
    ReactorModel,
    ReactorPipeline,
    Video,
    event,
)
from reactor_serve.runtime.command_queue import CommandQueue

# ---- the queue itself -------------------------------------------------------------


def test_a_setter_replaces_the_waiting_value_of_its_field_and_goes_to_the_back():
    queue = CommandQueue()
    assert queue.put("x=1", "x") is None
    assert queue.put("poke", None) is None
    assert queue.put("y=1", "y") is None
    assert queue.put("x=2", "x") == "x=1"
    # The newest x applies after the event sent before it, never before.
    assert list(queue) == ["poke", "y=1", "x=2"]
    assert queue.coalesced == 1
    assert "x" in queue and "z" not in queue and "poke" not in queue
    assert [queue.popleft() for _ in range(len(queue))] == ["poke", "y=1", "x=2"]
    assert not queue


def test_unkeyed_items_are_all_kept_in_order():
    queue = CommandQueue()
    for i in range(5):
        queue.put(i)
    assert list(queue) == [0, 1, 2, 3, 4] and queue.coalesced == 0


def test_a_flood_of_one_field_holds_one_item():
    queue = CommandQueue()
    for i in range(100_000):
        queue.put(i, "brightness")
    assert len(queue) == 1 and queue.popleft() == 99_999
    assert queue.coalesced == 99_999


def test_clear_hands_back_what_waited():
    queue = CommandQueue()
    queue.put("a", "x")
    queue.put("b")
    assert queue.clear() == ["a", "b"]
    assert len(queue) == 0
    try:
        queue.popleft()
    except IndexError:
        pass
    else:
        raise AssertionError("popleft on an empty queue must raise IndexError")


# ---- under the session engine -------------------------------------------------------


@dataclass
class Shade(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness")


@dataclass
class Picture(Output):
    main_video: Video


class SlowShader(ReactorPipeline):
    """Two blocks a second: commands apply only between these slow yields."""

    state: Shade
    output: Picture
    fps = 4
    buffer_size = 2

    def load(self, config):
        self.applied = []
        self.block_started = threading.Event()

    def inference(self):
        while True:
            self.applied.append(self.state.brightness)
            self.block_started.set()
            time.sleep(0.5)
            yield np.full((2, 8, 8, 3), int(self.state.brightness * 100), np.uint8)


class PokedShader(SlowShader):
    @event(name="poke", description="Not idempotent")
    def poke(self):
        pass


class ShadedLoop(ReactorModel):
    state: Shade
    output: Picture
    fps = 30

    def load(self, config):
        self.pokes = 0

    @event(name="poke", description="Counted, not idempotent")
    def poke(self):
        self.pokes += 1

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                await self.emit(Picture(main_video=np.zeros((8, 8, 3), np.uint8)))
                await asyncio.sleep(1 / self.fps)


async def wait_until(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # the poll interval of a wait with a deadline


async def next_block(model):
    """Wait until the model starts a fresh block: its slow yield is ahead of it."""
    model.block_started.clear()
    assert await asyncio.to_thread(model.block_started.wait, 60), "no block started"


def errors_of(client):
    return [m["data"]["data"] for m in client.messages if m["data"]["type"] == "commandError"]


async def test_a_slow_pipeline_under_a_60_hz_slider_ends_on_the_released_value(host_of):
    host = host_of(SlowShader)
    async with connected(host) as client:
        # Three seconds of dragging at 60 Hz: 180 values, far past the 64 the queue
        # held before. The drag is paced by the model's blocks (what a 60 Hz slider
        # sends during each one, sent as the block starts), not by the clock, so each
        # block's worth lands while that block is still running, however loaded the
        # machine: the pipeline then applies one value of each (6, and the release).
        values = [round(0.01 * (i % 150), 2) for i in range(180)] + [0.37]
        for start in range(0, 180, 30):
            await next_block(host.model)
            for value in values[start:start + 30]:
                client.send_command("set_brightness", {"brightness": value})
        client.send_command("set_brightness", {"brightness": values[-1]})
        await wait_until(lambda: host.model.applied[-1:] == [0.37], what="the released value")
        assert errors_of(client) == []
        # Only the values a block started with were applied: the rest coalesced.
        assert len(host.model.applied) < 20
        assert client.session.commands_coalesced >= len(values) - len(host.model.applied)
        assert client.session.stats()["commands_coalesced"] == client.session.commands_coalesced
        assert not client.closed


async def test_a_burst_of_setters_past_the_queue_ends_on_the_last_value_run_loop(host_of):
    host = host_of(ShadedLoop)
    async with connected(host) as client:
        for i in range(1000):
            client.send_command("set_brightness", {"brightness": 0.5 + (i % 7) * 0.1})
        client.send_command("set_brightness", {"brightness": 0.25})
        await wait_until(lambda: host.model.state.brightness == 0.25, what="the last value")
        assert errors_of(client) == []


async def test_events_stay_bounded_beside_coalescing_setters(host_of):
    # Events apply between the 0.5 s yields too, so a flood of them fills the queue.
    host = host_of(PokedShader)
    async with connected(host) as client:
        # All of it lands while one block runs, whatever the machine's load.
        await next_block(host.model)
        for _ in range(100):
            client.send_command("poke")
        for i in range(100):
            client.send_command("set_brightness", {"brightness": i / 100})
        await wait_until(lambda: host.model.applied[-1:] == [0.99], what="the last value")
        errors = errors_of(client)
        assert {e["errors"][0]["rule"] for e in errors} == {"queue_full"}
        assert all(e["command"] == "poke" for e in errors)
        assert len(errors) == 100 - host.MAX_QUEUED_COMMANDS


async def test_a_superseded_ticket_is_never_answered_and_the_newest_is(host_of):
    host = host_of(SlowShader)
    async with connected(host) as client:
        session = client.session
        answered = []
        client.on_frame = lambda received: answered.extend(
            a.ticket.id for a in received.frame.answers
        )
        # Both land while a block that just started sleeps: the second supersedes
        # the first.
        await next_block(host.model)
        session.command("set_brightness", {"brightness": 0.4}, "first")
        session.command("set_brightness", {"brightness": 0.6}, "second")
        await wait_until(lambda: "second" in answered, what="the newest id answered")
        # Two more blocks, counted by the model, and their frames presented: nothing
        # answers the first.
        blocks = len(host.model.applied)
        await wait_until(lambda: len(host.model.applied) >= blocks + 2, what="two more blocks")
        await client.next_frame(timeout=60)
        assert "first" not in answered
        assert session.commands_coalesced == 1
        # The answer rides the frame made after the newest value, and on to the client.
        assert client.frames[-1].image.max() == 60
