"""Wire v1 frames: decoding is total, answers correlate, commands keep v0's rules."""

import math
import random

import pytest
from google.protobuf import struct_pb2

from reactor_serve.protocol.channel_codec import MAX_MESSAGE_BYTES, BadCommand, ProtocolError
from reactor_serve.protocol.wire_v1 import codec, common_pb2, control_pb2, data_pb2, model_pb2
from reactor_serve.runtime.field_errors import MAX_DEPTH


def command_frame(name, data=None, request_id="data_1"):
    message = data_pb2.DataClientMessage(request_id=request_id, kind=common_pb2.MESSAGE_KIND_REQUEST)
    message.command.type = name
    if data is not None:
        message.command.data.update(data)
    return message.SerializeToString()


def test_a_command_decodes_to_its_name_and_arguments():
    request = codec.decode_data(command_frame("set_brightness", {"brightness": 0.5, "tags": ["a", None]}))
    assert (request.request_id, request.method) == ("data_1", "command")
    assert codec.command_arguments(request.payload) == (
        "set_brightness", {"brightness": 0.5, "tags": ["a", None]}
    )


def test_uploads_join_the_arguments_by_parameter_name():
    message = data_pb2.DataClientMessage(request_id="data_2")
    message.command.type = "set_image"
    message.command.uploads["image"].CopyFrom(
        model_pb2.UploadReference(upload_id="u1", name="a.png", mime_type="image/png", size=3)
    )
    request = codec.decode_data(message.SerializeToString())
    assert codec.command_arguments(request.payload)[1] == {
        "image": {"upload_id": "u1", "name": "a.png", "mime_type": "image/png", "size": 3}
    }


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_is_named_with_its_field(number):
    request = codec.decode_data(command_frame("set_brightness", {"brightness": number}))
    with pytest.raises(BadCommand) as caught:
        codec.command_arguments(request.payload)
    assert caught.value.command == "set_brightness"
    assert caught.value.errors[0]["field"] == "brightness"
    assert caught.value.errors[0]["rule"] == "finite"


def test_arguments_nested_past_max_depth_are_refused_by_field():
    value = struct_pb2.Value(string_value="deep")
    # Nested through lists: one protobuf level (ListValue) per JSON level plus the
    # Value, so the parser takes it and the argument rule is what refuses it.
    for _ in range(MAX_DEPTH + 1):
        outer = struct_pb2.Value()
        outer.list_value.values.append(value)
        value = outer
    message = data_pb2.DataClientMessage(request_id="data_3")
    message.command.type = "set_prompt"
    message.command.data.fields["prompt"].CopyFrom(value)
    try:
        request = codec.decode_data(message.SerializeToString())
    except codec.WireError as exc:  # past the parser's own recursion limit
        assert exc.request_id == "data_3"
        return
    with pytest.raises(BadCommand) as caught:
        codec.command_arguments(request.payload)
    assert caught.value.errors[0]["field"] == "prompt"
    assert caught.value.errors[0]["rule"] == f"max_depth={MAX_DEPTH}"


def test_a_command_without_a_name_is_a_protocol_error():
    request = codec.decode_data(command_frame(""))
    with pytest.raises(ProtocolError):
        codec.command_arguments(request.payload)


def test_a_truncated_frame_keeps_its_request_id():
    frame = command_frame("set_brightness", {"brightness": 0.5}, request_id="data_9")
    with pytest.raises(codec.WireError) as caught:
        codec.decode_data(frame[:-3])
    assert caught.value.request_id == "data_9"


def test_text_an_oversize_frame_and_a_missing_payload_are_refused():
    with pytest.raises(codec.WireError):
        codec.decode_data('{"scope": "application"}')
    big = command_frame("set_prompt", {"prompt": "x" * MAX_MESSAGE_BYTES}, request_id="data_4")
    with pytest.raises(codec.WireError) as caught:
        codec.decode_data(big)
    assert caught.value.request_id == "data_4"
    with pytest.raises(codec.WireError) as caught:
        codec.decode_control(control_pb2.ControlClientMessage(request_id="ctrl_1").SerializeToString())
    assert caught.value.request_id == "ctrl_1" and "no payload" in str(caught.value)


def test_a_request_id_longer_than_the_limit_is_refused_but_answerable():
    frame = command_frame("set_brightness", {}, request_id="r" * 500)
    with pytest.raises(codec.WireError) as caught:
        codec.decode_data(frame)
    assert caught.value.request_id == "r" * 64


def test_unknown_fields_and_enum_values_are_ignored():
    frame = bytearray(command_frame("set_brightness", {"brightness": 1.0}))
    frame += bytes([0x10, 0x63])  # field 2 (kind) = 99: no such MessageKind
    frame += bytes([0xF8, 0x07, 0x01])  # field 127, varint: unknown
    request = codec.decode_data(bytes(frame))
    assert codec.command_arguments(request.payload)[0] == "set_brightness"


def test_scan_request_id_is_total_on_any_bytes():
    rng = random.Random(7)
    for _ in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        found = codec.scan_request_id(data)
        assert found is None or (isinstance(found, str) and 0 < len(found) <= 64)
    # A varint that never ends, a length past the end, a huge length.
    assert codec.scan_request_id(b"\x0a" + b"\xff" * 20) is None
    assert codec.scan_request_id(b"\x0a\x10abc") is None
    assert codec.scan_request_id(b"\x10\x01\x0a\x03abc") == "abc"


def test_decoding_random_and_mutated_bytes_raises_only_wire_errors():
    rng = random.Random(11)
    seeds = [command_frame("set_brightness", {"brightness": 0.5, "list": [1, {"a": "b"}]})]
    for _ in range(4000):
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(80)))
        else:
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        for decode in (codec.decode_data, codec.decode_control):
            try:
                request = decode(data)
            except codec.WireError:
                continue
            if request.method == "command":
                try:
                    codec.command_arguments(request.payload)
                except ProtocolError:
                    pass


def test_a_refused_command_answers_bad_request_and_a_flood_rate_limited():
    envelope = {"scope": "runtime", "data": {"type": "commandError", "data": {
        "command": "x", "message": "x: y breaks le=2.0", "id": "data_5",
        "errors": [{"field": "y", "rule": "le=2.0", "value": 7}],
    }}}
    [(label, frame)] = codec.from_envelope(envelope)
    reply = data_pb2.DataServerMessage.FromString(frame)
    assert label == "data" and reply.request_id == "data_5"
    assert reply.kind == common_pb2.MESSAGE_KIND_RESPONSE
    assert (reply.error.code, reply.error.message) == ("BAD_REQUEST", "x: y breaks le=2.0")
    envelope["data"]["data"]["errors"] = [{"field": None, "rule": "rate_limited", "value": None}]
    reply = data_pb2.DataServerMessage.FromString(codec.from_envelope(envelope)[0][1])
    assert reply.error.code == "RATE_LIMITED"
    envelope["data"]["data"]["errors"] = [{"field": None, "rule": "session_ending", "value": None}]
    reply = data_pb2.DataServerMessage.FromString(codec.from_envelope(envelope)[0][1])
    assert reply.error.code == "SESSION_TERMINAL"  # the SDK's SessionTerminalError
    # Without an id nobody waits: nothing to send.
    del envelope["data"]["data"]["id"]
    assert codec.from_envelope(envelope) == []


def test_an_accepted_command_gets_a_bodyless_response():
    [(label, frame)] = codec.from_envelope(
        {"scope": "runtime", "data": {"type": "commandAccepted", "data": {"id": "data_6", "command": "x"}}}
    )
    reply = data_pb2.DataServerMessage.FromString(frame)
    assert label == "data" and reply.request_id == "data_6"
    assert reply.WhichOneof("payload") is None


def test_model_messages_and_session_end_go_out_as_notifications():
    [(label, frame)] = codec.from_envelope(
        {"scope": "application", "data": {"type": "progress", "data": {"done": 3, "of": [1, 2]}}}
    )
    message = data_pb2.DataServerMessage.FromString(frame)
    assert label == "data" and message.kind == common_pb2.MESSAGE_KIND_NOTIFICATION
    assert message.message.type == "progress"
    assert dict(message.message.data)["done"] == 3
    [(label, frame)] = codec.from_envelope(
        {"scope": "runtime", "data": {"type": "sessionEnded", "data": {"reason": "timeout", "message": "idle"}}}
    )
    ended = control_pb2.ControlServerMessage.FromString(frame)
    assert label == "control" and ended.session_ended.reason == "timeout: idle"
    # What v1 has no message for is left out.
    assert codec.from_envelope({"scope": "runtime", "data": {"type": "stats", "data": {"fps": 30}}}) == []


def test_text_with_a_lone_surrogate_is_escaped_not_fatal():
    frame = codec.data_error("data_7", "BAD_REQUEST", "bad \ud800 value")
    assert "\\ud800" in data_pb2.DataServerMessage.FromString(frame).error.message


def test_a_message_a_struct_cannot_carry_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        codec.from_envelope({"scope": "application", "data": {"type": "m", "data": {"x": object()}}})
