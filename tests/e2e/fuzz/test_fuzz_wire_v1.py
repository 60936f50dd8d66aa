"""Fuzz wire v1 on a live session over a real aiortc connection on 127.0.0.1.

The client here is a bare aiortc peer speaking protobuf from its first frame, as the
official Python SDK does. Random bytes, truncated and mutated messages, huge varints
and lengths, Struct nesting past the parser's limit, unknown fields and enum values,
JSON on a v1 connection and a command flood go to a real `PeerSession` serving the
scaffold's gradient model. Afterwards: no handler fault, every request whose id can be
read answered exactly once (accepted, BAD_REQUEST or RATE_LIMITED), video still
arriving, a valid command still applied, the first and only transport still up.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from bare_peer import BarePeer, open_bare_peer, wait_for

from reactor_serve.protocol.wire_v1 import common_pb2, control_pb2, data_pb2
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.inbound_channel import COMMAND_BURST, COMMAND_RATE, TokenBucket
from reactor_serve.sessions.peer_session import PeerSession

REQUEST = common_pb2.MESSAGE_KIND_REQUEST


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def command(name: str, data: dict[str, Any] | None = None, request_id: str = "") -> bytes:
    message = data_pb2.DataClientMessage(request_id=request_id, kind=REQUEST)
    message.command.type = name
    if data is not None:
        message.command.data.update(data)
    return message.SerializeToString()


def deeply_nested_command(request_id: str, depth: int) -> bytes:
    """A command whose one argument is a list nested `depth` deep, built by hand:
    the protobuf library will not serialise past its own recursion limit."""
    value = field_bytes(3, b"deep")  # Value.string_value
    for _ in range(depth):
        value = field_bytes(6, field_bytes(1, value))  # Value.list_value.values[0]
    entry = field_bytes(1, b"prompt") + field_bytes(2, value)  # Struct.fields entry
    command_body = field_bytes(1, b"set_brightness") + field_bytes(2, field_bytes(1, entry))
    return field_bytes(1, request_id.encode()) + field_bytes(10, command_body)


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


@pytest.fixture
async def live(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = await open_bare_peer(peer)
    yield host, peer, client
    await client.close()
    await peer.close()


def answered(client: BarePeer) -> dict[str, list[Any]]:
    ids: dict[str, list[Any]] = {}
    for label in ("data", "control"):
        for reply in client.replies[label]:
            if not isinstance(reply, str) and reply.request_id:
                ids.setdefault(reply.request_id, []).append(reply)
    return ids


async def still_alive(host, peer, client, brightness: float) -> None:
    start = client.frames
    await wait_for(lambda: client.frames >= start + 3, 60, "video after the fuzz")
    client.data.send(command("set_brightness", {"brightness": brightness}, "check"))
    await wait_for(lambda: "check" in answered(client), 60, "the check command's answer")
    [reply] = answered(client)["check"]
    assert reply.WhichOneof("payload") is None  # accepted
    await wait_for(lambda: host.model.state.brightness == brightness, 60, "the brightness change")
    assert not peer.ended.is_set()
    assert peer.connections == 1
    assert client.pc.connectionState == "connected"


async def test_hostile_v1_frames_are_answered_or_dropped_and_the_session_streams(live):
    host, peer, client = live
    rng = random.Random(20)
    expect_bad: set[str] = set()
    expect_ok: set[str] = set()

    # Requests whose id survives the damage: each gets BAD_REQUEST.
    good = command("set_brightness", {"brightness": 0.5}, "trunc")
    client.data.send(good[:-4]); expect_bad.add("trunc")
    client.data.send(deeply_nested_command("deep", 200)); expect_bad.add("deep")
    client.data.send(command("set_brightness", {"brightness": math.nan}, "nan")); expect_bad.add("nan")
    client.data.send(command("set_brightness", {"brightness": math.inf}, "inf")); expect_bad.add("inf")
    client.data.send(command("set_brightness", {"brightness": 9}, "range")); expect_bad.add("range")
    client.data.send(command("no_such_command", {}, "unknown")); expect_bad.add("unknown")
    client.data.send(command("", {}, "nameless")); expect_bad.add("nameless")
    client.data.send(field_bytes(1, b"empty")); expect_bad.add("empty")  # no payload
    client.data.send(command("set_brightness", {"brightness": "x" * 70_000}, "big")); expect_bad.add("big")
    bad_utf8 = field_bytes(1, b"utf8") + field_bytes(10, field_bytes(1, b"set_\xff"))
    client.data.send(bad_utf8); expect_bad.add("utf8")
    control = control_pb2.ControlClientMessage(request_id="no track")
    control.publish_track.name = "nothing"
    client.control.send(control.SerializeToString()); expect_bad.add("no track")

    # Unknown fields and enum values are ignored: accepted.
    odd = bytearray(command("set_brightness", {"brightness": 0.7}, "odd"))
    odd += varint(2 << 3) + varint(77)  # kind = 77
    odd += field_bytes(99, b"\x00\x01")  # field 99
    client.data.send(bytes(odd)); expect_ok.add("odd")

    # No readable id: dropped, never answered.
    unreadable = [
        b"\x0a\xff\xff\xff\xff\x0f",  # a 4 GiB request_id
        b"\x0a" + b"\xff" * 11,  # a varint that never ends
        b"\x08" + b"\xff" * 9 + b"\x7f",  # an 64-bit varint for a string field
        '{"scope":"application","data":{"type":"set_brightness","data":{}}}',  # v0 on v1
    ] + [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(150)]
    for raw in unreadable:
        rng.choice([client.data, client.control]).send(raw)

    mark = client.frames
    await wait_for(lambda: expect_bad | expect_ok <= set(answered(client)), 20,
                   "an answer to every request with a readable id")
    ids = answered(client)
    for request_id in expect_bad:
        [reply] = ids[request_id]
        assert reply.error.code == "BAD_REQUEST", (request_id, reply)
        assert reply.error.message
    assert "brightness" in ids["nan"][0].error.message
    assert "brightness" in ids["range"][0].error.message
    assert "nothing" in ids["no track"][0].error.message
    assert ids["odd"][0].WhichOneof("payload") is None
    # Random bytes may by chance read as a request with an id; each such is answered once.
    assert all(len(replies) == 1 for replies in ids.values())
    assert peer.inbound.counters.faults == 0
    assert client.frames >= mark
    await still_alive(host, peer, client, 1.25)


async def test_a_v1_command_flood_answers_every_command_and_the_session_goes_on(live):
    host, peer, client = live
    # The limiter's clock stands still while the flood arrives, as it would for a flood
    # faster than the rate however slowly a loaded machine reads it (read slowly enough,
    # the bucket refilled and only the model host's full queue refused any: RATE_LIMITED
    # came back, the bucket's count stayed 0); then it moves on.
    now = [0.0]
    peer.inbound.bucket = TokenBucket(COMMAND_RATE, COMMAND_BURST, clock=lambda: now[0])
    sent = [f"flood{i}" for i in range(1500)]
    for request_id in sent:
        client.data.send(command("no_such_command", {}, request_id))
    await wait_for(lambda: set(sent) <= set(answered(client)), 120, "an answer to every command")
    codes = {reply.error.code for request_id in sent for reply in answered(client)[request_id]}
    # Those within the rate limit reach the model host, which refuses the unknown
    # command; the rest are refused for the rate, each one.
    assert codes == {"BAD_REQUEST", "RATE_LIMITED"}
    assert peer.inbound.counters.rate_limited > 0
    assert peer.inbound.counters.faults == 0
    now[0] += 60.0  # the tokens come back
    await still_alive(host, peer, client, 0.75)


def step(request_id: str, **fields: Any) -> bytes:
    message = data_pb2.DataClientMessage(request_id=request_id, kind=REQUEST)
    message.request_step.SetInParent()
    for name, value in fields.items():
        getattr(message.request_step, name).CopyFrom(value)
    return message.SerializeToString()


def step_with(request_id: str, build: Any) -> bytes:
    message = data_pb2.DataClientMessage(request_id=request_id, kind=REQUEST)
    message.request_step.SetInParent()
    build(message.request_step)
    return message.SerializeToString()


@pytest.fixture
async def stepped(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    peer.generation = "stepped"
    client = await open_bare_peer(peer, chunking=64 * 1024 * 1024, video_frames=0)
    yield host, peer, client
    await client.close()
    await peer.close()


async def test_hostile_step_requests_are_each_answered_and_the_session_steps_on(stepped):
    from reactor_serve.protocol.wire_v1 import step_pb2

    host, peer, client = stepped
    assert client.chunked
    refused = {
        "state type": lambda r: r.state.update({"brightness": "max"}),
        "state field": lambda r: r.state.update({"contrast": 1}),
        "state nan": lambda r: r.state.update({"brightness": math.nan}),
        "command": lambda r: r.commands.add(type="no_such_command"),
        "nameless": lambda r: r.commands.add(type=""),
        "track": lambda r: r.media_input.add(track="nothing").frames.add(
            encoding=step_pb2.FRAME_ENCODING_RAW, shape=[2, 2, 3], data=bytes(12)),
    }
    for request_id, build in refused.items():  # one at a time, as steps run
        client.send("data", step_with(request_id, build))
        await wait_for(lambda: request_id in answered(client), 60, f"the answer to {request_id}")
    # Damaged step requests whose id is readable: BAD_REQUEST, like any frame.
    whole = step("trunc", state=_struct({"brightness": 0.5}))
    client.send("data", whole[:-3])
    # Unreadable: dropped.
    rng = random.Random(7)
    for _ in range(50):
        client.send("data", field_bytes(11, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))))
    await wait_for(lambda: set(refused) | {"trunc"} <= set(answered(client)), 30,
                   "an answer to every step request")
    ids = answered(client)
    for request_id in refused:
        [reply] = ids[request_id]
        assert reply.step_result.failure_code == step_pb2.STEP_FAILURE_CODE_REFUSED, request_id
        assert reply.step_result.error
    assert "brightness" in ids["state type"][0].step_result.error
    assert "nothing" in ids["track"][0].step_result.error
    assert ids["trunc"][0].error.code == "BAD_REQUEST"
    assert all(len(replies) == 1 for replies in ids.values())
    # It steps on: one unit, made with the step's state.
    client.send("data", step("real", state=_struct({"brightness": 0.5})))
    await wait_for(lambda: "real" in answered(client), 60, "the real step's result")
    [result] = answered(client)["real"]
    assert result.step_result.failure_code == 0 and result.step_result.step == 1
    [track] = result.step_result.tracks
    assert track.track == "main_video" and len(track.frames) >= 1
    assert host.model.state.brightness == 0.5
    assert client.frames == 0  # a stepped session streams nothing
    # A step asked for while one runs is not ready; the one running answers.
    client.send("data", step("first"))
    client.send("data", step("second"))
    await wait_for(lambda: {"first", "second"} <= set(answered(client)), 60, "both answers")
    assert answered(client)["first"][0].step_result.step == 2
    assert answered(client)["second"][0].step_result.failure_code == step_pb2.STEP_FAILURE_CODE_NOT_READY
    assert peer.inbound.counters.faults == 0 and not peer.ended.is_set()


def _struct(values: dict[str, Any]) -> Any:
    from google.protobuf import struct_pb2

    struct = struct_pb2.Struct()
    struct.update(values)
    return struct
