"""ReactorPipeline under the session engine: lifecycle, state, commands, errors."""

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import connected
from emit_reports import compute_times_reported

from reactor_serve.interface import (
    BufferClosed,
    Idle,
    Input,
    InputField,
    InputState,
    ModelMessage,
    Output,
    ReactorPipeline,
    Video,
    event,
)
from reactor_serve.interface import (
    connected as on_connect,
)
from reactor_serve.interface import (
    disconnected as on_disconnect,
)
from reactor_serve.runtime.local_client import LocalClient


@dataclass
class PipeOut(Output):
    main_video: Video


@dataclass
class PipeState(InputState):
    level: int = InputField(default=10, ge=0, le=250, description="Pixel level")
    mode: str = InputField(default="flat", choices=["flat", "ramp"])
    _secret: int = 0


@dataclass
class Progress(ModelMessage):
    step: int


def level_frame(level, n=1):
    return np.full((n, 8, 8, 3), level, dtype=np.uint8)


class LifecyclePipeline(ReactorPipeline):
    state: PipeState
    output: PipeOut

    def load(self, config):
        self.log = []
        self.generators = 0
        self.limit = config.get("limit")

    @on_connect
    def hello(self):
        self.log.append(("connected", self.connected.is_set()))

    @on_disconnect
    async def bye(self):
        self.log.append(("disconnected", self.connected.is_set()))

    def inference(self):
        self.generators += 1
        self.log.append(("generator", self.generators))
        count = 0
        try:
            while self.limit is None or count < self.limit:
                count += 1
                time.sleep(0.005)
                yield PipeOut(main_video=level_frame(self.state.level))
        finally:
            self.log.append(("closed", self.generators))


async def test_generator_created_after_connected_hook_and_closed_on_disconnect(host_of):
    host = host_of(LifecyclePipeline)
    model = host.model
    async with connected(host) as client:
        frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 10
        assert model.log[:2] == [("connected", True), ("generator", 1)]
    assert ("closed", 1) in model.log
    assert model.log[-1] == ("disconnected", False)
    assert model.log.index(("closed", 1)) < model.log.index(("disconnected", False))
    assert client.end_reason == "client_closed"


async def test_generator_restarts_when_it_returns_while_connected(host_of):
    host = host_of(LifecyclePipeline, {"limit": 2})
    async with connected(host) as client:
        for _ in range(8):
            await client.next_frame(timeout=60)
        assert host.model.generators >= 3
        assert ("closed", 1) in host.model.log


async def test_state_is_fresh_per_connection_and_setter_changes_output(host_of):
    host = host_of(LifecyclePipeline)
    async with connected(host) as client:
        client.send_command("set_level", {"level": 200})
        for _ in range(20):
            frame = await client.next_frame(timeout=60)
            if frame.image[0, 0, 0] == 200:
                break
        assert frame.image[0, 0, 0] == 200
        assert host.model.state.level == 200
    async with connected(host) as client:
        frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 10
        assert host.model.state.level == 10


async def test_output_flushed_on_disconnect_so_next_client_sees_no_stale_frames(host_of):
    host = host_of(LifecyclePipeline)
    async with connected(host) as client:
        client.send_command("set_level", {"level": 99})
        while (await client.next_frame(timeout=60)).image[0, 0, 0] != 99:
            pass
    assert host.output_buffer.depth() == 0
    async with connected(host) as client:
        first = await client.next_frame(new=False, timeout=60)
        # Black or the new session's default, never the last client's level.
        assert first.image[0, 0, 0] in (0, 10)


async def test_bad_commands_get_command_error_and_change_nothing(host_of):
    host = host_of(LifecyclePipeline)
    async with connected(host) as client:
        await client.next_frame(timeout=60)
        bad = [
            ("set_level", {"level": 300}, "level", "le=250"),
            ("set_level", {"level": "high"}, "level", "type=int"),
            ("set_mode", {"mode": "wavy"}, "mode", "choices=['flat', 'ramp']"),
            ("set_level", {"level": 5, "extra": 1}, "extra", "unknown"),
            ("set__secret", {"_secret": 1}, None, "unknown_command"),
            ("explode", {}, None, "unknown_command"),
        ]
        for name, data, field, rule in bad:
            mark = len(client.messages)
            client.send_command(name, data)
            error = await client.next_message("commandError", after=mark, timeout=60)
            assert error["data"]["command"] == name
            assert error["data"]["errors"][0]["rule"] == rule
            assert error["data"]["errors"][0]["field"] == field
        assert host.model.state.level == 10
        assert host.model.state.mode == "flat"
        assert (await client.next_frame(timeout=60)).image[0, 0, 0] == 10
        assert client.session.stats()["commands_rejected"] == len(bad)


async def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # the poll interval of a wait with a deadline


class ConsistencyPipeline(ReactorPipeline):
    state: PipeState

    def load(self, config):
        self.pairs = []

    async def inference(self):
        while True:
            first = self.state.level
            await asyncio.sleep(0.002)  # handlers could interleave here if allowed
            time.sleep(0.002)
            second = self.state.level
            self.pairs.append((first, second))
            yield level_frame(second)


class SyncConsistencyPipeline(ConsistencyPipeline):
    def inference(self):
        while True:
            first = self.state.level
            time.sleep(0.004)
            second = self.state.level
            self.pairs.append((first, second))
            yield level_frame(second)


@pytest.mark.parametrize("model_cls", [ConsistencyPipeline, SyncConsistencyPipeline])
async def test_state_never_changes_inside_an_iteration(host_of, model_cls):
    host = host_of(model_cls)
    async with connected(host) as client:
        await client.next_frame(timeout=60)
        for value in range(1, 120):
            client.send_command("set_level", {"level": value})
            await asyncio.sleep(0.001)  # paces the commands; nothing is asserted on it
            if value % 30 == 0:
                # Some iterations run with what was sent so far, however loaded the
                # machine: the model's own record says when.
                await _until(lambda: any(first == value for first, _ in host.model.pairs),
                             f"an iteration that began at level {value}")
        while (await client.next_frame(timeout=60)).image[0, 0, 0] != 119:
            pass
    pairs = host.model.pairs
    assert len({p[0] for p in pairs}) > 3, "commands were applied while running"
    assert all(a == b for a, b in pairs), [p for p in pairs if p[0] != p[1]][:5]


class EventPipeline(ReactorPipeline):
    state: PipeState

    def load(self, config):
        self.in_iteration = False
        self.seen_inside = []

    @event(name="set_level", description="Replaces the generated setter")
    def custom_level(self, level: int = InputField(default=0, ge=0, le=100)):
        self.seen_inside.append(self.in_iteration)
        self.state.level = level * 2

    @event(name="reset", description="Back to defaults")
    async def reset(self):
        self.seen_inside.append(self.in_iteration)
        self.state.level = 1

    def inference(self):
        while True:
            self.in_iteration = True
            time.sleep(0.003)
            level = self.state.level
            self.in_iteration = False
            yield level_frame(level)


async def test_events_replace_setters_and_run_between_yields(host_of):
    host = host_of(EventPipeline)
    spec = host.spec.commands
    assert spec["set_level"].kind == "event"
    assert spec["set_level"].params[0].le == 100
    async with connected(host) as client:
        client.send_command("set_level", {"level": 40})
        while (await client.next_frame(timeout=60)).image[0, 0, 0] != 80:
            pass
        mark = len(client.messages)
        client.send_command("set_level", {"level": 101})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["rule"] == "le=100"
        client.send_command("reset")
        while (await client.next_frame(timeout=60)).image[0, 0, 0] != 1:
            pass
    assert host.model.seen_inside and not any(host.model.seen_inside)


class IdlePipeline(ReactorPipeline):
    state: PipeState

    def load(self, config):
        self.idles = 0

    async def inference(self):
        while self.state.mode != "ramp":
            self.idles += 1
            yield Idle if self.idles % 2 else None
        step = 0
        while True:
            step += 1
            await self.send(Progress(step=step))
            yield level_frame(step % 200, n=3)


async def test_idle_and_none_emit_nothing_then_batches_and_messages_flow(host_of):
    host = host_of(IdlePipeline)
    driver = host._driver
    idle_wait = driver._idle_wait
    waits = []

    async def counted_idle_wait(*args, **kwargs):
        waits.append(args)
        await idle_wait(*args, **kwargs)

    driver._idle_wait = counted_idle_wait
    async with connected(host) as client:
        for _ in range(5):
            frame = await client.next_frame(new=False, timeout=60)
            assert not frame.is_new and frame.image.max() == 0
        await _until(lambda: host.model.idles >= 2, "a second idle iteration")
        # Idle iterations wait for input instead of spinning: every one but the one
        # under way went through the driver's wait (counted, not timed).
        assert host.model.idles <= len(waits) + 1, (host.model.idles, len(waits))
        client.send_command("set_mode", {"mode": "ramp"})
        progress = await client.next_message("progress", scope="application", timeout=60)
        assert progress == {"type": "progress", "data": {"step": 1}}
        frame = await client.next_frame(timeout=60)
        assert frame.image.shape == (8, 8, 3) and frame.image[0, 0, 0] > 0


class TimedPipeline(ReactorPipeline):
    def inference(self):
        while True:
            time.sleep(0.03)
            yield level_frame(5, n=2)


async def test_compute_time_is_measured_per_yield(host_of):
    host = host_of(TimedPipeline)
    seen = compute_times_reported(host.output_buffer)
    async with connected(host) as client:
        for _ in range(4):
            await client.next_frame(timeout=60)
    # A lower bound only: the model's own sleep, which load can only lengthen.
    assert seen and all(ct is not None and ct >= 0.03 for ct in seen)


@dataclass
class CamIn(Input):
    cam: Video


class CameraPipeline(ReactorPipeline):
    input: CamIn

    def load(self, config):
        self.reads = 0

    async def inference(self):
        while True:
            [frame] = await self.input.cam.read(1)
            self.reads += 1
            yield 255 - frame


async def test_input_frames_are_transformed_and_buffer_closed_is_handled(host_of):
    host = host_of(CameraPipeline)
    for round_ in range(2):
        async with connected(host) as client:
            client.send_frame("cam", np.full((6, 4, 3), 40 + round_, np.uint8))
            frame = await client.next_frame(timeout=60)
            assert frame.image.shape == (6, 4, 3)
            assert frame.image[0, 0, 0] == 215 - round_
        # The generator was blocked in read() when the client left: that is not an error.
        assert client.end_reason == "client_closed"
        assert host.model_errors == 0
        assert host.input_buffers["cam"].closed


class FailingPipeline(ReactorPipeline):
    def load(self, config):
        self.sessions = 0

    def inference(self):
        self.sessions += 1
        yield level_frame(7)
        if self.sessions == 1:
            raise ValueError("forward pass exploded")
        while True:
            time.sleep(0.005)
            yield level_frame(8)


async def test_inference_error_ends_session_with_message_and_next_session_works(host_of):
    host = host_of(FailingPipeline)
    client = LocalClientFor(host)
    await client.connect()
    reason = await client.wait_closed(timeout=60)
    assert reason == "error"
    ended = [m["data"] for m in client.messages if m["data"]["type"] == "sessionEnded"]
    assert "forward pass exploded" in ended[0]["data"]["message"]
    assert "inference()" in ended[0]["data"]["message"]
    async with connected(host) as second:
        frame = await second.next_frame(timeout=60)
        assert frame.image[0, 0, 0] in (7, 8)
    assert host.healthy


class WrongShapePipeline(ReactorPipeline):
    def inference(self):
        yield np.zeros((8, 8, 4), dtype=np.uint8)


async def test_wrong_frame_shape_ends_session_with_error_naming_it(host_of):
    host = host_of(WrongShapePipeline)
    client = LocalClientFor(host)
    await client.connect()
    assert await client.wait_closed(timeout=60) == "error"
    message = client.end_detail
    assert "(8, 8, 4)" in message and "(H, W, 3)" in message
    assert host.healthy


def LocalClientFor(host):
    from reactor_serve.runtime.local_client import LocalClient

    return LocalClient(host)


async def test_second_session_is_refused_while_one_is_live(host_of):
    from reactor_serve.runtime.host import SessionBusy

    host = host_of(LifecyclePipeline)
    async with connected(host):
        with pytest.raises(SessionBusy):
            await LocalClientFor(host).connect()


def test_model_code_runs_off_the_callers_thread(host_of):
    seen = {}

    class WhereAmI(ReactorPipeline):
        def load(self, config):
            seen["load"] = threading.current_thread().name

    host = host_of(WhereAmI)
    assert seen["load"].startswith("reactor-model-")
    assert seen["load"] != threading.current_thread().name
    assert host.healthy
    host.shutdown()
    assert not host.healthy


def test_load_failure_is_reported_with_traceback(host_of):
    from reactor_serve.runtime.host import ModelHost, ModelLoadError

    class Broken(ReactorPipeline):
        def load(self, config):
            raise RuntimeError("checkpoint missing: " + config["checkpoint"])

    host = ModelHost(Broken, {"checkpoint": "/nope.pt"})
    with pytest.raises(ModelLoadError) as info:
        host.start()
    assert "checkpoint missing: /nope.pt" in str(info.value)
    assert "Traceback" in info.value.traceback and "raise RuntimeError" in info.value.traceback
    assert not host.healthy
    host.shutdown()


async def test_closed_buffer_read_raises_buffer_closed_in_model_code():
    from reactor_serve.runtime.input_buffer import InputBuffer

    buffer = InputBuffer("cam")
    buffer.close()
    with pytest.raises(BufferClosed):
        await buffer.read(1)


class SlowFirstForward(ReactorPipeline):
    output: PipeOut

    def load(self, config):
        self.release = threading.Event()

    def inference(self):
        # A first forward pass that lasts until the test lets it end.
        self.release.wait(60)
        while True:
            yield PipeOut(main_video=level_frame(7))


async def test_a_session_opens_without_waiting_for_the_first_forward_pass(host_of):
    # The client's SDP answer waits for the session to open: the model's first forward
    # pass (half a second for a real model) must not hold it. If it did, connect()
    # would wait for `release`, which is only set after it returns.
    host = host_of(SlowFirstForward)
    client = LocalClient(host)
    try:
        await asyncio.wait_for(client.connect(), 30)
    finally:
        host.model.release.set()
    try:
        frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 7
    finally:
        await client.close()
