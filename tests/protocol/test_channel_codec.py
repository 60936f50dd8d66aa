"""The data-channel codec of docs/protocol.md: "data" envelopes and "control" messages."""

import json

import pytest

from reactor_serve.protocol.channel_codec import (
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


# --- hostile frames: decode is total, and names what it refuses --------------------------

import math  # noqa: E402
import random  # noqa: E402

from reactor_serve.protocol.channel_codec import MAX_PARSE_DEPTH, BadCommand  # noqa: E402
from reactor_serve.runtime.field_errors import (  # noqa: E402
    MAX_DEPTH,
    Unrepresentable,
    command_error,
    describe_value,
)
from reactor_serve.runtime.log_throttle import LogThrottle  # noqa: E402
from reactor_serve.sessions.inbound_channel import InboundHandler, TokenBucket  # noqa: E402


def command(args_json, name="set_x"):
    return '{"scope":"application","data":{"type":"%s","data":%s}}' % (name, args_json)


@pytest.mark.parametrize(
    "args, field, rule, value",
    [
        ('{"x":NaN}', "x", "finite", "<NaN>"),
        ('{"x":Infinity}', "x", "finite", "<Infinity>"),
        ('{"x":-Infinity}', "x", "finite", "<-Infinity>"),
        ('{"x":1e309}', "x", "out_of_range", "<number too large: 1e309>"),
        ('{"x":-1e309}', "x", "out_of_range", "<number too large: -1e309>"),
        ('{"x":' + "9" * 5000 + "}", "x", "out_of_range", "<integer of 5000 digits>"),
        ('{"x":-' + "9" * 5000 + "}", "x", "out_of_range", "<integer of 5000 digits>"),
        ('{"x":%d}' % (2**63 + 1), "x", "out_of_range", "<integer of 19 digits>"),
        ('{"x":"\\ud800"}', "x", "unicode", "<string with a lone surrogate>"),
        ('{"x":["ok","a\\udfffb"]}', "x", "unicode", ["ok", "<string with a lone surrogate>"]),
        ('{"\\udc00":1}', "<string with a lone surrogate>", "unicode", 1),
        ('{"x":' + "[" * 200 + "]" * 200 + "}", "x", f"max_depth={MAX_DEPTH}", "<nested 200 deep>"),
        ('{"x":{"y":[1,NaN]}}', "x", "finite", {"y": [1, "<NaN>"]}),
        ("[1,2]", None, "type=object", [1, 2]),
        ("7", None, "type=object", 7),
        ('"go"', None, "type=object", "go"),
        ("NaN", None, "type=object", "<NaN>"),
    ],
)
def test_a_command_with_unsendable_arguments_is_a_bad_command(args, field, rule, value):
    with pytest.raises(BadCommand) as info:
        decode(command(args))
    exc = info.value
    assert exc.command == "set_x"
    assert {"field": field, "rule": rule, "value": value} in exc.errors
    # What the client gets back is strict JSON, UTF-8 encodable.
    text = runtime("commandError", command_error(exc.command, str(exc), exc.errors))
    text.encode("utf-8")
    assert json.loads(text)["data"]["data"]["errors"] == exc.errors


def test_every_bad_field_is_named_and_good_ones_are_not():
    with pytest.raises(BadCommand) as info:
        decode(command('{"a":NaN,"b":2,"c":"\\ud800"}'))
    assert [e["field"] for e in info.value.errors] == ["a", "c"]


def test_junk_around_a_command_is_named_too():
    raw = '{"scope":"application","data":{"type":"go","data":{},"extra":NaN}}'
    with pytest.raises(BadCommand) as info:
        decode(raw)
    assert info.value.errors == [{"field": None, "rule": "finite", "value": "<NaN>"}]


def test_integers_up_to_64_bits_and_finite_floats_decode():
    got = decode(command('{"a":%d,"b":-%d,"c":1e308,"d":-0.0,"e":1e-400}' % (2**63, 2**63)))
    assert got.data == {"a": 2**63, "b": -(2**63), "c": 1e308, "d": -0.0, "e": 0.0}


def test_a_value_nested_exactly_max_depth_decodes():
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert decode(command('{"x":%s}' % nested)).data["x"] is not None
    with pytest.raises(BadCommand):
        decode(command('{"x":[%s]}' % nested))


def test_escaped_surrogate_pairs_are_fine():
    assert decode(command('{"x":"\\ud83d\\ude00"}')).data == {"x": "\U0001f600"}


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("[" * 60_000, "nested 60000 deep"),
        ('{"a":' * 5000 + "1" + "}" * 5000, "nested 5000 deep"),
        ("[" * (MAX_PARSE_DEPTH + 1) + "]" * (MAX_PARSE_DEPTH + 1), "invalid JSON"),
        ('{"scope":"runtime","data":{"type":"ping","data":{"v":1e999}}}', "out_of_range"),
        ('{"scope":"runtime","data":{"type":"ping","data":{"v":' + "1" * 4400 + "}}}",
         "integer of 4400 digits"),
        ('{"scope":"runtime","data":{"type":"ping","data":{"\\ud800":1}}}', "unicode"),
        ('{"scope":"runtime","data":{"type":"ping","x":' + "[" * 40 + "]" * 40 + "}}",
         "max_depth"),
        ('{"scope":"application","data":{"type":"\\ud800"}}', "lone surrogate"),
        ('{"scope":"\\ud800","data":{"type":"x"}}', "unknown scope"),
        ('{"scope":"application","data":{"type":NaN}}', "<NaN>"),
        ('{"scope":"app\udcffx","data":{"type":"x"}}', "not valid UTF-8"),  # raw lone surrogate
        ("\udcff\udcfe", "not valid UTF-8"),
    ],
    ids=lambda v: None if isinstance(v, str) and len(v) < 60 and v.isascii() else "x",
)
def test_hostile_frames_raise_protocol_error_only(raw, reason):
    with pytest.raises(ProtocolError) as info:
        decode(raw)
    assert not isinstance(info.value, BadCommand)
    assert reason in str(info.value)
    str(info.value).encode("utf-8")  # fit for a log line


@pytest.mark.parametrize(
    "raw",
    [
        '{"type":"request","method":"publish_track","request_id":' + "9" * 5000 + "}",
        '{"type":"request","method":"publish_track","request_id":%d}' % (2**64),
        '{"type":"request","method":"publish_track","request_id":"r","data":{"name":NaN}}',
        '{"type":"request","method":"\\ud800","request_id":"r"}',
        '{"type":"notification","event":"pause_track","data":{"name":' + "[" * 300 + "]" * 300 + "}}",
        "[" * 50_000,
        "null",
    ],
    ids=range(7),
)
def test_hostile_control_messages_raise_protocol_error(raw):
    with pytest.raises(ProtocolError):
        decode_control(raw)


def test_outgoing_lone_surrogates_are_escaped_not_fatal():
    text = runtime("x", {"s": "a\ud800b"})
    text.encode("utf-8")  # the data channel can send it
    assert json.loads(text)["data"]["data"]["s"] == "a\ud800b"


# --- describing values for commandError ------------------------------------------------


@pytest.mark.parametrize(
    "value, described",
    [
        (float("nan"), "<NaN>"),
        (float("inf"), "<Infinity>"),
        (float("-inf"), "<-Infinity>"),
        (10**5000, "<integer of 5001 digits>"),
        (-(2**64), "<integer of 20 digits>"),
        ("\ud800", "<string with a lone surrogate>"),
        ({"\udc80": [float("nan")]}, {"<string with a lone surrogate>": ["<NaN>"]}),
        ("x" * 5000, "<string of 5000 characters>"),
        (list(range(2000)), "<array of 2000 items>"),
        (Unrepresentable("<NaN>", "finite"), "<NaN>"),
        (1.5, 1.5),
        ("ok", "ok"),
        (None, None),
        (True, True),
        ([1, {"a": "b"}], [1, {"a": "b"}]),
    ],
    ids=range(15),
)
def test_describe_value(value, described):
    assert describe_value(value) == described


def test_describe_value_of_a_very_deep_or_cyclic_value():
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert describe_value(deep) == "<nested more than 10000 deep>"
    cyclic: list = []
    cyclic.append(cyclic)
    assert describe_value(cyclic) == "<nested more than 10000 deep>"
    shallow: list = []
    for _ in range(200):
        shallow = [shallow]
    assert describe_value(shallow) == "<nested 201 deep>"


def test_command_error_always_serialises():
    huge = 10**5000
    data = command_error(
        "set_\ud800",
        "x=\ud800 breaks unicode" + "!" * 10_000,
        [
            {"field": "\udfff", "rule": "unicode", "value": "\ud800"},
            {"field": "n", "rule": "finite", "value": float("nan")},
            {"field": "i", "rule": "out_of_range", "value": huge},
            {"field": "o", "rule": "type", "value": object()},
        ],
    )
    text = json.dumps(data, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert data["command"] == "<string with a lone surrogate>"
    assert [e["value"] for e in data["errors"][:3]] == [
        "<string with a lone surrogate>", "<NaN>", "<integer of 5001 digits>"]
    assert len(data["message"]) <= 2048


# --- property: decode returns an Inbound or raises ProtocolError, nothing else ----------

_ATOMS = [
    None, True, False, 0, -1, 2**63, 2**63 + 1, -(2**70), 10**30, 0.5, -1e-300, 1e308,
    float("nan"), float("inf"), float("-inf"), "", "x", "猫", "\ud800", "a\udfffb",
    "\U0001f600", '"', "\\", "\x00", "[" * 10, "NaN",
]


def _random_tree(rng: random.Random, depth: int) -> object:
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(_ATOMS)
    if roll < 0.45:
        # A long thin spike: deep nesting without a big frame.
        spike: object = rng.choice(_ATOMS)
        for _ in range(rng.choice([5, 31, 33, 100, 300, 2000])):
            spike = [spike] if rng.random() < 0.5 else {"k": spike}
        return spike
    if roll < 0.7:
        return [_random_tree(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    keys = ["scope", "data", "type", "x", "brightness", "\udc00", "猫", ""]
    return {rng.choice(keys): _random_tree(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def _random_envelope(rng: random.Random) -> object:
    # Mostly near-valid envelopes, so the fuzz reaches past the first checks.
    if rng.random() < 0.3:
        return _random_tree(rng, 5)
    inner = {"type": rng.choice(["set_x", "ping", "requestSchema", "", 5, None, "\ud800"])}
    if rng.random() < 0.9:
        inner["data"] = (_random_tree(rng, 4) if rng.random() < 0.4
                         else {"x": _random_tree(rng, 4)})
    return {"scope": rng.choice(["application", "runtime", "other", None, 1]), "data": inner}


def _serialise(rng: random.Random, tree: object) -> str | bytes:
    try:
        text = json.dumps(tree, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    except (ValueError, RecursionError):  # ints past the str digit limit, very deep spikes
        text = '{"scope":"application","data":{"type":"x","data":' + "[" * 3000 + "]" * 3000 + "}}"
    mutation = rng.random()
    if mutation < 0.1 and text:
        cut = rng.randrange(len(text))
        text = text[:cut]
    elif mutation < 0.2 and text:
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice("[]{}\",:\\ \ud800x1e9") + text[i + 1:]
    elif mutation < 0.25:
        return text.encode("utf-8", "surrogatepass")
    return text


def _assert_total(raw: object, decoder=decode) -> str:
    try:
        got = decoder(raw)
    except BadCommand as exc:
        data = command_error(exc.command, str(exc), exc.errors)
        json.dumps(data, allow_nan=False, ensure_ascii=False).encode("utf-8")
        assert exc.errors, "a BadCommand names at least one field"
        return "bad_command"
    except ProtocolError as exc:
        str(exc)
        return "protocol_error"
    # Anything decoded is plain data that can be sent back as strict JSON.
    if decoder is decode:
        assert isinstance(got, Inbound)
        encode(got.scope, got.type, got.data).encode("utf-8")
    else:
        control_response(got).encode("utf-8")
    return "decoded"


def test_property_random_json_trees_decode_or_raise_protocol_error():
    rng = random.Random(20261123)
    outcomes: dict[str, int] = {}
    for _ in range(3000):
        raw = _serialise(rng, _random_envelope(rng))
        for decoder in (decode, decode_control):
            outcome = _assert_total(raw, decoder)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The generator reaches every outcome, so the property is not vacuous.
    assert set(outcomes) == {"decoded", "bad_command", "protocol_error"}, outcomes


def test_property_random_bytes_and_text_decode_or_raise_protocol_error():
    rng = random.Random(7)
    alphabet = '{}[]",:0123456789-+.eE \\ntrufalsNIinfyaT\ud800\udc00猫'
    for _ in range(3000):
        size = rng.choice([0, 1, 2, 5, 20, 200, 5000])
        blob = bytes(rng.getrandbits(8) for _ in range(size))
        text = "".join(rng.choice(alphabet) for _ in range(size))
        for raw in (blob, blob.decode("latin-1"), blob.decode("utf-8", "surrogateescape"), text):
            _assert_total(raw, decode)
            _assert_total(raw, decode_control)


# --- the inbound handler: routing, described errors, rate limit -------------------------


class FakeSpec:
    inputs: list = []
    outputs: list = []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_handler(bucket=None):
    sent: list[dict] = []
    commands: list[tuple[str, dict]] = []
    handler = InboundHandler(
        session_id="s",
        command=lambda name, args, command_id: commands.append((name, args)),
        send=lambda text: sent.append(json.loads(text)),
        send_control=lambda text: sent.append(json.loads(text)),
        spec=FakeSpec,
        bucket=bucket,
    )
    return handler, sent, commands


def test_handler_routes_commands_and_answers_bad_ones_with_described_errors():
    handler, sent, commands = make_handler()
    handler.on_message("data", command('{"x":1}'))
    handler.on_message("data", command('{"x":NaN}'))
    handler.on_message("data", "null")
    handler.on_message("data", b"\x00\x01")
    assert commands == [("set_x", {"x": 1})]
    assert [m["data"]["type"] for m in sent] == ["commandError"]
    assert sent[0]["data"]["data"]["errors"] == [{"field": "x", "rule": "finite", "value": "<NaN>"}]
    assert (handler.counters.ignored, handler.counters.rejected, handler.counters.frames) == (2, 1, 4)


def test_handler_never_raises_even_if_the_session_does():
    def boom(name, args, command_id):
        raise RuntimeError("model side broke")

    handler = InboundHandler(session_id="s", command=boom, send=lambda t: None,
                             send_control=lambda t: None, spec=FakeSpec)
    handler.on_message("data", command('{"x":1}'))
    assert handler.counters.faults == 1


def test_control_name_of_any_type_is_answered_not_raised():
    handler, sent, _ = make_handler()
    handler.on_message(
        "control", '{"type":"request","method":"publish_track","request_id":1,"data":{"name":[1]}}')
    assert sent[0]["error"]["code"] == "unknown_track"
    assert handler.counters.faults == 0


def test_token_bucket_refills_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.1
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now -= 5  # a clock stepping back drains nothing and adds nothing
    assert bucket.take() is False


def test_a_command_flood_gets_one_rate_limited_error_then_commands_work_again():
    clock = Clock()
    handler, sent, commands = make_handler(TokenBucket(rate=100, burst=10, clock=clock))
    for i in range(1000):
        clock.now += 0.001  # 1000 commands a second against a limit of 100
        handler.on_message("data", command('{"x":%d}' % i))
    limited = [m for m in sent if m["data"]["data"]["errors"][0]["rule"] == "rate_limited"]
    assert len(limited) == 1  # coalesced across the whole flood
    assert 105 <= len(commands) <= 111  # the burst, plus 100/s over the second it lasted
    assert handler.counters.rate_limited == 1000 - len(commands)
    # The client slows down: commands flow again, and a later flood is reported anew.
    clock.now += 10
    handler.on_message("data", command('{"x":-1}'))
    assert commands[-1] == ("set_x", {"x": -1})
    for i in range(50):
        handler.on_message("data", command('{"x":%d}' % i))
    assert len([m for m in sent if m["data"]["data"]["errors"][0]["rule"] == "rate_limited"]) == 2


def test_pings_are_never_rate_limited():
    clock = Clock()
    handler, sent, commands = make_handler(TokenBucket(rate=1, burst=1, clock=clock))
    for _ in range(100):
        handler.on_message("data", '{"scope":"runtime","data":{"type":"ping"}}')
    handler.on_message("data", command('{"x":1}'))
    assert commands == [("set_x", {"x": 1})] and handler.counters.rate_limited == 0


def test_log_throttle_caps_lines_per_window(caplog):
    import logging

    clock = Clock()
    logger = logging.getLogger("test.throttle")
    throttle = LogThrottle(logger, lines=3, window_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for i in range(100):
            throttle.warning("bad frame %d", i)
        assert len(caplog.records) == 3
        clock.now += 10
        throttle.warning("after")
    assert "97 more data-channel warnings suppressed" in caplog.records[3].getMessage()
    assert caplog.records[4].getMessage() == "after"


def test_nan_is_not_a_float_in_decoded_data():
    # Belt and braces for the property above: no non-finite float survives decode.
    got = decode(command('{"x":[1e308, -1e308, 0.1]}'))
    assert all(math.isfinite(v) for v in got.data["x"])


# ---- command ids and inputLatency reports (issue 13) -----------------------------


def test_a_command_id_reaches_the_session_and_bad_ids_are_refused_naming_the_field():
    seen: list[tuple[str, dict, object]] = []
    sent: list[dict] = []
    handler = InboundHandler(
        session_id="s",
        command=lambda name, args, command_id: seen.append((name, args, command_id)),
        send=lambda text: sent.append(json.loads(text)),
        send_control=lambda text: None,
        spec=FakeSpec,
    )
    envelope = '{"scope":"application","data":{"type":"set_x","data":{"x":1}},"id":%s}'
    for good in ('"c1"', "7", "null"):
        handler.on_message("data", envelope % good)
    assert [c[2] for c in seen] == ["c1", 7, None]
    for bad in ('""', '"' + "x" * 65 + '"', "1.5", "true", "[1]", "{}", "NaN",
                str(2**53), r'"\ud800"'):
        handler.on_message("data", envelope % bad)
    assert len(seen) == 3  # none of the bad ones reached the model
    errors = [m["data"]["data"] for m in sent]
    assert len(errors) == 9 and all(m["data"]["type"] == "commandError" for m in sent)
    assert all(e["errors"][0]["field"] == "id" for e in errors), errors
    # A valid id is named in the error about the command's arguments.
    handler.on_message("data", '{"scope":"application","data":{"type":"set_x","data":{"x":NaN}},"id":"c9"}')
    assert sent[-1]["data"]["data"]["id"] == "c9"


def test_input_latency_reports_reach_the_session_and_hostile_ones_never_raise():
    reports: list[tuple[object, object]] = []
    handler = InboundHandler(
        session_id="s",
        command=lambda name, args, command_id: None,
        send=lambda text: None,
        send_control=lambda text: None,
        spec=FakeSpec,
        report_latency=lambda command_id, ms: reports.append((command_id, ms)) or None,
    )
    handler.on_message("data", '{"scope":"runtime","data":{"type":"inputLatency","data":{"id":"c1","latency_ms":80.5}}}')
    for data in ("[]", '"x"', '{"id":{"a":[[[[1]]]]},"latency_ms":NaN}', '{"latency_ms":1e999}', "null"):
        handler.on_message("data", '{"scope":"runtime","data":{"type":"inputLatency","data":%s}}' % data)
    assert reports[0] == ("c1", 80.5)
    assert handler.counters.faults == 0


# --- setters past the rate limit are held, newest value wins (issue 19) -------------------

from reactor_serve.protocol import channel_codec  # noqa: E402


class SetterSpec(FakeSpec):
    commands = {
        "set_x": type("Setter", (), {"kind": "setter"})(),
        "poke": type("Event", (), {"kind": "event"})(),
    }


def held_handler(clock, rate=10, burst=2):
    sent, commands, timers, coalesced = [], [], [], []
    handler = InboundHandler(
        session_id="s",
        command=lambda name, args, command_id: commands.append((name, args, command_id)),
        send=lambda text: sent.append(json.loads(text)),
        send_control=lambda text: None,
        spec=lambda: SetterSpec,
        bucket=TokenBucket(rate=rate, burst=burst, clock=clock),
        on_coalesced=lambda: coalesced.append(1),
        call_later=lambda delay, callback: timers.append((delay, callback)),
    )
    return handler, sent, commands, timers, coalesced


def test_setters_past_the_limit_are_held_newest_first_and_released_on_a_token():
    clock = Clock()
    handler, sent, commands, timers, coalesced = held_handler(clock)
    for value in range(1000):
        handler.on_message("data", channel_codec.command("set_x", {"x": value}, f"c{value}"))
    # The burst went on; the rest coalesced into one held value, with no error.
    assert commands == [("set_x", {"x": 0}, "c0"), ("set_x", {"x": 1}, "c1")]
    assert sent == [] and handler.counters.rate_limited == 0
    assert handler.counters.held == 998 and handler.counters.coalesced == 997 == len(coalesced)
    # One timer, due when the bucket has a token again.
    assert len(timers) == 1 and timers[0][0] == pytest.approx(0.1)
    clock.now = 0.1
    timers.pop()[1]()
    assert commands[-1] == ("set_x", {"x": 999}, "c999")
    assert timers == []  # nothing left to release


def test_a_held_setter_is_released_before_a_newer_command_takes_its_token():
    clock = Clock()
    handler, _, commands, timers, _ = held_handler(clock, burst=1)
    handler.on_message("data", channel_codec.command("set_x", {"x": 1}))
    handler.on_message("data", channel_codec.command("set_x", {"x": 2}))  # held
    clock.now = 0.1  # one token back, before the timer fires
    handler.on_message("data", channel_codec.command("set_x", {"x": 3}))
    # 2 went out on the token; 3 waits for the next one, never landing before 2.
    assert [args["x"] for _, args, _ in commands] == [1, 2]
    clock.now = 0.2
    timers[-1][1]()
    assert [args["x"] for _, args, _ in commands] == [1, 2, 3]


def test_events_past_the_limit_are_still_dropped_with_one_named_error():
    clock = Clock()
    handler, sent, commands, timers, _ = held_handler(clock)
    for _ in range(10):
        handler.on_message("data", channel_codec.command("poke", {}))
    assert len(commands) == 2 and handler.counters.rate_limited == 8
    errors = [m["data"]["data"] for m in sent]
    assert [(e["command"], e["errors"][0]["rule"]) for e in errors] == [("poke", "rate_limited")]
    assert timers == []


def test_held_setters_are_bounded_by_the_fields_not_the_flood():
    clock = Clock()
    handler, _, _, _, _ = held_handler(clock, burst=1)
    for value in range(10_000):
        handler.on_message("data", channel_codec.command("set_x", {"x": value}))
    assert len(handler._held) == 1


# --- frames refused whole are answered, not dropped without a word (issue 19) -------------


def test_a_command_nested_10000_deep_gets_a_command_error_naming_it():
    handler, sent, commands = make_handler()
    deep = "[" * 10_000 + "]" * 10_000
    raw = ('{"scope":"application","data":{"type":"set_x","data":{"x":%s}},"id":"d1"}' % deep)
    handler.on_message("data", raw)
    assert commands == []
    [error] = [m["data"]["data"] for m in sent]
    assert error["command"] == "set_x" and error["id"] == "d1"
    assert error["errors"] == [{"field": None, "rule": f"max_depth={MAX_DEPTH}", "value": None}]
    assert "nested 10003 deep" in error["message"]  # with the envelope's three levels
    assert handler.counters.ignored == 1 and handler.counters.faults == 0


@pytest.mark.parametrize("raw, rule, name", [
    ('{"scope":"application","data":{"type":"set_x","data":{"x":"' + "a" * 70_000 + '"}}}',
     channel_codec.RULE_MAX_BYTES, "set_x"),
    ('{"scope":"application","data":{"type":"set_x","data":{"x":"\udcff"}}}',
     channel_codec.RULE_UTF8, "set_x"),
    ('{"scope":"application","data":{"type":"set_\\ud800"}}', "unicode",
     "<string with a lone surrogate>"),
    ("[" * 300, f"max_depth={MAX_DEPTH}", None),
])
def test_frames_refused_whole_get_a_command_error_naming_the_rule(raw, rule, name):
    handler, sent, commands = make_handler()
    handler.on_message("data", raw)
    [error] = [m["data"]["data"] for m in sent]
    assert error["command"] == name and error["errors"][0]["rule"] == rule
    assert commands == [] and handler.counters.faults == 0


def test_salvage_is_best_effort_and_never_raises():
    assert channel_codec.salvage_command(b"\x00") == (None, None)
    assert channel_codec.salvage_command('{"scope":"runtime","data":{"type":"ping"}}') == (None, None)
    assert channel_codec.salvage_command('{"scope":"application","data":{"type":"a"},"id":"\\ud800"}') \
        == ("a", None)
    assert channel_codec.salvage_command('{"scope":"application","id":12,"data":{"type":"b\\"c"}}') \
        == ('b"c', 12)
