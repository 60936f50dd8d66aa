"""Models written as the reference pages show them run unchanged and behave as described."""

import threading

import numpy as np
import pytest
from conftest import connected
from emit_reports import compute_times_reported
from paths import TEST_MODELS
from waits import until

from reactor_serve.interface import get_ctx
from reactor_serve.runtime.local_client import LocalClient

MODELS = TEST_MODELS / "reference"


@pytest.fixture
def manifest_host(host_of):
    return lambda name: host_of(MODELS / name)


async def test_video_to_video_reference_example(manifest_host):
    host = manifest_host("v2v")
    assert [t.name for t in host.spec.inputs] == ["camera"]
    camera = np.full((16, 12, 3), 100, np.uint8)
    for session in range(2):
        async with connected(host) as client:
            client.send_frame("camera", camera)
            frame = await client.next_frame(timeout=60)
            assert frame.image.shape == (16, 12, 3) and frame.image[0, 0, 0] == 100
            client.send_command("set_style", {"style": "sketch"})
            # The handler ran before the frame arrives: the model's style says so.
            await until(lambda: host.model.style == "sketch", "the sketch style to apply")
            client.send_frame("camera", camera)
            frame = await client.next_frame(timeout=60)
            assert frame.image[0, 0, 0] == 155
            mark = len(client.messages)
            client.send_command("set_style", {"style": "watercolor"})
            error = await client.next_message("commandError", after=mark, timeout=60)
            assert error["data"]["errors"][0]["field"] == "style"
        # @disconnected closed the buffer; @connected of the next session reopens it.
        assert host.input_buffers["camera"].closed
        assert client.end_reason == "client_closed"
    assert host.model_errors == 0


async def test_run_loop_reference_example(manifest_host):
    host = manifest_host("run_loop")
    assert host.spec.buffer_size == 20
    reported = compute_times_reported(host.output_buffer)
    async with connected(host) as client:
        frame = await client.next_frame(timeout=60)
        assert frame.image.shape == (24, 32, 3)
        assert frame.image[0, 0, 0] == 30  # len("dog") * 10 from config.yml's prompt
        progress = await client.next_message("progress", after=0, timeout=60)
        assert set(progress["data"]) == {"step", "total"}
        client.send_command("set_prompt", {"prompt": "a longer prompt"})
        while (await client.next_frame(timeout=60)).image[0, 0, 0] < 150:
            pass
        # compute_time was passed: the measured rate is frames per the compute time
        # the model reported, not per the wall time between its emits (told from
        # the samples the rate holds, not from how large it came out).
        rate = host.output_buffer.rate
        with rate._lock:  # the model's thread adds samples meanwhile
            samples, measured = list(rate._samples), rate._rate_locked()
        assert samples and all(seconds in reported for _, _, seconds in samples)
        assert measured == pytest.approx(
            sum(frames for _, frames, _ in samples) / sum(seconds for _, _, seconds in samples))
        client.send_command("slow_down")
        # Counted in ticks from when the handler applied it, not from when it was sent:
        # the tick being waited for may have been planned before, the one after not.
        await until(lambda: host.output_buffer.target_fps == 15, "slow_down to apply")
        await client.next_frame(new=False, timeout=60)
        frame = await client.next_frame(new=False, timeout=60)
        assert frame.frame.fps == 15


async def test_inference_generator_reference_example(manifest_host):
    host = manifest_host("generator")
    async with connected(host) as client:
        idle = await client.next_frame(new=False, timeout=60)
        assert not idle.is_new and idle.image.max() == 0
        client.send_command("set_prompt", {"prompt": "hi"})
        frame = await client.next_frame(timeout=60)
        assert frame.image[0, 0, 0] == 40
        await client.next_message("progress", after=0, timeout=60)


async def test_legacy_block_model_reference_patterns(manifest_host):
    host = manifest_host("legacy_blocks")
    assert host.spec.kind == "legacy" and host.spec.name == "legacy-blocks"
    assert host.config["size"] == [12, 16]  # read from @model(config="config.yml")
    model = host.model
    async with connected(host) as client:
        # emit_block(None) then nothing until a prompt: black.
        for _ in range(4):
            frame = await client.next_frame(new=False, timeout=60)
            assert frame.image.shape == (480, 640, 3) or frame.image.shape == (12, 16, 3)
            assert frame.image.max() == 0
        # Waiting for a prompt with monitoring disabled does not drag the rate down.
        assert not host.output_buffer.rate.monitoring
        mark = len(client.messages)
        client.send_command("set_prompt", {"prompt": ""})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["rule"] == "min_length=1"
        client.send_command("set_speed", {"speed": 11})
        error = await client.next_message("commandError", after=mark + 1, timeout=60)
        assert error["data"]["errors"][0]["rule"] == "le=10"
        client.send_command("set_prompt", {"prompt": "a forest"})
        levels = []
        while len(levels) < 6:
            frame = await client.next_frame(timeout=60)
            levels.append(int(frame.image[0, 0, 0]))
        assert frame.image.shape == (12, 16, 3)
        assert levels == sorted(levels) and len(set(levels)) == 6  # it moves
        progress = await client.next_message("progress", after=0, timeout=60)
        assert progress["data"]["frames_generated"] % 4 == 0
        assert host.output_buffer.rate.monitoring
    # should_stop() ended start_session(); its finally reset per-session state.
    assert model.prompt is None and model.frame_index == 0
    assert client.end_reason == "client_closed"


async def test_legacy_session_ends_when_start_session_returns(manifest_host):
    host = manifest_host("legacy_blocks")
    client = LocalClient(host)
    await client.connect()
    client.send_command("set_prompt", {"prompt": "stop"})
    assert await client.wait_closed(timeout=60) == "model_ended"
    async with connected(host) as again:
        again.send_command("set_prompt", {"prompt": "next user"})
        await again.next_frame(timeout=60)


async def test_get_ctx_works_in_the_session_thread_and_its_helpers(host_of):
    from reactor_serve.interface import VideoModel, model

    seen = {}

    @model(name="ctx-probe")
    class Probe(VideoModel):
        def start_session(self):
            seen["session"] = get_ctx().session_id
            helper = threading.Thread(target=lambda: seen.update(helper=get_ctx().session_id))
            helper.start()
            helper.join()
            while not get_ctx().should_stop():
                get_ctx().emit_block(np.zeros((2, 4, 4, 3), np.uint8))

    host = host_of(Probe)
    with pytest.raises(RuntimeError):
        get_ctx()
    async with connected(host) as client:
        await client.next_frame(timeout=60)
        assert seen["session"] == client.session.id == seen["helper"]
    with pytest.raises(RuntimeError):
        get_ctx()


async def test_legacy_start_session_error_ends_session_with_message(host_of):
    from reactor_serve.interface import VideoModel, model

    @model(name="broken-legacy")
    class Broken(VideoModel):
        calls = 0

        def start_session(self):
            type(self).calls += 1
            if type(self).calls == 1:
                get_ctx().emit_block(np.zeros((4, 4, 4), np.uint8))
            while not get_ctx().should_stop():
                get_ctx().emit_block(np.full((1, 4, 4, 3), 5, np.uint8))

    host = host_of(Broken)
    client = LocalClient(host)
    await client.connect()
    assert await client.wait_closed(timeout=60) == "error"
    assert "start_session() raised FrameError" in client.end_detail
    assert "(4, 4, 4)" in client.end_detail
    async with connected(host) as again:
        assert (await again.next_frame(timeout=60)).image[0, 0, 0] == 5
