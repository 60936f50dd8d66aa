"""The data-channel codec of PROTOCOL.md: "data" envelopes and "control" messages."""

import json

import pytest

from reactor_serve.webrtc.protocol import (
    MAX_MESSAGE_BYTES,
    Inbound,
    ProtocolError,
    application,
    control_response,
    decode,
    decode_control,
    encode,
    runtime,
)


def frame(scope="application", type_="set_prompt", data=None, **extra):
    inner = {"type": type_}
    if data is not None:
        inner["data"] = data
    return json.dumps({"scope": scope, "data": inner, **extra})


# --- "data" channel: decoding ---------------------------------------------------------


def test_decodes_a_command():
    got = decode(frame(data={"prompt": "a cat", "strength": 0}))
    assert got == Inbound(scope="application", type="set_prompt",
                          data={"prompt": "a cat", "strength": 0})


def test_decodes_a_runtime_ping_without_data():
    # JS drops undefined members, so a call without arguments has no inner "data".
    got = decode('{"scope":"runtime","data":{"type":"ping"}}')
    assert (got.scope, got.type, got.data) == ("runtime", "ping", {})


def test_null_data_reads_as_no_arguments():
    assert decode('{"scope":"runtime","data":{"type":"ping","data":null}}').data == {}


def test_unknown_envelope_keys_are_ignored():
    assert decode(frame(data={"a": 1}, extra_key=True)).data == {"a": 1}


def test_inbound_is_immutable():
    got = decode(frame(data={}))
    with pytest.raises(AttributeError):
        got.type = "other"  # type: ignore[misc]


def test_frame_of_exactly_the_limit_decodes():
    head = '{"scope":"application","data":{"type":"t","data":{"p":"'
    tail = '"}}}'
    raw = head + "x" * (MAX_MESSAGE_BYTES - len(head) - len(tail)) + tail
    assert len(raw.encode()) == MAX_MESSAGE_BYTES
    assert len(decode(raw).data["p"]) == MAX_MESSAGE_BYTES - len(head) - len(tail)


def test_non_ascii_text_decodes():
    assert decode(frame(data={"prompt": "café 猫"})).data == {"prompt": "café 猫"}


def _deep(n):
    return '{"scope":"runtime","data":{"type":"t","data":{"a":' + "[" * n + "]" * n + "}}}"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b'{"scope":"runtime","data":{"type":"ping"}}', "binary frame"),
        (bytearray(b"\x08\x01"), "binary frame"),
        (memoryview(b"\x08\x01"), "binary frame"),
        (None, "text frame"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "exceeds"),
        # Fewer characters than the limit but more UTF-8 bytes.
        (json.dumps({"scope": "runtime", "data": {"type": "t", "data": {
            "p": "é" * (MAX_MESSAGE_BYTES // 2)}}}, ensure_ascii=False), "exceeds"),
        ("{not json", "invalid JSON"),
        ("", "invalid JSON"),
        ('{"scope":"runtime","data":{"type":"t","data":{"v":NaN}}}', "NaN"),
        ('{"scope":"runtime","data":{"type":"t","data":{"v":Infinity}}}', "Infinity"),
        (_deep(30000), "invalid JSON"),
        ("[1, 2]", "must be a JSON object, got array"),
        ('"ping"', "must be a JSON object, got string"),
        ("null", "must be a JSON object, got null"),
        ("42", "must be a JSON object, got number"),
        ('{"data":{"type":"ping"}}', 'no "scope"'),
        ('{"scope":"admin","data":{"type":"ping"}}', "unknown scope"),
        ('{"scope":1,"data":{"type":"ping"}}', "unknown scope"),
        ('{"scope":"Runtime","data":{"type":"ping"}}', "unknown scope"),
        ('{"scope":"runtime"}', 'no "data"'),
        ('{"scope":"runtime","data":"ping"}', '"data" must be an object'),
        ('{"scope":"runtime","data":{"data":{}}}', 'no "type"'),
        ('{"scope":"runtime","data":{"type":null}}', 'no "type"'),
        ('{"scope":"runtime","data":{"type":5}}', '"type" must be a string, got number'),
        ('{"scope":"runtime","data":{"type":""}}', "empty"),
        ('{"scope":"application","data":{"type":"go","data":[1]}}',
         "must be an object, got array"),
        ('{"scope":"application","data":{"type":"go","data":"x"}}',
         "must be an object, got string"),
        ('{"scope":"application","data":{"type":"go","data":3}}',
         "must be an object, got number"),
        ('{"scope":"application","data":{"type":"go","data":true}}',
         "must be an object, got boolean"),
    ],
    ids=lambda v: None if isinstance(v, str) and len(v) < 60 else "long",
)
def test_malformed_frames_raise_protocol_error(raw, reason):
    with pytest.raises(ProtocolError) as info:
        decode(raw)
    assert reason in str(info.value)


def test_protocol_error_is_a_value_error():
    # Callers that guard with `except ValueError` still catch it.
    assert issubclass(ProtocolError, ValueError)


# --- "data" channel: encoding ---------------------------------------------------------


def test_encode_is_compact_and_keeps_non_ascii():
    text = encode("runtime", "sessionEnded", {"reason": "fini, à bientôt"})
    assert text == (
        '{"scope":"runtime","data":{"type":"sessionEnded","data":{"reason":"fini, à bientôt"}}}'
    )


@pytest.mark.parametrize("scope", ["application", "runtime"])
def test_encode_decode_round_trip(scope):
    data = {"n": 1, "x": 0.25, "s": "猫", "l": [1, None, True], "o": {"k": "v"}}
    got = decode(encode(scope, "thing", data))
    assert got == Inbound(scope=scope, type="thing", data=data)


def test_application_sends_the_payload_as_given():
    payload = {"type": "current_prompt", "data": {"prompt": "a dog"}, "extra": 1}
    text = application(payload)
    assert json.loads(text) == {"scope": "application", "data": payload}
    assert " " not in text.replace("a dog", "")
    got = decode(text)
    assert (got.scope, got.type, got.data) == ("application", "current_prompt", {"prompt": "a dog"})


def test_runtime_helper():
    assert json.loads(runtime("modelSchema", {"openapi": "3.1.0"})) == {
        "scope": "runtime",
        "data": {"type": "modelSchema", "data": {"openapi": "3.1.0"}},
    }
    assert json.loads(runtime("ping")) == {"scope": "runtime", "data": {"type": "ping", "data": {}}}


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode("admin", "x", {}),
        lambda: encode("runtime", "", {}),
        lambda: encode("runtime", 3, {}),
        lambda: encode("runtime", "stats", {"fps": float("nan")}),
        lambda: encode("runtime", "stats", {"fps": float("inf")}),
        lambda: encode("runtime", "stats", {"obj": object()}),
        lambda: runtime("stats", {"when": {1, 2}}),
        lambda: application(["not", "a", "dict"]),
        lambda: application({"type": "t", "data": {"v": float("nan")}}),
    ],
)
def test_encoding_bad_messages_raises_protocol_error(call):
    with pytest.raises(ProtocolError):
        call()


# --- "control" channel ----------------------------------------------------------------


def test_decode_control_request():
    raw = json.dumps({"type": "request", "method": "publish_track", "request_id": "r1",
                      "data": {"name": "webcam"}})
    assert decode_control(raw) == {"type": "request", "method": "publish_track",
                                   "request_id": "r1", "data": {"name": "webcam"}}


def test_decode_control_fills_missing_data():
    got = decode_control('{"type":"request","method":"publish_track","request_id":7}')
    assert got["data"] == {}
    assert got["request_id"] == 7


def test_decode_control_notification():
    raw = '{"type":"notification","event":"pause_track","data":{"name":"webcam"}}'
    assert decode_control(raw) == {"type": "notification", "event": "pause_track",
                                   "data": {"name": "webcam"}}


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b'{"type":"request"}', "binary frame"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "exceeds"),
        ("{", "invalid JSON"),
        ("[]", "must be a JSON object"),
        ('{"method":"publish_track","request_id":"1"}', '"type" must be'),
        ('{"type":"response","method":"m","request_id":"1"}', '"type" must be'),
        ('{"type":"request","request_id":"1"}', '"method"'),
        ('{"type":"request","method":3,"request_id":"1"}', '"method"'),
        ('{"type":"request","method":"publish_track"}', '"request_id"'),
        ('{"type":"request","method":"publish_track","request_id":true}', '"request_id"'),
        ('{"type":"request","method":"publish_track","request_id":[1]}', '"request_id"'),
        ('{"type":"request","method":"m","request_id":"1","data":[]}', '"data" must be an object'),
        ('{"type":"notification","data":{"name":"x"}}', '"event"'),
        ('{"type":"notification","event":"pause_track","data":"x"}', '"data" must be an object'),
    ],
)
def test_malformed_control_messages_raise(raw, reason):
    with pytest.raises(ProtocolError) as info:
        decode_control(raw)
    assert reason in str(info.value)


def test_control_response_success():
    request = decode_control('{"type":"request","method":"publish_track","request_id":"r9",'
                             '"data":{"name":"webcam"}}')
    text = control_response(request)
    assert text == '{"type":"response","method":"publish_track","request_id":"r9","data":{}}'
    assert json.loads(control_response(request, {"ok": True}))["data"] == {"ok": True}


def test_control_response_error_keeps_id_type():
    request = decode_control('{"type":"request","method":"publish_track","request_id":12}')
    got = json.loads(control_response(request, error=("unknown_track", "no track 'x'")))
    assert got == {
        "type": "response",
        "method": "publish_track",
        "request_id": 12,
        "data": {},
        "error": {"code": "unknown_track", "message": "no track 'x'"},
    }
