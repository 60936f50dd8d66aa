"""A session's commands name its uploads: the model gets the files, the command log the
references, and a reference to no file of the session a commandError naming the field,
on either wire."""

import json
from dataclasses import dataclass
from typing import Optional

from reactor_runtime.interface import (
    InputState, Output, ReactorModel, UploadedFile, Video, event,
)
from reactor_serve.protocol.wire_v1 import common_pb2, data_pb2
from reactor_serve.runtime.loading.model_spec import inspect_model
from reactor_serve.sessions.inbound_channel import InboundHandler


@dataclass
class Picture(Output):
    main_video: Video


@dataclass
class Knobs(InputState):
    mask: Optional[UploadedFile] = None


class Model(ReactorModel):
    output: Picture
    state: Knobs

    @event
    def set_image(self, image: UploadedFile, caption: str = ""):
        pass


SPEC = inspect_model(Model, "m")
PNG = UploadedFile("a.png", "image/png", b"\x89PNG")
UPLOADS = {"11111111-1111-4111-8111-111111111111": PNG}
PNG_ID = next(iter(UPLOADS))


def lookup(upload_id):
    return UPLOADS.get(upload_id, "no upload of this session has that upload_id")


def handler():
    sent, commands, logged = [], [], []

    def command(name, args, command_id, *, reply=False):
        commands.append((name, args))
        return command_id

    handler = InboundHandler(
        session_id="s", command=command, send=sent.append, send_control=sent.append,
        spec=lambda: SPEC, send_frame=lambda label, frame: sent.append((label, frame)),
        on_command=lambda name, args, error, cid: logged.append((name, args, error)),
        call_later=lambda delay, callback: None, files=lookup,
    )
    return handler, sent, commands, logged


def v0(name, data):
    return json.dumps({"scope": "application", "data": {"type": name, "data": data}})


def test_a_v0_reference_reaches_the_model_as_the_file():
    h, sent, commands, logged = handler()
    h.on_message("data", v0("set_image", {"image": {"upload_id": PNG_ID}, "caption": "hi"}))
    assert commands == [("set_image", {"image": PNG, "caption": "hi"})]
    assert logged == [("set_image", {"image": {"name": "a.png", "mime_type": "image/png", "size": 4},
                                     "caption": "hi"}, None)]
    assert sent == []


def test_a_state_field_of_file_type_takes_a_reference_too():
    h, sent, commands, _ = handler()
    h.on_message("data", v0("set_mask", {"mask": {"upload_id": PNG_ID}}))
    h.on_message("data", v0("set_mask", {"mask": None}))
    assert commands == [("set_mask", {"mask": PNG}), ("set_mask", {"mask": None})]


def test_a_reference_to_no_upload_of_the_session_is_a_command_error_naming_the_field():
    h, sent, commands, logged = handler()
    h.on_message("data", v0("set_image", {"image": {"upload_id": "another-sessions-id"}}))
    assert commands == []
    [text] = sent
    error = json.loads(text)["data"]["data"]
    assert error["command"] == "set_image" and error["errors"][0]["field"] == "image"
    assert "no upload of this session" in error["message"]
    assert logged[0][2] is not None  # logged as refused


def test_a_v1_upload_reference_is_the_file_and_a_bad_one_a_bad_request():
    h, sent, commands, _ = handler()

    def frame(request_id, upload_id):
        message = data_pb2.DataClientMessage(request_id=request_id,
                                             kind=common_pb2.MESSAGE_KIND_REQUEST)
        message.command.type = "set_image"
        message.command.uploads["image"].upload_id = upload_id
        message.command.uploads["image"].name = "claimed.exe"
        return message.SerializeToString()

    h.on_message("data", frame("data_1", PNG_ID))
    assert commands == [("set_image", {"image": PNG})]
    h.on_message("data", frame("data_2", "00000000-0000-4000-8000-000000000000"))
    assert len(commands) == 1
    [(label, raw)] = sent
    reply = data_pb2.DataServerMessage.FromString(raw)
    assert label == "data" and reply.request_id == "data_2"
    assert reply.error.code == "BAD_REQUEST" and "image" in reply.error.message


def test_without_a_store_references_are_passed_on_as_sent():
    sent, commands = [], []
    h = InboundHandler(
        session_id="s", command=lambda name, args, cid: commands.append(args) or cid,
        send=sent.append, send_control=sent.append, spec=lambda: SPEC,
        call_later=lambda delay, callback: None,
    )
    h.on_message("data", v0("set_image", {"image": {"upload_id": PNG_ID}}))
    assert commands == [{"image": {"upload_id": PNG_ID}}]
