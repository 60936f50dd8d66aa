"""ReactorModel under the session engine: run(), handlers, emit, messages, errors."""

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import torch
from conftest import connected

from reactor_serve.interface import (
    Audio,
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    event,
    get_ctx,
)
from reactor_serve.interface import (
    connected as on_connect,
)
from reactor_serve.interface import (
    disconnected as on_disconnect,
)
from reactor_serve.runtime.local_client import LocalClient


@dataclass
class Out(Output):
    main_video: Video


@dataclass
class Tick(ModelMessage):
    step: int
    label: str


def frame_of(level):
    return np.full((8, 8, 3), level, dtype=np.uint8)


class HookModel(ReactorModel):
    output: Out

    def load(self, config):
        self.log = []

    @on_connect
    async def hello(self):
        self.log.append(("connected", self.connected.is_set()))

    @on_disconnect
    def bye(self):
        self.log.append(("disconnected", self.connected.is_set()))

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                await self.emit(Out(main_video=frame_of(30)))
                await asyncio.sleep(0.01)


async def test_connected_is_set_before_hook_and_cleared_before_disconnect_hook(host_of):
    host = host_of(HookModel)
    for _ in range(2):
        async with connected(host) as client:
            assert (await client.next_frame(timeout=60)).image[0, 0, 0] == 30
    assert host.model.log == [
        ("connected", True),
        ("disconnected", False),
        ("connected", True),
        ("disconnected", False),
    ]


class InterleaveModel(ReactorModel):
    output: Out

    fps = 60

    def load(self, config):
        self.value = 0
        self.blocking = False
        self.handler_saw_blocking = []
        self.changed_across_await = 0

    @event(name="set_value", description="Set the value")
    async def set_value(self, value: int = InputField(default=0, ge=0)):
        self.handler_saw_blocking.append(self.blocking)
        self.value = value

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                before = self.value
                await asyncio.sleep(0.005)  # handlers may run here
                if self.value != before:
                    self.changed_across_await += 1
                self.blocking = True
                snapshot = self.value
                time.sleep(0.01)  # a blocking forward pass: no handler can run
                assert self.value == snapshot
                self.blocking = False
                await self.emit(Out(main_video=frame_of(self.value % 256)))


async def test_handlers_interleave_with_run_at_awaits_only(host_of):
    host = host_of(InterleaveModel)
    async with connected(host) as client:
        await client.next_frame(timeout=60)
        for value in range(1, 60):
            client.send_command("set_value", {"value": value})
            await asyncio.sleep(0.003)  # paces the commands; nothing is asserted on it
        while (await client.next_frame(timeout=60)).image[0, 0, 0] != 59:
            pass
    model = host.model
    assert model.changed_across_await > 0
    assert len(model.handler_saw_blocking) == 59
    assert not any(model.handler_saw_blocking)
    assert host.model_errors == 0


class SlowRoomyModel(ReactorModel):
    """Slower than its fps, with a buffer it never fills: emit() never has to wait."""

    output: Out
    fps = 30
    buffer_size = 32

    def load(self, config):
        self.value = 0

    @event(name="set_value", description="Set the value")
    def set_value(self, value: int = InputField(default=0, ge=0, le=255)):
        self.value = value

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                time.sleep(0.05)  # a blocking forward pass, slower than 1/fps
                await self.emit(Out(main_video=frame_of(self.value)))


async def test_handlers_run_at_every_emit_even_when_the_buffer_has_room(host_of):
    # The reference: handlers run "at any await point". An emit that finds room must
    # still let them in, or a slow model with a large buffer never sees a command.
    host = host_of(SlowRoomyModel)
    async with connected(host) as client:
        await client.next_frame(timeout=60)
        client.send_command("set_value", {"value": 7})
        frame = await client.next_frame(timeout=60)
        # More frames than the buffer holds: the handler runs at the next emit, so
        # the value shows after at most what was queued by then.
        for _ in range(SlowRoomyModel.buffer_size + 8):
            if frame.image[0, 0, 0] == 7:
                break
            frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 7, "the handler never ran between emits"
    assert host.model_errors == 0


class EventOnlyModel(ReactorModel):
    """No run(): the default blocks forever and handlers do the work."""

    output: Out

    @event(name="show", description="Emit one frame")
    async def show(self, level: int = InputField(default=1, ge=0, le=255)):
        await self.emit(Out(main_video=frame_of(level)))
        await self.send(Tick(step=level, label="shown"))
        get_ctx().send({"type": "raw", "data": {"level": level}})


async def test_default_run_blocks_and_event_handlers_emit_and_send(host_of):
    host = host_of(EventOnlyModel)
    async with connected(host) as client:
        first = await client.next_frame(new=False, timeout=60)
        assert first.image.max() == 0 and not first.is_new  # black before the first frame
        client.send_command("show", {"level": 77})
        frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 77
        tick = await client.next_message("tick", after=0, timeout=60)
        assert tick == {"type": "tick", "data": {"step": 77, "label": "shown"}}
        raw = await client.next_message("raw", after=0, timeout=60)
        assert raw == {"type": "raw", "data": {"level": 77}}
        # No new frames: the last one is held, not black.
        held = await client.next_frame(new=False, timeout=60)
        assert not held.is_new and held.image[0, 0, 0] == 77


class FastModel(ReactorModel):
    output: Out

    buffer_size = 2

    def load(self, config):
        self.emitted = 0
        self.drop = config.get("drop", False)

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                await self.emit(Out(main_video=frame_of(self.emitted % 256)), drop=self.drop)
                self.emitted += 1
                await asyncio.sleep(0)


async def test_emit_waits_when_full(host_of):
    host = host_of(FastModel)
    async with connected(host) as client:
        for _ in range(6):
            await client.next_frame(timeout=60)
        presented = client.session.clock.new_frames
        # Backpressure: at most the buffer plus the one being handed over got ahead.
        assert host.model.emitted <= presented + host.spec.buffer_size + 1
        assert host.output_buffer.dropped == 0


async def test_emit_with_drop_discards_instead_of_waiting(host_of):
    host = host_of(FastModel, {"drop": True})
    async with connected(host) as client:
        for _ in range(4):
            await client.next_frame(timeout=60)
        assert host.output_buffer.dropped > 0
        assert host.model.emitted > client.session.clock.new_frames + 2


class FpsModel(ReactorModel):
    output: Out

    fps = 30

    @event(name="fps", description="Change the frame rate")
    def change(self, value: float = InputField(default=30.0, ge=1.0, le=60.0)):
        self.output_buffer.set_fps(value)


async def test_set_fps_acts_on_the_next_tick(host_of):
    host = host_of(FpsModel)
    async with connected(host) as client:
        frame = await client.next_frame(new=False, timeout=60)
        assert frame.frame.fps == 30
        client.send_command("fps", {"value": 10})
        # Counted in ticks from when the handler applied it, not from when it was sent.
        deadline = time.monotonic() + 60
        while host.output_buffer.target_fps != 10:
            assert time.monotonic() < deadline, "the fps handler never ran"
            await asyncio.sleep(0.01)  # the poll interval of a wait with a deadline
        # The tick being waited for may have been planned before: the one after it not.
        await client.next_frame(new=False, timeout=60)
        frame = await client.next_frame(new=False, timeout=60)
        assert frame.frame.fps == 10
        assert host.output_buffer.target_fps == 10


class RaisingRunModel(ReactorModel):
    output: Out

    def load(self, config):
        self.runs = 0

    async def run(self):
        self.runs += 1
        run_number = self.runs
        while True:
            await self.connected.wait()
            await self.emit(Out(main_video=frame_of(run_number)))
            if run_number == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            await asyncio.sleep(0.01)


async def test_run_error_ends_session_and_next_session_works(host_of):
    host = host_of(RaisingRunModel)
    client = LocalClient(host)
    await client.connect()
    assert await client.wait_closed(timeout=60) == "error"
    assert "run() raised RuntimeError: CUDA out of memory" in client.end_detail
    ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=60)
    assert ended["data"]["reason"] == "error"
    async with connected(host) as second:
        frame = await second.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 2
    assert host.model.runs == 2 and host.model_errors == 1


class HandlerErrorModel(ReactorModel):
    output: Out

    @event(name="boom", description="Fails")
    def boom(self):
        raise KeyError("no such prompt")

    @event(name="show", description="Emit")
    async def show(self):
        await self.emit(frame_of(9))


async def test_handler_error_ends_session_and_replica_keeps_serving(host_of):
    host = host_of(HandlerErrorModel)
    client = LocalClient(host)
    await client.connect()
    client.send_command("boom")
    assert await client.wait_closed(timeout=60) == "error"
    assert "boom() raised KeyError" in client.end_detail
    async with connected(host) as second:
        second.send_command("show")
        assert (await second.next_frame(timeout=60)).image[0, 0, 0] == 9


class TensorModel(ReactorModel):
    output: Out

    async def run(self):
        while True:
            await self.connected.wait()
            batch = torch.full((3, 4, 6, 3), 123, dtype=torch.uint8)
            await self.emit(batch)
            bad = torch.rand(4, 6, 3)
            try:
                await self.emit(bad)
            except ValueError as exc:
                get_ctx().send({"type": "bad", "data": {"error": str(exc)}})
            await asyncio.sleep(3600)


async def test_torch_tensors_are_accepted_and_bad_dtype_error_names_it(host_of):
    host = host_of(TensorModel)
    async with connected(host) as client:
        frame = await client.next_frame(timeout=60)
        assert frame.image.shape == (4, 6, 3) and frame.image[0, 0, 0] == 123
        error = await client.next_message("bad", after=0, timeout=60)
        text = error["data"]["error"]
        assert "float32" in text and "(4, 6, 3)" in text and "uint8" in text


@dataclass
class AVOut(Output):
    main_video: Video
    main_audio: Audio


class Voice(Audio):
    sample_rate = 16000


@dataclass
class VoiceOut(Output):
    main_video: Video
    voice: Voice


class AudioModel(ReactorModel):
    output: AVOut
    fps = 25

    async def run(self):
        t = 0
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                # 4 frames and 4/25 s of 48 kHz audio in one emit.
                samples = np.arange(t, t + 7680, dtype=np.int64) % 30000
                await self.emit(
                    AVOut(
                        main_video=np.zeros((4, 8, 8, 3), np.uint8),
                        main_audio=samples.astype(np.int16)[None, :],
                    )
                )
                t += 7680
                await asyncio.sleep(0.1)


async def test_batched_emit_splits_audio_across_frames(host_of):
    host = host_of(AudioModel)
    async with connected(host) as client:
        chunks = []
        while len(chunks) < 8:
            frame = await client.next_frame(timeout=60)
            chunks.append(frame.audio["main_audio"])
    assert all(c.shape == (1, 1920) and c.dtype == np.int16 for c in chunks)
    joined = np.concatenate(chunks, axis=1)[0].astype(np.int64)
    assert np.all(np.diff(joined) == 1)  # contiguous, in order, nothing lost


class VoiceModel(ReactorModel):
    output: VoiceOut

    async def run(self):
        while True:
            await self.connected.wait()
            await self.emit(
                VoiceOut(
                    main_video=np.zeros((2, 8, 8, 3), np.uint8),
                    voice=np.zeros((1, 3200), np.int16),
                )
            )
            await asyncio.sleep(3600)


async def test_audio_track_sample_rate_is_resampled_to_48k(host_of):
    host = host_of(VoiceModel)
    async with connected(host) as client:
        first = await client.next_frame(timeout=60)
        second = await client.next_frame(timeout=60)
    total = first.audio["voice"].shape[1] + second.audio["voice"].shape[1]
    # 3200 samples at 16 kHz are 9600 at 48 kHz, less the resampler's filter delay.
    assert 9500 <= total <= 9600


async def test_send_outside_a_session_is_dropped_and_get_ctx_raises(host_of):
    import pytest

    host = host_of(EventOnlyModel)
    with pytest.raises(RuntimeError, match="outside a session"):
        get_ctx()
    await host.model.send(Tick(step=1, label="nobody"))  # no error, nobody to tell
