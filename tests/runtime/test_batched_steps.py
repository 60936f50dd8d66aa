"""`@batched`: a model that steps its seats' sessions in one call (interface/batching.py,
runtime/batch_scheduler.py, runtime/kinds/batched.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
from paths import TEST_MODELS
from waits import until

from reactor_serve.interface import (
    InputField,
    InputState,
    ReactorModel,
    ReactorPipeline,
    VideoModel,
    batched,
)
from reactor_serve.runtime.isolation.model_process import ModelProcess
from reactor_serve.runtime.loading.model_spec import ModelSpecError, inspect_model
from reactor_serve.runtime.local_client import LocalClient


@pytest.fixture(autouse=True)
def _isolate_imports(isolated_imports):
    """Tests here load model directories; undo what that adds."""


@dataclass
class Level(InputState):
    level: int = InputField(default=40, ge=0, le=255, description="Pixel value")


class Levels(ReactorPipeline):
    state: Level
    fps = 30
    buffer_size = 4
    drop_stale_frames = True

    def load(self, config):
        self.sizes: list[int] = []  # (appended to by the batch: shared on purpose)

    @batched(max_size=8)
    def step(self, steps):
        time.sleep(0.005)
        return [np.full((8, 8, 3), s.model.state.level, np.uint8) for s in steps]

    def inference(self):  # never called for a batched model
        raise AssertionError("inference() ran for a @batched model")


class RunLoopLevels(ReactorModel):
    """A run-loop model, batched: its run() is not called."""

    state: Level
    fps = 30

    @batched()
    async def step(self, steps):
        return [np.full((8, 8, 3), s.model.state.level, np.uint8) for s in steps]

    async def run(self):
        raise AssertionError("run() ran for a @batched model")


class Failing(Levels):
    @batched(max_size=8)
    def step(self, steps):
        if any(s.model.state.level == 13 for s in steps):
            raise RuntimeError("unlucky level")
        return super().step(steps)


class Miscounting(Levels):
    @batched(max_size=8)
    def step(self, steps):
        return [np.zeros((8, 8, 3), np.uint8)] * (len(steps) + 1)


class Sparse(Levels):
    """Makes a frame only for sessions whose level is even."""

    def load(self, config):
        super().load(config)
        # Set once a step made no frame: from then on the test knows every frame the
        # odd session will ever get was already made.
        self.skipped = threading.Event()

    @batched(max_size=8)
    def step(self, steps):
        if any(s.model.state.level % 2 for s in steps):
            self.skipped.set()
        return [np.full((8, 8, 3), s.model.state.level, np.uint8)
                if s.model.state.level % 2 == 0 else None for s in steps]


async def shown(client: LocalClient, level: int, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while int((await client.next_frame(timeout=timeout)).image[0, 0, 0]) != level:
        assert loop.time() < deadline, f"level {level} was never shown"


async def connect_all(host):
    clients = [LocalClient(seat) for seat in host.seats]
    for client in clients:
        await client.connect()
    return clients


async def test_the_seats_are_stepped_together_each_with_its_own_state(host_of):
    host = host_of(Levels, seats=4)
    clients = await connect_all(host)
    try:
        for client, level in zip(clients, (10, 60, 110, 160)):
            client.send_command("set_level", {"level": level})
        for client, level in zip(clients, (10, 60, 110, 160)):
            await shown(client, level)
        before = host.batch_totals
        # Counted over a number of batches, not a span of time: a loaded machine makes
        # fewer of them, but each still steps every seat whose frame is due.
        await until(lambda: host.batch_totals.batches - before.batches >= 30,
                    "thirty batches of the four sessions")
        after = host.batch_totals
        batches, steps = after.batches - before.batches, after.steps - before.steps
        # Four sessions at the same fps: most calls step all four.
        assert steps / batches > 2.5, (batches, steps)
        for client in clients:
            stats = client.session.stats()
            assert stats["step_ms"] is not None and stats["step_ms"] >= 5
    finally:
        for client in clients:
            await client.close()


async def test_a_run_loop_model_with_an_async_batched_step(host_of):
    host = host_of(RunLoopLevels, seats=2)
    clients = await connect_all(host)
    try:
        clients[1].send_command("set_level", {"level": 200})
        await shown(clients[1], 200)
        await shown(clients[0], 40)
    finally:
        for client in clients:
            await client.close()


async def test_a_command_and_its_stale_frames_stay_in_their_own_session(host_of):
    host = host_of(Levels, seats=2)
    mover, still = await connect_all(host)
    try:
        await shown(still, 40)
        for level in range(50, 250, 20):
            # Frames queued when the command applies are what it makes stale.
            await until(lambda: mover.session.stats()["queue_depth"] > 0,
                        "frames queued for the moving session")
            mover.send_command("set_level", {"level": level})
            await asyncio.sleep(0.05)  # paces the commands; nothing is asserted on it
        await shown(mover, 230)
        assert mover.session.stats()["stale_dropped"] > 0
        assert still.session.stats()["stale_dropped"] == 0
        for _ in range(10):
            assert int((await still.next_frame(timeout=60)).image[0, 0, 0]) == 40
    finally:
        await mover.close()
        await still.close()


async def test_a_session_joining_and_leaving_never_stalls_the_others(host_of):
    host = host_of(Levels, seats=3)
    first, second = LocalClient(host.seats[0]), LocalClient(host.seats[1])
    await first.connect()
    await second.connect()
    try:
        for _ in range(3):
            joining = LocalClient(host.seats[2])
            await joining.connect()
            await joining.next_frame(timeout=60)
            await joining.close()
            # The others kept getting new frames all along.
            for client in (first, second):
                before = client.session.stats()["new_frames"]
                await client.next_frame(timeout=60)
                assert client.session.stats()["new_frames"] > before
        assert first.end_reason is None and second.end_reason is None
    finally:
        await first.close()
        await second.close()


async def test_a_failing_batch_ends_its_sessions_naming_the_step_and_the_model_goes_on(host_of):
    host = host_of(Failing, seats=2)
    doomed, other = await connect_all(host)
    doomed.send_command("set_level", {"level": 13})
    assert await doomed.wait_closed(timeout=60) == "error"
    assert "step()" in doomed.end_detail and "unlucky level" in doomed.end_detail
    # The other session was in the same batch, so it is told the same.
    await other.wait_closed(timeout=60)
    assert "unlucky level" in other.end_detail
    async with LocalClient(host.seats[0]) as again:
        await shown(again, 40)


async def test_a_step_that_miscounts_its_outputs_is_named(host_of):
    host = host_of(Miscounting, seats=2)
    async with LocalClient(host.seats[0]) as client:
        assert await client.wait_closed(timeout=60) == "error"
    assert "returned 2 outputs for 1 session step(s)" in client.end_detail


async def test_none_makes_no_frame_for_that_session_only(host_of):
    host = host_of(Sparse, seats=2)
    odd, even = await connect_all(host)
    try:
        odd.send_command("set_level", {"level": 41})
        await shown(even, 40)
        # Frames the odd session made before the command applied may still be on
        # their way to its client: counted from once the model stepped it at the odd
        # level (so it makes no more) and its queue has been presented or dropped.
        await until(host.model.skipped.is_set, "a step of the odd session at level 41")
        await until(lambda: odd.session.stats()["queue_depth"] == 0,
                    "the odd session's frames made before its command to be presented")
        made = odd.session.stats()["new_frames"]
        # A negative check: load can only make fewer frames in this window, never more.
        await asyncio.sleep(0.5)
        assert odd.session.stats()["new_frames"] == made
        assert all(int(f.image[0, 0, 0]) == 40 for f in odd.frames if f.is_new), \
            "a frame of the odd level reached its session"
        assert odd.end_reason is None
        odd.send_command("set_level", {"level": 42})
        await shown(odd, 42)
    finally:
        await odd.close()
        await even.close()


def test_one_batched_method_per_model_and_not_on_the_older_api():
    class Two(Levels):
        @batched()
        def other(self, steps):
            return steps

    with pytest.raises(ModelSpecError, match="one method may be @batched"):
        inspect_model(Two)

    class Old(VideoModel):
        @batched()
        def step(self, steps):
            return steps

        def start_session(self):
            pass

    with pytest.raises(ModelSpecError, match="cannot step sessions in a batch"):
        inspect_model(Old)
    with pytest.raises(TypeError, match="max_size"):
        batched(max_size=0)
    assert inspect_model(Levels).batch.max_size == 8
    assert inspect_model(Levels).batch.method_name == "step"


async def test_a_batched_model_in_a_model_process():
    process = ModelProcess(TEST_MODELS / "serve" / "batched_probe")
    await asyncio.to_thread(process.start)
    try:
        assert len(process.seats) == 2
        clients = [LocalClient(seat) for seat in process.seats]
        for client in clients:
            await client.connect()
        clients[0].send_command("set_level", {"level": 150})
        await shown(clients[0], 150)
        await shown(clients[1], 60)
        # Some batch steps both sessions: awaited, since a loaded machine may have
        # stepped each alone until now (each arrives on its own tick).
        await until(lambda: process.batch_totals.steps > process.batch_totals.batches,
                    "a batch that stepped both sessions")
        totals = process.batch_totals
        assert totals.batches > 0 and totals.steps > totals.batches
        for client in clients:
            await client.close()
    finally:
        await asyncio.to_thread(process.shutdown)


class ThreadCounting(Levels):
    """Sets torch's CPU threads in load() and records what its steps run with."""

    def load(self, config):
        import torch

        torch.set_num_threads(1)
        self.counts: list[int] = []

    @batched(max_size=8)
    def step(self, steps):
        import torch

        self.counts.append(torch.get_num_threads())
        return super().step(steps)


async def test_the_batch_runs_with_the_torch_threads_load_set(host_of):
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() == 1:
        pytest.skip("this machine's torch starts with one thread: nothing to tell apart")
    host = host_of(ThreadCounting, seats=2)
    async with LocalClient(host.seats[1]) as client:
        await client.next_frame(timeout=60)
    # (The step keeps its list on the loaded model: shared on purpose, and not named.)
    assert host.model.counts and set(host.model.counts) == {1}
