"""Fuzz the data channels of a live session over a real aiortc connection on 127.0.0.1.

A generated corpus of hostile frames (CORPUS; CASES counts it) goes, batch by batch,
to a real `PeerSession` serving the scaffold's gradient model. After every batch: no
handler fault, every unreadable frame dropped and counted, every bad command with a
name answered with a `commandError` naming field and rule (values described, never
echoed raw), video still arriving, a valid command still obeyed, and the session and
its transport still the first and only one. Without the guards, several of these
frames end the session: aiortc closes DTLS on any exception from a "message" handler,
and on a text frame that is not UTF-8.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from itertools import count
from typing import Any

import pytest
from aiortc.rtcsctptransport import WEBRTC_STRING

from reactor_serve.client.peer import ClientPeer
from reactor_serve.protocol import model_documents
from reactor_serve.protocol.channel_codec import (
    MAX_DEPTH,
    MAX_PARSE_DEPTH,
    RULE_MAX_BYTES,
    RULE_UTF8,
)
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.inbound_channel import COMMAND_BURST, COMMAND_RATE, TokenBucket
from reactor_serve.sessions.peer_session import PeerSession

ANY = object()
DEPTH_RULE = f"max_depth={MAX_DEPTH}"
SURROGATE = "<string with a lone surrogate>"


@dataclass(frozen=True)
class Case:
    """One frame to send and what must come of it.

    `how`: "data" or "control" (a text or binary frame on that channel), or
    "data-raw-text" (`payload` bytes sent as a *text* frame, so possibly not UTF-8).
    `expect`: "dropped" (not a valid envelope: ignored and counted), "error" (a
    commandError for `command` with an error of `rule` and `value`, sent by the data
    channel), "refused" (a frame refused whole: ignored and counted like "dropped", and
    answered with a commandError of `rule`, naming `command` where the text shows one,
    else None), "host_error" (a well-formed command the model host rejects: a commandError
    for `command` with `rule`), "reply" (a control request answered with an error
    `code`=`rule`), or "quiet" (valid, needs no answer).
    """

    id: str
    how: str
    payload: str | bytes
    expect: str
    command: str | None = None
    rule: str | None = None
    value: Any = ANY


_names = count()


def _cmd(args_json: str, expect_rule: str, value: Any = ANY, *, case_id: str) -> Case:
    # A unique command name per case, so its commandError can be found by name.
    name = f"fuzz_{next(_names)}"
    raw = '{"scope":"application","data":{"type":"%s","data":%s}}' % (name, args_json)
    return Case(case_id, "data", raw, "error", name, expect_rule, value)


def _drop(case_id: str, payload: str | bytes, how: str = "data") -> Case:
    return Case(case_id, how, payload, "dropped")


def _refused(case_id: str, payload: str | bytes, rule: str, command: str | None = None,
             how: str = "data") -> Case:
    return Case(case_id, how, payload, "refused", command, rule)


def _deep_command(depth: int) -> Case:
    # Issue 19: a command nested 10,000 deep in its args was dropped without a word.
    name = f"fuzz_{next(_names)}"
    raw = ('{"scope":"application","data":{"type":"%s","data":{"brightness":%s%s}},'
           '"id":"deep-%d"}') % (name, "[" * depth, "]" * depth, depth)
    return Case(f"command nested {depth} deep", "data", raw, "refused", name, DEPTH_RULE)


def _envelope(scope: Any, inner: Any) -> str:
    return json.dumps({"scope": scope, "data": inner})


def _not_envelopes() -> list[Case]:
    deep_arrays = "[" * 10_000 + "]" * 10_000
    deep_objects = '{"a":' * 10_000 + "1" + "}" * 10_000
    cases = [
        _drop("null", "null"),
        _drop("empty array", "[]"),
        _drop("array", '[1,"a",{"scope":"runtime"}]'),
        _drop("array of envelope", '[{"scope":"runtime","data":{"type":"ping"}}]'),
        _drop("integer", "42"),
        _drop("negative", "-1"),
        _drop("float", "1.5"),
        _drop("string", '"ping"'),
        _drop("true", "true"),
        _drop("false", "false"),
        _drop("empty", ""),
        _drop("blank", "   "),
        _drop("open brace", "{"),
        _drop("close brace", "}"),
        _drop("mismatched", "{]"),
        _drop("trailing garbage", '{"scope":"runtime","data":{"type":"ping"}} x'),
        _drop("single quotes", "{'scope':'runtime'}"),
        _drop("comment", '{"scope":"runtime"/* hi */}'),
        _drop("not json", "this is not json"),
        _refused("deep arrays 10k", deep_arrays, DEPTH_RULE),
        _refused("deep objects 10k", deep_objects, DEPTH_RULE),
        _refused("deep unclosed 60k", "[" * 60_000, DEPTH_RULE),
        _refused("deep just past parse", "[" * (MAX_PARSE_DEPTH + 1) + "]" * (MAX_PARSE_DEPTH + 1),
                 DEPTH_RULE),
        _deep_command(10_000),
        _deep_command(MAX_PARSE_DEPTH + 1),
        _drop("huge int", "9" * 5000),
        _drop("huge negative int", "-" + "9" * 5000),
        _drop("int past 4300 digits", "1" * 4301),
        _drop("NaN", "NaN"),
        _drop("Infinity", "Infinity"),
        _drop("-Infinity", "-Infinity"),
        _drop("1e309", "1e309"),
        _drop("lone surrogate string", '"\\ud800"'),
        _drop("lone surrogate object", '{"\\udfff":"\\ud800"}'),
        _drop("nul bytes", "\x00\x00\x00"),
        _drop("bom", "\ufeff{}"),
    ]
    return cases


def _transport_junk() -> list[Case]:
    ping = b'{"scope":"runtime","data":{"type":"ping"}}'
    return [
        _drop("binary protobuf", b"\x08\x01\x12\x00"),
        _drop("binary empty", b""),
        _drop("binary json", ping),
        _drop("binary 100k", b"\xff" * 100_000),
        _refused("oversized 70k", '{"scope":"application","data":{"type":"fuzz_big","data":'
                 '{"pad":"' + "a" * 70_000 + '"}},"id":7}', RULE_MAX_BYTES, "fuzz_big"),
        _refused("oversized 200k", "[" * 200_000, RULE_MAX_BYTES),
        _refused("oversized multibyte", '{"p":"' + "猫" * 30_000 + '"}', RULE_MAX_BYTES),
        _refused("utf8 invalid byte", b"\xff\xfe", RULE_UTF8, how="data-raw-text"),
        _refused("utf8 after envelope", ping + b"\xff", RULE_UTF8, how="data-raw-text"),
        _refused("utf8 encoded surrogate",
                 b'{"scope":"runtime","data":{"type":"\xed\xa0\x80"}}', RULE_UTF8,
                 how="data-raw-text"),
        _refused("utf8 truncated in command",
                 b'{"scope":"application","data":{"type":"fuzz_go","data":{"v":"\xc3"}}}',
                 RULE_UTF8, "fuzz_go", how="data-raw-text"),
        _refused("utf8 overlong", b'{"scope":"runtime","data":{"type":"\xc0\xaf"}}', RULE_UTF8,
                 how="data-raw-text"),
    ]


def _bad_envelopes() -> list[Case]:
    ping = {"type": "ping"}
    return [
        _drop("no scope", json.dumps({"data": ping})),
        _drop("scope null", _envelope(None, ping)),
        _drop("scope number", _envelope(1, ping)),
        _drop("scope array", _envelope(["runtime"], ping)),
        _drop("scope object", _envelope({"a": 1}, ping)),
        _drop("scope unknown", _envelope("admin", ping)),
        _drop("scope lone surrogate", '{"scope":"\\ud800","data":{"type":"ping"}}'),
        _drop("scope NaN", '{"scope":NaN,"data":{"type":"ping"}}'),
        _drop("no data", '{"scope":"application"}'),
        _drop("data string", _envelope("application", "set_brightness")),
        _drop("data array", _envelope("application", ["set_brightness"])),
        _drop("data null", _envelope("application", None)),
        _drop("data number", _envelope("runtime", 5)),
        _drop("no type", _envelope("application", {"data": {}})),
        _drop("type null", _envelope("application", {"type": None})),
        _drop("type number", _envelope("application", {"type": 5})),
        _drop("type bool", _envelope("application", {"type": True})),
        _drop("type array", _envelope("application", {"type": ["set_brightness"]})),
        _drop("type object", _envelope("application", {"type": {"a": 1}})),
        _drop("type empty", _envelope("application", {"type": ""})),
        _refused("type lone surrogate", '{"scope":"application","data":{"type":"set_\\ud800"}}',
                 "unicode", SURROGATE),
        _drop("type NaN", '{"scope":"application","data":{"type":NaN}}'),
        _drop("type huge int", '{"scope":"application","data":{"type":' + "7" * 5000 + "}}"),
        _drop("runtime data array", _envelope("runtime", {"type": "ping", "data": [1]})),
        _drop("runtime data NaN", '{"scope":"runtime","data":{"type":"ping","data":{"x":NaN}}}'),
        _drop("runtime deep", '{"scope":"runtime","data":{"type":"requestSchema","data":{"x":'
              + "[" * 100 + "]" * 100 + "}}}"),
        _drop("runtime surrogate key", '{"scope":"runtime","data":{"type":"ping","\\ud800":1}}'),
        Case("runtime unknown type", "data", _envelope("runtime", {"type": "reboot"}), "quiet"),
        Case("runtime unknown type with data", "data",
             _envelope("runtime", {"type": "shutdown", "data": {"now": True}}), "quiet"),
        Case("runtime ping with extra", "data",
             _envelope("runtime", {"type": "ping", "data": {"t": 1}, "x": [1]}), "quiet"),
    ]


def _bad_commands() -> list[Case]:
    return [
        _cmd('{"brightness":NaN}', "finite", "<NaN>", case_id="NaN"),
        _cmd('{"brightness":Infinity}', "finite", "<Infinity>", case_id="Infinity"),
        _cmd('{"brightness":-Infinity}', "finite", "<-Infinity>", case_id="-Infinity"),
        _cmd('{"brightness":1e309}', "out_of_range", "<number too large: 1e309>", case_id="1e309"),
        _cmd('{"brightness":-1e400}', "out_of_range", "<number too large: -1e400>",
             case_id="-1e400"),
        _cmd('{"brightness":1' + "0" * 400 + '.0}', "out_of_range", ANY, case_id="long float"),
        _cmd('{"brightness":' + "9" * 5000 + "}", "out_of_range", "<integer of 5000 digits>",
             case_id="5000 digits"),
        _cmd('{"brightness":' + "1" * 4301 + "}", "out_of_range", "<integer of 4301 digits>",
             case_id="4301 digits"),
        _cmd('{"brightness":%d}' % 2**64, "out_of_range", "<integer of 20 digits>",
             case_id="2**64"),
        _cmd('{"brightness":-%d}' % 2**64, "out_of_range", "<integer of 20 digits>",
             case_id="-2**64"),
        _cmd('{"brightness":"\\ud800"}', "unicode", SURROGATE, case_id="surrogate value"),
        _cmd('{"brightness":"ok\\udc00ok"}', "unicode", SURROGATE, case_id="low surrogate"),
        _cmd('{"brightness":"\\udc00\\ud800"}', "unicode", SURROGATE, case_id="reversed pair"),
        _cmd('{"brightness":["a","\\ud800"]}', "unicode", ["a", SURROGATE],
             case_id="surrogate in list"),
        _cmd('{"brightness":{"\\ud800":1}}', "unicode", {SURROGATE: 1},
             case_id="surrogate nested key"),
        _cmd('{"\\ud800":1}', "unicode", 1, case_id="surrogate key"),
        _cmd('{"brightness":[1,NaN,{"x":1e999}]}', "finite", [1, "<NaN>", {"x": "<number too large: 1e999>"}],
             case_id="mixed nested"),
        _cmd('{"brightness":' + "[" * 33 + "]" * 33 + "}", DEPTH_RULE, "<nested 33 deep>",
             case_id="nested 33"),
        _cmd('{"brightness":' + "[" * 200 + "]" * 200 + "}", DEPTH_RULE, "<nested 200 deep>",
             case_id="nested 200"),
        _cmd('{"brightness":' + '{"a":' * 250 + "1" + "}" * 250 + "}", DEPTH_RULE,
             "<nested 250 deep>", case_id="objects 250"),
        _cmd("[1,2]", "type=object", [1, 2], case_id="args array"),
        _cmd('"bright"', "type=object", "bright", case_id="args string"),
        _cmd("5", "type=object", 5, case_id="args number"),
        _cmd("true", "type=object", True, case_id="args bool"),
        _cmd("NaN", "type=object", "<NaN>", case_id="args NaN"),
        _cmd('"\\ud800"', "type=object", SURROGATE, case_id="args surrogate"),
        _cmd("[" + "1," * 3000 + "1]", "type=object", "<array of 3001 items>",
             case_id="args long array"),
        # Junk beside the arguments: extra envelope keys are ignored, hostile ones named.
        Case("envelope key NaN", "data",
             '{"scope":"application","x":NaN,"data":{"type":"fuzz_env_nan","data":{}}}',
             "error", "fuzz_env_nan", "finite", "<NaN>"),
        Case("inner key surrogate", "data",
             '{"scope":"application","data":{"type":"fuzz_env_sur","\\ud800":1,"data":{}}}',
             "error", "fuzz_env_sur", "unicode", ANY),
    ]


def _host_rejected() -> list[Case]:
    def host(case_id: str, args: Any, rule: str, name: str = "set_brightness") -> Case:
        raw = json.dumps({"scope": "application", "data": {"type": name, "data": args}})
        return Case(case_id, "data", raw, "host_error", name, rule)

    return [
        host("too bright", {"brightness": 7}, "le=2.0"),
        host("negative", {"brightness": -1e308}, "ge=0.0"),
        host("2**63", {"brightness": 2**63}, "le=2.0"),
        host("string", {"brightness": "max"}, "type=float"),
        host("null value", {"brightness": None}, "type=float"),
        host("list value", {"brightness": [1]}, "type=float"),
        host("extra key", {"brightness": 1, "gamma": 2}, "unknown"),
        host("unknown command", {}, "unknown_command", "set_contrast"),
        host("unknown long name", {}, "unknown_command", "x" * 900),
        host("unknown unicode name", {}, "unknown_command", "set_猫_\U0001f600"),
    ]


def _control_junk() -> list[Case]:
    def ctl(case_id: str, payload: str | bytes) -> Case:
        return _drop(case_id, payload, "control")

    def reply(case_id: str, request: dict[str, Any], code: str) -> Case:
        return Case(case_id, "control", json.dumps(request), "reply", None, code)

    return [
        ctl("control null", "null"),
        ctl("control array", "[]"),
        ctl("control deep", "[" * 10_000 + "]" * 10_000),
        ctl("control binary", b"\x00\x01"),
        ctl("control not json", "publish_track"),
        ctl("control no type", '{"method":"publish_track","request_id":"1"}'),
        ctl("control response type", '{"type":"response","method":"m","request_id":"1"}'),
        ctl("control id NaN", '{"type":"request","method":"publish_track","request_id":NaN}'),
        ctl("control id huge", '{"type":"request","method":"publish_track","request_id":'
            + "9" * 5000 + "}"),
        ctl("control id 2**64", '{"type":"request","method":"publish_track","request_id":%d}' % 2**64),
        ctl("control id bool", '{"type":"request","method":"publish_track","request_id":true}'),
        ctl("control method surrogate", '{"type":"request","method":"\\ud800","request_id":"1"}'),
        ctl("control data array", '{"type":"request","method":"m","request_id":"1","data":[]}'),
        ctl("control name deep", '{"type":"request","method":"publish_track","request_id":"1",'
            '"data":{"name":' + "[" * 100 + "]" * 100 + "}}"),
        ctl("control event missing", '{"type":"notification","data":{"name":"x"}}'),
        ctl("control oversized", '{"type":"request","pad":"' + "a" * 70_000 + '"}'),
        _drop("control invalid utf8", b'{"type":"notification","event":"\xff"}', "control-raw-text"),
        reply("control name list", {"type": "request", "method": "publish_track",
                                    "request_id": 1, "data": {"name": [1, 2]}}, "unknown_track"),
        reply("control name object", {"type": "request", "method": "publish_track",
                                      "request_id": "r", "data": {"name": {"a": None}}},
              "unknown_track"),
        reply("control name missing", {"type": "request", "method": "publish_track",
                                       "request_id": 2**63}, "unknown_track"),
        Case("control notification odd data", "control",
             '{"type":"notification","event":"pause_track","data":{"name":[[[]]]}}', "quiet"),
        Case("control unknown method", "control",
             '{"type":"request","method":"reboot","request_id":"z"}', "quiet"),
    ]


BATCHES: dict[str, list[Case]] = {
    batch: [replace(case, id=f"{batch}: {case.id}") for case in make()]
    for batch, make in [
        ("not envelopes", _not_envelopes),
        ("transport junk", _transport_junk),
        ("bad envelopes", _bad_envelopes),
        ("bad commands", _bad_commands),
        ("host rejected", _host_rejected),
        ("control junk", _control_junk),
    ]
}
CORPUS: list[Case] = [case for batch in BATCHES.values() for case in batch]

# Commands in the flood: well past the burst, so that most are dropped however slowly
# this machine delivers them (at most COMMAND_BURST + 200/s of them get through).
FLOOD = 3000

# What the benchmark reports as `fuzz_cases`: every corpus frame and every flood frame.
CASES = len(CORPUS) + FLOOD


# ---- the session under fire ------------------------------------------------------------


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


class StoppedClock:
    """A clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Live:
    host: Any
    peer: PeerSession
    client: ClientPeer
    control: Any
    control_replies: list[dict[str, Any]]
    brightness: float = 1.0


@pytest.fixture
async def live(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = ClientPeer(model_documents.capabilities(host.spec))
    await client.connect(peer.answer)
    # A "control" channel as newer clients open; over the established SCTP association
    # it needs no renegotiation.
    control = client.pc.createDataChannel("control")
    replies: list[dict[str, Any]] = []
    control.on("message", lambda raw: replies.append(json.loads(raw)))
    await client.wait_for(lambda: control.readyState == "open", 60, "control channel open")
    await client.wait_for(lambda: "control" in peer._channels, 60, "control channel seen")
    await _frames_after(client, 2)
    yield Live(host, peer, client, control, replies)
    await client.close()
    await peer.close()


async def _frames_after(client: ClientPeer, n: int) -> None:
    start = client.frames_received
    await client.wait_for(lambda: client.frames_received >= start + n, 60, "video frames")


def _send(live: Live, case: Case) -> None:
    channel = live.control if case.how.startswith("control") else live.client._channel
    if case.how.endswith("-raw-text"):
        # A *text* frame whose bytes we choose: aiortc's send() would encode a str.
        assert isinstance(case.payload, bytes)
        transport = channel.transport
        transport._data_channel_queue.append((channel, WEBRTC_STRING, case.payload))
        asyncio.ensure_future(transport._data_channel_flush())
    else:
        channel.send(case.payload)


def _command_errors(live: Live, mark: int) -> list[dict[str, Any]]:
    return [
        m["data"]["data"]
        for m in live.client.messages[mark:]
        if m.get("scope") == "runtime" and m["data"].get("type") == "commandError"
    ]


async def _sync(live: Live, mark: int) -> list[dict[str, Any]]:
    """Wait until everything the server said about frames sent so far has arrived: a
    sentinel unknown command goes through the same model-thread path as every other
    command, after every frame sent before it, and its commandError comes back last.
    The channels are separate SCTP streams, not ordered with each other, so "control"
    gets a sentinel request of its own."""
    sentinel = f"fuzz_sentinel_{next(_names)}"
    live.client.send_command(sentinel, {})
    live.control.send(json.dumps({"type": "request", "method": "sync", "request_id": sentinel}))
    await live.client.wait_for(
        lambda: any(e["command"] == sentinel for e in _command_errors(live, mark)),
        60, f"the commandError for {sentinel}",
    )
    await live.client.wait_for(
        lambda: any(r.get("request_id") == sentinel for r in live.control_replies),
        60, f"the control reply for {sentinel}",
    )
    return _command_errors(live, mark)


def _replies(live: Live, mark: int) -> list[dict[str, Any]]:
    return [r for r in live.control_replies[mark:]
            if not str(r.get("request_id")).startswith("fuzz_sentinel_")]


async def _still_alive(live: Live) -> None:
    """Video flows, a valid command is obeyed, and the session is still the first."""
    await _frames_after(live.client, 3)
    live.brightness = 0.5 if live.brightness != 0.5 else 1.5
    target = live.brightness
    live.client.send_command("set_brightness", {"brightness": target})
    await live.client.wait_for(
        lambda: live.host.model.state.brightness == target, 60, "the brightness change"
    )
    assert not live.peer.ended.is_set()
    assert live.peer.connections == 1  # not a reconnect that hid a lost transport
    assert live.client.pc.connectionState == "connected"
    assert live.client.channel_open and live.control.readyState == "open"


def _has_error(errors: list[dict[str, Any]], rule: str, value: Any) -> bool:
    return any(e["rule"] == rule and (value is ANY or e["value"] == value) for e in errors)


async def test_the_corpus_is_what_it_says():
    assert len(CORPUS) == sum(len(b) for b in BATCHES.values())
    assert len({c.id for c in CORPUS}) == len(CORPUS), "case ids are unique"
    expects = {c.expect for c in CORPUS}
    assert expects == {"dropped", "refused", "error", "host_error", "reply", "quiet"}
    assert CASES >= 150


@pytest.mark.parametrize("batch", list(BATCHES))
async def test_a_batch_of_hostile_frames_leaves_the_session_streaming(live, batch):
    cases = BATCHES[batch]
    handler = live.peer.inbound
    before = (handler.counters.ignored, handler.counters.rejected, handler.counters.faults)
    ignored_before = live.peer.ignored_frames
    mark, control_mark = len(live.client.messages), len(live.control_replies)
    for case in cases:
        _send(live, case)
    errors = await _sync(live, mark)

    # Every unreadable frame was dropped and counted; nothing broke a handler.
    dropped = sum(c.expect in ("dropped", "refused") for c in cases)
    refused = [c for c in cases if c.expect == "refused"]
    rejected = sum(c.expect == "error" for c in cases) + len(refused)
    assert handler.counters.faults == before[2] == 0
    assert handler.counters.ignored - before[0] == dropped
    assert live.peer.ignored_frames - ignored_before == dropped
    assert handler.counters.rejected - before[1] == rejected
    assert handler.counters.rate_limited == 0

    # Every bad command with a name got its commandError, naming field and rule, with
    # the value described; and nothing else was answered.
    for case in cases:
        mine = [e for e in errors if e["command"] == case.command]
        if case.expect == "error":
            assert len(mine) == 1, case.id
            assert _has_error(mine[0]["errors"], case.rule, case.value), (case.id, mine)
            assert mine[0]["message"], case.id
        elif case.expect == "host_error":
            assert any(_has_error(e["errors"], case.rule, ANY) for e in mine), (case.id, mine)
        elif case.expect == "refused" and case.command is not None:
            assert len(mine) == 1 and _has_error(mine[0]["errors"], case.rule, None), case.id
    # Refused frames that name no command: one error each, naming the rule broken.
    unnamed = [c.rule for c in refused if c.command is None]
    assert sorted(e["errors"][0]["rule"] for e in errors if e["command"] is None) == sorted(unnamed)
    host_names = {c.command for c in cases if c.expect in ("host_error", "refused")}
    expected = rejected + sum(c.expect == "host_error" for c in cases) + 1  # + the sentinel
    assert len(errors) == expected, [str(e["command"])[:30] for e in errors]
    assert all(e["command"] in host_names or e["command"].startswith("fuzz_") for e in errors)

    # Control requests were answered (with an error where the track is unknown).
    replies = [c for c in cases if c.expect == "reply" or
               (c.expect == "quiet" and c.how == "control" and '"request"' in str(c.payload))]
    got = _replies(live, control_mark)  # all in: _sync waited for the control sentinel
    assert len(got) == len(replies)
    if replies:
        for case, reply in zip(replies, got):
            assert reply["type"] == "response"
            if case.expect == "reply":
                assert reply["error"]["code"] == case.rule, case.id
            else:
                assert "error" not in reply, case.id

    # The state is untouched by all of it, and the session streams on.
    assert live.host.model.state.brightness == live.brightness
    await _still_alive(live)


async def test_all_batches_back_to_back_on_one_session(live):
    # The same corpus without pauses between batches: state that one hostile frame
    # leaves behind must not trip the next.
    handler = live.peer.inbound
    mark = len(live.client.messages)
    for case in CORPUS:
        _send(live, case)
    errors = await _sync(live, mark)
    assert handler.counters.faults == 0
    assert handler.counters.ignored == sum(c.expect in ("dropped", "refused") for c in CORPUS)
    named = {e["command"] for e in errors}
    assert all(c.command in named for c in CORPUS if c.expect in ("error", "host_error", "refused"))
    await _still_alive(live)


async def test_a_command_flood_is_limited_with_one_error_and_the_session_goes_on(live):
    # Commands that are not setters (here: unknown ones) keep the rate limit's rule:
    # past the burst they are dropped, with one error for the flood.
    handler = live.peer.inbound
    # The bucket's clock stands still during the flood: however slowly a loaded machine
    # delivers it, it is one flood, and exactly the burst gets through.
    clock = StoppedClock()
    handler.bucket = TokenBucket(COMMAND_RATE, COMMAND_BURST, clock=clock)
    mark = len(live.client.messages)
    for i in range(FLOOD):
        live.client.send_command("fuzz_flood", {"n": i})
    await live.client.wait_for(
        lambda: handler.counters.commands + handler.counters.rate_limited >= FLOOD,
        # Generous: each admitted unknown command costs a model-thread hop and a
        # commandError back, so a loaded 2-core machine takes tens of seconds.
        120, "the flood to arrive",
    )
    assert handler.counters.rate_limited == FLOOD - COMMAND_BURST
    assert handler.counters.commands == COMMAND_BURST
    limited = await live.client.wait_for(
        lambda: [e for e in _command_errors(live, mark)
                 if any(x["rule"] == "rate_limited" for x in e["errors"])],
        60, "the rate_limited commandError",
    )
    # One for the whole flood, not one per dropped command.
    assert len(limited) == 1
    assert limited[0]["command"] == "fuzz_flood"
    assert limited[0]["errors"] == [{"field": None, "rule": "rate_limited", "value": None}]
    assert handler.counters.faults == 0

    # Once the client slows down, commands are obeyed again; the session never ended.
    clock.now += 2 * COMMAND_BURST / COMMAND_RATE
    # The refilled bucket admits it: the model's own state says when it applied.
    live.client.send_command("set_brightness", {"brightness": 0.25})
    await live.client.wait_for(
        lambda: live.host.model.state.brightness == 0.25, 60, "brightness 0.25 after the flood"
    )
    live.brightness = 0.25
    await _frames_after(live.client, 3)
    assert not live.peer.ended.is_set() and live.peer.connections == 1
    assert live.client.pc.connectionState == "connected"
    # Still only the one rate_limited error: admitted commands alone do not re-arm it.
    assert len([e for e in _command_errors(live, mark)
                if any(x["rule"] == "rate_limited" for x in e["errors"])]) == 1
    assert COMMAND_BURST < FLOOD


async def test_a_setter_flood_ends_on_the_last_value_without_an_error(live):
    # Issue 19: 1000 set_brightness in one burst, the last 0.25. Setters past the rate
    # limit are held, newest value per field, and handed on as tokens come back. The
    # limiter's clock stands still while the flood arrives, as it would for a flood
    # faster than the rate however slowly a loaded machine reads it; then it moves on.
    handler = live.peer.inbound
    now = [0.0]
    handler.bucket = TokenBucket(COMMAND_RATE, COMMAND_BURST, clock=lambda: now[0])
    mark = len(live.client.messages)
    for i in range(999):
        live.client.send_command("set_brightness", {"brightness": 0.4 + (i % 150) / 100})
    live.client.send_command("set_brightness", {"brightness": 0.25})
    await live.client.wait_for(
        lambda: handler.counters.commands + handler.counters.held >= 1000,
        60, "the flood to arrive",
    )
    assert handler.counters.held > 0  # the burst was exceeded
    now[0] += 60.0  # the tokens come back
    await live.client.wait_for(
        lambda: live.host.model.state.brightness == 0.25, 60, "the last value"
    )
    live.brightness = 0.25
    assert handler.counters.rate_limited == 0
    assert not [e for e in _command_errors(live, mark) if e["command"] == "set_brightness"]
    stats = live.peer.stats()
    assert stats["commands_coalesced"] >= handler.counters.coalesced > 0
    await _still_alive(live)
