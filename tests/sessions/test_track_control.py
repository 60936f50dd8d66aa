"""`pause_track` / `resume_track` from a client, on either wire, reach the session's
track control; nothing else does, and nothing is answered."""

import json

from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, track_pb2
from reactor_serve.sessions.inbound_channel import InboundHandler


class Spec:
    commands: dict = {}
    inputs: tuple = ()
    outputs: tuple = ()


def handler():
    controlled, sent = [], []
    h = InboundHandler(
        session_id="s", command=lambda *a, **k: None, send=sent.append,
        send_control=sent.append, spec=lambda: Spec,
        send_frame=lambda label, frame: sent.append((label, frame)),
        call_later=lambda delay, callback: None,
        track_control=lambda event, name: controlled.append((event, name)),
    )
    return h, controlled, sent


def v0(event, data):
    return json.dumps({"type": "notification", "event": event, "data": data})


def v1(request_id="", **payload):
    message = control_pb2.ControlClientMessage(
        request_id=request_id, kind=common_pb2.MESSAGE_KIND_NOTIFICATION)
    for name, value in payload.items():
        getattr(message, name).CopyFrom(value)
    return message.SerializeToString()


def test_v0_notifications_pause_and_resume_a_track():
    h, controlled, sent = handler()
    h.on_message("control", v0("pause_track", {"name": "main_video"}))
    h.on_message("control", v0("resume_track", {"name": "main_video"}))
    for odd in (v0("unpublish_track", {"name": "camera"}), v0("pause_track", {"name": 5}),
                v0("pause_track", {}), v0("pause_track", {"name": ["a"]})):
        h.on_message("control", odd)
    assert controlled == [("pause_track", "main_video"), ("resume_track", "main_video")]
    assert sent == []


def test_v1_notifications_pause_and_resume_a_track():
    h, controlled, sent = handler()
    h.on_message("control", v1(pause_track=track_pb2.PauseTrack(name="main_video")))
    h.on_message("control", v1(resume_track=track_pb2.ResumeTrack(name="main_video")))
    h.on_message("control", v1(unpublish_track=track_pb2.UnpublishTrack(name="camera")))
    assert controlled == [("pause_track", "main_video"), ("resume_track", "main_video")]
    assert sent == []
