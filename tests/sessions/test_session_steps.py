"""SessionSteps: a step request checked whole, its frames written to the inputs, run, and
answered with the unit's frames (or why not), over a host that steps in-test."""

import asyncio
import fractions

import av
import numpy as np

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.protocol.wire_v1 import data_pb2, step_pb2
from reactor_serve.runtime.pacing.frames import MAX_FRAME_METADATA_BYTES
from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer
from reactor_serve.runtime.stepping import StepFailure, StepOutcome
from reactor_serve.sessions.session_steps import SessionSteps


class Video:
    pass


class Host:
    """Steps by putting `frames` pictures of the last command's level in the buffer."""

    def __init__(self, buffer, frames=3):
        self.buffer, self.frames, self.calls = buffer, frames, []

    async def step(self, session, state, commands):
        self.calls.append((state, commands, list(session.inputs)))
        await asyncio.sleep(0.02)  # a step's simulated work; no test times it
        level = int(commands[-1][1]["level"]) if commands else 7
        for _ in range(self.frames):
            await self.buffer.put([FrameItem({"main_video": np.full((4, 6, 3), level, np.uint8)})], False)
        return StepOutcome(elapsed_s=0.02)


class Session:
    stopping = False

    def __init__(self, host):
        self.host, self.inputs, self.batches = host, [], []

    def push_inputs(self, track, frames):
        self.batches.append((track, len(frames)))
        for frame in frames:
            self.inputs.append((track, frame.shape))
            self.tags = getattr(self, "tags", []) + [
                (getattr(frame, "metadata", None), getattr(frame, "capture_time_us", None))]


def make(frames=3, limit=1 << 20, buffer_size=2):
    buffer = OutputBuffer(buffer_size, 30.0)
    host = Host(buffer, frames)
    session = host.session = Session(host)
    sent = []
    steps = SessionSteps(
        session=lambda: session, outputs=(TrackDecl("main_video", "video", Video),),
        inputs=(TrackDecl("camera", "video", Video),), output_buffer=buffer, fps=30.0,
        send_frame=lambda label, frame: sent.append(data_pb2.DataServerMessage.FromString(frame)),
        limit=lambda: limit, resolve=lambda name, args: args,
    )
    return steps, host, sent


def request(level=None, frames=()):
    message = step_pb2.RequestStep()
    if level is not None:
        command = message.commands.add()
        command.type = "paint"
        command.data.update({"level": level})
    if frames:
        group = message.media_input.add(track="camera")
        for frame in frames:
            group.frames.add().CopyFrom(frame)
    return message


def raw(height=4, width=6, data=None, **kw):
    shape = [height, width, 3]
    return step_pb2.Frame(encoding=step_pb2.FRAME_ENCODING_RAW, dtype="uint8", shape=shape,
                          data=data if data is not None else bytes(height * width * 3), **kw)


async def answered(sent, count):
    # The deadline only stops a hang on a loaded machine.
    deadline = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < deadline:
        if len(sent) >= count:
            return [m.step_result for m in sent]
        await asyncio.sleep(0.01)  # the poll interval; the deadline is the bound
    raise AssertionError(f"{count} step answers did not come: {len(sent)} did")


async def test_a_step_answers_with_every_frame_of_its_unit_even_past_the_buffer():
    steps, host, sent = make(frames=5, buffer_size=2)
    steps.request("data_1", request(level=42, frames=[raw(), raw()]))
    [result] = await answered(sent, 1)
    assert sent[0].request_id == "data_1" and result.step == 1 and result.failure_code == 0
    [track] = result.tracks
    assert track.track == "main_video" and track.rate == 30.0 and len(track.frames) == 5
    frame = track.frames[0]
    assert (frame.dtype, list(frame.shape)) == ("uint8", [4, 6, 3])
    assert np.frombuffer(frame.data, np.uint8).max() == 42
    assert host.calls == [({}, [("paint", {"level": 42.0})], [("camera", (4, 6, 3))] * 2)]
    # Both frames landed in one push: a read the model already awaits takes the latest.
    assert host.session.batches == [("camera", 2)]


async def test_what_the_client_attached_to_a_frame_reaches_the_model_with_it():
    steps, host, sent = make()
    steps.request("data_1", request(level=3, frames=[
        raw(metadata=b"\x00tag", capture_time_us=1_700_000_000_000_000), raw(), raw(metadata=b""),
    ]))
    await answered(sent, 1)
    assert host.session.tags == [(b"\x00tag", 1_700_000_000_000_000), (None, None), (None, None)]


async def test_bad_frames_refuse_the_step_before_anything_applies():
    steps, host, sent = make()
    bad = [
        [raw(data=b"short")],
        [raw(height=0)],
        [raw(height=5000)],
        [step_pb2.Frame(encoding=step_pb2.FRAME_ENCODING_RAW, dtype="float32", shape=[4, 6, 3])],
        [step_pb2.Frame(encoding=step_pb2.FRAME_ENCODING_H264, data=b"\x00\x00\x00\x01garbage")],
        [step_pb2.Frame(encoding=7)],
        [raw(metadata=b"x" * (MAX_FRAME_METADATA_BYTES + 1))],
        [raw(capture_time_us=-5)],
    ]
    for n, frames in enumerate(bad):
        steps.request(f"data_{n}", request(level=1, frames=[raw(), *frames]))
        await answered(sent, n + 1)
    unknown = request(level=1)
    unknown.media_input.add(track="microphone").frames.add().CopyFrom(raw())
    steps.request("data_x", unknown)
    results = await answered(sent, len(bad) + 1)
    assert all(r.failure_code == step_pb2.STEP_FAILURE_CODE_REFUSED for r in results)
    assert all("media_input" in r.entry for r in results), [r.entry for r in results]
    assert "microphone" in results[-1].error and "camera" in results[-1].error
    assert host.calls == []


async def test_h264_frames_are_decoded_for_the_step():
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = 64, 48, "yuv420p"
    codec.time_base = fractions.Fraction(1, 30)
    codec.options = {"tune": "zerolatency"}
    packets = []
    for n in range(3):
        picture = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 90, np.uint8), format="rgb24")
        picture.pts = n
        packets += codec.encode(picture.reformat(format="yuv420p"))
    packets += codec.encode(None)
    steps, host, sent = make()
    frames = [step_pb2.Frame(encoding=step_pb2.FRAME_ENCODING_H264, data=bytes(p)) for p in packets]
    steps.request("data_1", request(frames=frames))
    [result] = await answered(sent, 1)
    assert result.failure_code == 0
    assert host.calls[0][2] == [("camera", (48, 64, 3))] * 3


async def test_one_step_at_a_time_and_a_result_past_the_limit_is_said_so():
    steps, host, sent = make(limit=100)
    steps.request("data_1", request(level=1))
    steps.request("data_2", request(level=2))
    first, second = await answered(sent, 2)
    # The second came while the first ran; the first made more than 100 bytes.
    assert sent[0].request_id == "data_2"
    assert first.failure_code == step_pb2.STEP_FAILURE_CODE_NOT_READY
    assert second.failure_code == step_pb2.STEP_FAILURE_CODE_RESULT_TOO_LARGE
    assert second.step == 1 and "100" in second.error


async def test_a_failed_step_says_why_and_which_entry():
    steps, host, sent = make()

    async def failing(session, state, commands):
        return StepOutcome(StepFailure.COMMAND_FAILED, "paint raised ValueError: no", "paint")

    host.step = failing
    steps.request("data_1", request(level=1))
    [result] = await answered(sent, 1)
    assert result.failure_code == step_pb2.STEP_FAILURE_CODE_COMMAND_FAILED
    assert (result.entry, result.error) == ("paint", "paint raised ValueError: no")
    assert steps.steps == 0
