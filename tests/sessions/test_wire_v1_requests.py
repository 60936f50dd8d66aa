"""A session's wire v1 frames: every request answered, correlated by its request_id."""

import random
from dataclasses import dataclass

from reactor_runtime.interface import (
    Input, InputField, InputState, Output, ReactorModel, Video, event,
)
from reactor_serve.runtime.loading.model_spec import inspect_model
from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, data_pb2
from reactor_serve.protocol.wire_version import Wire
from reactor_serve.sessions.inbound_channel import InboundHandler, TokenBucket
from reactor_serve.sessions.recording.recorder import ClipAnswer


@dataclass
class Webcam(Input):
    webcam: Video


@dataclass
class Picture(Output):
    main_video: Video


@dataclass
class Knobs(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0)


class Model(ReactorModel):
    input: Webcam
    output: Picture
    state: Knobs

    @event
    def jump(self, height: float = 1.0):
        pass


Spec = inspect_model(Model, "m")


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def handler_with(bucket=None):
    frames, commands = [], []

    def command(name, args, command_id, *, reply=False):
        commands.append((name, args, command_id, reply))
        return command_id

    handler = InboundHandler(
        session_id="s", command=command, send=lambda text: frames.append(("text", text)),
        send_control=lambda text: frames.append(("control-text", text)), spec=lambda: Spec,
        bucket=bucket, send_frame=lambda label, frame: frames.append((label, frame)),
        call_later=lambda delay, callback: None,
    )
    return handler, frames, commands


def data_frame(request_id="data_1", **payload):
    message = data_pb2.DataClientMessage(request_id=request_id, kind=common_pb2.MESSAGE_KIND_REQUEST)
    for name, value in payload.items():
        getattr(message, name).CopyFrom(value)
    return message.SerializeToString()


def command(name, data, request_id="data_1"):
    message = data_pb2.DataClientMessage(request_id=request_id, kind=common_pb2.MESSAGE_KIND_REQUEST)
    message.command.type = name
    message.command.data.update(data)
    return message.SerializeToString()


def control(request_id="ctrl_1", **payload):
    message = control_pb2.ControlClientMessage(request_id=request_id)
    for name, value in payload.items():
        getattr(message, name).CopyFrom(value)
    return message.SerializeToString()


def replies(frames, label="data"):
    kind = data_pb2.DataServerMessage if label == "data" else control_pb2.ControlServerMessage
    return [kind.FromString(frame) for sent_on, frame in frames if sent_on == label]


def test_the_first_binary_frame_switches_the_connection_to_v1_and_back_on_reconnect():
    handler, frames, commands = handler_with()
    handler.on_message("data", command("jump", {"height": 2}))
    assert handler.wire is Wire.V1
    assert commands == [("jump", {"height": 2.0}, "data_1", True)]
    assert frames == []  # the model session answers a command handed on, not this layer
    handler.new_connection()
    handler.on_message("data", '{"scope":"application","data":{"type":"jump","data":{}}}')
    assert handler.wire is Wire.V0
    assert commands[-1] == ("jump", {}, None, False)


def test_bad_arguments_are_answered_with_bad_request_naming_the_field():
    handler, frames, commands = handler_with()
    handler.on_message("data", command("set_brightness", {"brightness": float("nan")}, "data_7"))
    [reply] = replies(frames)
    assert reply.request_id == "data_7" and reply.error.code == "BAD_REQUEST"
    assert "brightness" in reply.error.message and "finite" in reply.error.message
    assert commands == [] and handler.counters.rejected == 1


def test_an_undecodable_frame_is_answered_when_its_id_can_be_read_and_dropped_when_not():
    handler, frames, _ = handler_with()
    handler.on_message("data", command("jump", {"a": 1}, "data_3")[:-2])
    handler.on_message("data", b"\x0a\xff\xff")
    [reply] = replies(frames)
    assert reply.request_id == "data_3" and reply.error.code == "BAD_REQUEST"
    assert handler.counters.ignored == 2


def test_schema_publish_and_unsupported_requests_get_their_replies():
    handler, frames, _ = handler_with()
    handler.on_message("control", control("ctrl_1", request_schema=control_pb2.ControlClientMessage().request_schema))
    message = control_pb2.ControlClientMessage(request_id="ctrl_2")
    message.publish_track.name = "webcam"
    handler.on_message("control", message.SerializeToString())
    message = control_pb2.ControlClientMessage(request_id="ctrl_3")
    message.publish_track.name = "main_video"  # an output: not the client's to publish
    handler.on_message("control", message.SerializeToString())
    message = control_pb2.ControlClientMessage(request_id="ctrl_4")
    message.request_clip.duration_seconds = 5
    handler.on_message("control", message.SerializeToString())
    schema, published, refused, clip = replies(frames, "control")
    assert schema.request_id == "ctrl_1" and schema.model_schema.openapi["openapi"] == "3.1.0"
    assert published.request_id == "ctrl_2" and published.publish_track.name == "webcam"
    assert refused.error.code == "BAD_REQUEST" and "webcam" in refused.error.message
    # Nothing records this session: the reason the official SDK raises RecorderDisabledError for.
    assert clip.request_id == "ctrl_4" and clip.clip_failed.reason.startswith("recorder disabled")
    step = data_pb2.DataClientMessage(request_id="data_9")
    step.request_step.SetInParent()
    handler.on_message("data", step.SerializeToString())
    [result] = replies(frames)
    assert result.step_result.failure_code == 1 and "stepped" in result.step_result.error


def test_notifications_get_no_answer():
    handler, frames, _ = handler_with()
    message = control_pb2.ControlClientMessage(kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    message.ping.SetInParent()
    handler.on_message("control", message.SerializeToString())
    message = control_pb2.ControlClientMessage(kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    message.resume_track.name = "main_video"
    handler.on_message("control", message.SerializeToString())
    assert frames == []


def test_every_command_past_the_rate_limit_is_answered():
    clock = Clock()
    handler, frames, commands = handler_with(TokenBucket(rate=1, burst=2, clock=clock))
    for index in range(5):
        handler.on_message("data", command("jump", {}, f"data_{index}"))
    assert [c[2] for c in commands] == ["data_0", "data_1"]
    refused = replies(frames)
    assert [r.request_id for r in refused] == ["data_2", "data_3", "data_4"]
    assert {r.error.code for r in refused} == {"RATE_LIMITED"}


def test_a_setter_coalesced_away_past_the_limit_is_answered_by_its_own_validity():
    clock = Clock()
    handler, frames, commands = handler_with(TokenBucket(rate=1, burst=1, clock=clock))
    handler.on_message("data", command("set_brightness", {"brightness": 0.1}, "data_0"))
    handler.on_message("data", command("set_brightness", {"brightness": 0.5}, "data_1"))  # held
    handler.on_message("data", command("set_brightness", {"brightness": 9}, "data_2"))  # replaces it
    handler.on_message("data", command("set_brightness", {"brightness": 0.7}, "data_3"))  # replaces that
    assert [c[2] for c in commands] == ["data_0"]
    accepted, refused = replies(frames)
    assert accepted.request_id == "data_1" and accepted.WhichOneof("payload") is None
    assert refused.request_id == "data_2" and refused.error.code == "BAD_REQUEST"
    clock.now = 5.0  # a token again: the newest value goes on, and is answered there
    handler.on_message("data", command("jump", {}, "data_4"))
    assert [c[2] for c in commands] == ["data_0", "data_3"]
    assert all(c[3] for c in commands)
    assert replies(frames)[-1].request_id == "data_4"  # refused: the token went to data_3


def test_random_and_mutated_frames_never_raise_or_fault():
    rng = random.Random(5)
    handler, frames, _ = handler_with()
    handler.on_message("control", control("ctrl_0", ping=control_pb2.ControlClientMessage().ping))
    seeds = [command("set_brightness", {"brightness": 0.5}), control("ctrl_1", request_schema=control_pb2.ControlClientMessage().request_schema)]
    for _ in range(3000):
        if rng.random() < 0.5:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
        else:
            raw = bytearray(rng.choice(seeds))
            raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw)
        handler.on_message(rng.choice(["data", "control"]), raw)
    assert handler.counters.faults == 0
    assert handler.wire is Wire.V1


def test_clip_and_recording_requests_are_answered_with_their_markers_and_playlist():
    asked = []

    def clips(seconds, answer):
        asked.append(seconds)
        answer(ClipAnswer(kind="clip" if seconds else "recording", start_s=1.5, end_s=2.9,
                          now_s=3.0, ready_at_ms=1234, playlist_url="/clips?session_id=s&start=1.500&end=2.900")
               if seconds != 7 else ClipAnswer(failed="recorder disabled: no"))
        return True

    frames = []
    handler = InboundHandler(
        session_id="s", command=lambda *a, **k: None, send=frames.append, send_control=frames.append,
        spec=lambda: Spec, send_frame=lambda label, frame: frames.append((label, frame)),
        call_later=lambda delay, callback: None, clips=clips,
    )
    for request_id, seconds in (("ctrl_1", 2.5), ("ctrl_2", None), ("ctrl_3", 7)):
        message = control_pb2.ControlClientMessage(request_id=request_id)
        if seconds is None:
            message.request_recording.SetInParent()
        else:
            message.request_clip.duration_seconds = seconds
        handler.on_message("control", message.SerializeToString())
    clip, recording, failed = replies(frames, "control")
    assert asked == [2.5, None, 7]
    assert clip.request_id == "ctrl_1" and clip.kind == common_pb2.MESSAGE_KIND_RESPONSE
    ready = clip.clip_ready
    assert (ready.session_id, ready.kind, ready.start_marker, ready.end_marker, ready.now_marker,
            ready.predicted_ready_at_ms) == ("s", "clip", 1.5, 2.9, 3.0, 1234)
    assert ready.playlist_url == "/clips?session_id=s&start=1.500&end=2.900"
    assert recording.request_id == "ctrl_2" and recording.clip_ready.kind == "recording"
    assert failed.request_id == "ctrl_3" and failed.clip_failed.reason == "recorder disabled: no"
