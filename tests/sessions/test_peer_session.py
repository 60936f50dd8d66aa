"""A model session over real aiortc peers on this host (127.0.0.1 candidates only).

Nothing here asserts a speed: every wait is for a frame, a message or a state, with a
deadline (`WAIT_S`) that only fails a test that would otherwise hang.
"""

import asyncio
import time

import numpy as np
import pytest
from paths import ROOT, TEST_MODELS
from waits import within_deadline

from reactor_serve.client.peer import ClientPeer
from reactor_serve.protocol import model_documents
from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime import ModelHost
from reactor_serve.runtime.pacing.emission_clock import EmissionClock
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.peer_session import PeerSession

REFERENCE = TEST_MODELS / "reference"
EXAMPLES = ROOT / "examples"
# Real peers, a model thread and codecs on a shared, loaded machine.
WAIT_S = 60.0


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


@pytest.fixture
async def serve(host_of):
    """Start a model and return a function that opens a WebRTC session to it."""
    peers = []
    clients = []

    async def open_session(model, settings=None, *, inputs=None, ping=True):
        host = model if isinstance(model, ModelHost) else host_of(model)
        # Grace 0: these tests end a session by closing the client's connection, as
        # before orphaned sessions existed (tests/sessions/test_seated_sessions.py has those).
        peer = PeerSession(
            host, settings or WebRTCSettings(loopback_candidates=True, reconnect_grace_s=0)
        )
        client = ClientPeer(model_documents.capabilities(host.spec), inputs=inputs)
        if not ping:
            client._ping = _no_ping.__get__(client)  # a client that has gone silent
        peers.append(peer)
        clients.append(client)
        await client.connect(peer.answer, timeout=WAIT_S)
        return host, peer, client

    yield open_session
    for client in clients:
        await client.close()
    for peer in peers:
        await peer.close()


async def _no_ping(self):
    return None


def mean_of(client, track="main_video"):
    return float(client.video[track][-1].image.mean())


async def frames_after(client, count, track="main_video", timeout=WAIT_S):
    start = client.frames_received
    await client.wait_for(lambda: client.frames_received >= start + count, timeout,
                          f"{count} more frames")
    return client.video[track][-1]


async def test_video_arrives_with_its_size_and_moves(serve, gradient_dir):
    before = time.monotonic()  # earlier than the emission clock's start
    host, peer, client = await serve(gradient_dir)
    first = await frames_after(client, 1)
    assert first.image.shape == (480, 640, 3)

    # A slow model may leave the clock holding its last frame for a while: the
    # picture moving is waited for, not assumed to have happened ten frames later.
    def moved():
        latest = client.video["main_video"][-1]
        if latest.index >= first.index + 10 and not np.array_equal(first.image, latest.image):
            return latest
        return None

    later = await client.wait_for(moved, WAIT_S, "a frame ten or more on that moved")
    assert not np.array_equal(first.image, later.image)
    assert later.pts > first.pts  # pts from the emission clock, 90 kHz
    # pts is on the 90 kHz emission clock. A loaded machine may emit slower than
    # 30 fps or drop frames, never faster: the span is at least the frames'
    # worth at the clock's fastest rate (its bounded speed-up below 30 fps). Each
    # pts is its slot's time since the clock started, so it can never run ahead of
    # the time that really passed; how late a frame arrived plays no part.
    span = (later.pts - first.pts) / 90000
    fastest = 30 * (1 + EmissionClock.MAX_CORRECTION)
    assert span >= (later.index - first.index) / fastest
    assert later.pts / 90000 <= later.arrived_at - before
    await client.close()
    await within_deadline(peer.ended.wait(), "the session to end after the client closed")
    assert peer.end_reason == "client_closed"


async def test_brightness_command_changes_the_picture(serve, gradient_dir):
    host, peer, client = await serve(gradient_dir)
    await frames_after(client, 3)
    bright = mean_of(client)
    client.send_command("set_brightness", {"brightness": 0.2})
    await client.wait_for(lambda: mean_of(client) < bright * 0.4, WAIT_S, "darker frames")
    assert host.model.state.brightness == 0.2
    await client.close()


async def test_bad_commands_get_command_errors_and_change_nothing(serve, gradient_dir):
    host, peer, client = await serve(gradient_dir)
    await frames_after(client, 2)
    cases = [
        ('{"scope":"application","data":{"type":"set_brightness","data":{"brightness":7}}}',
         "le=2.0"),
        ('{"scope":"application","data":{"type":"set_brightness","data":{"brightness":"max"}}}',
         "type=float"),
        ('{"scope":"application","data":{"type":"set_contrast","data":{"contrast":1}}}',
         "unknown_command"),
        ('{"scope":"application","data":{"type":"set_brightness","data":[1,2]}}',
         "type=object"),
    ]
    for raw, rule in cases:
        mark = len(client.messages)
        client.send_raw(raw)
        reply = await client.wait_for(
            lambda: next(
                (m for m in client.messages[mark:] if m["data"]["type"] == "commandError"), None
            ),
            WAIT_S,
            "commandError",
        )
        assert reply["scope"] == "runtime"
        assert reply["data"]["data"]["errors"][0]["rule"] == rule
    # Not JSON, binary, oversized: ignored, and the session goes on.
    client.send_raw("this is not json")
    client.send_raw(b"\x08\x01\x12\x00")
    client.send_raw('{"scope":"application","data":{"type":"x","data":{"pad":"' + "a" * 70000 + '"}}}')
    # What the peer did with them is read from its count, not assumed to be done once
    # some frames went by.
    await client.wait_for(lambda: peer.ignored_frames >= 3, WAIT_S, "the three bad frames ignored")
    await frames_after(client, 5)
    assert host.model.state.brightness == 1.0
    assert peer.ignored_frames >= 3
    assert not peer.ended.is_set()
    await client.close()


async def test_schema_and_capabilities_match_the_model(serve, gradient_dir):
    host, peer, client = await serve(gradient_dir)
    mark = len(client.messages)
    client.send_runtime("requestSchema", {})
    client.send_runtime("requestCapabilities", {})
    doc = await client.wait_for(
        lambda: next((m["data"]["data"] for m in client.messages[mark:]
                      if m["data"]["type"] == "modelSchema"), None), WAIT_S, "modelSchema")
    caps = await client.wait_for(
        lambda: next((m["data"]["data"] for m in client.messages[mark:]
                      if m["data"]["type"] == "modelCapabilities"), None), WAIT_S, "caps")
    assert doc["info"]["title"] == "gradient"
    post = doc["paths"]["/events/set_brightness"]["post"]
    prop = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["brightness"]
    assert prop["minimum"] == 0.0 and prop["maximum"] == 2.0
    assert caps["commands"][0]["name"] == "set_brightness"
    assert caps["commands"][0]["schema"]["brightness"]["maximum"] == 2.0
    assert caps["tracks"] == [{"name": "main_video", "kind": "video", "direction": "recvonly"}]
    await client.close()


async def test_stats_arrive_periodically(serve, gradient_dir):
    settings = WebRTCSettings(loopback_candidates=True, stats_interval_s=0.2, reconnect_grace_s=0)
    host, peer, client = await serve(gradient_dir, settings)
    await client.wait_for(lambda: client.stats.get("presented", 0) > 0, WAIT_S, "stats")
    # The rate the clock ticks at depends on how fast a loaded machine produces; what
    # the stats must carry is the model's 30 fps target and a tick rate the clock can
    # have: never above its bounded speed-up over that target.
    assert client.stats["target_fps"] == 30
    fastest = 30 * (1 + EmissionClock.MAX_CORRECTION)
    assert EmissionClock.MIN_FPS <= client.stats["fps"] <= fastest, client.stats
    assert "queue_depth" in client.stats and "dropped" in client.stats
    await client.close()


async def test_webcam_frames_come_back_transformed_and_buffers_reset(serve, host_of):
    host = host_of(REFERENCE / "v2v")
    camera = np.zeros((96, 128, 3), np.uint8)
    camera[:, :64] = 200
    for round_ in range(2):
        _, peer, client = await serve(host, inputs={"camera": camera})
        client.send_command("set_style", {"style": "sketch"})  # invert, in this model
        frame = await client.wait_for(
            lambda: next((f for f in client.video.get("main_video", ())
                          if f.image.shape == (96, 128, 3) and f.image[:, 100:].mean() > 200), None),
            WAIT_S,
            "an inverted camera frame",
        )
        assert frame.image[:, :40].mean() < 80  # the bright half came back dark
        await client.close()
        await within_deadline(peer.ended.wait(), "the session to end after the client closed")
        # @disconnected closed the buffer (and flushed); the next @connected reopens it.
        assert host.input_buffers["camera"].closed
    assert host.model_errors == 0


async def test_silent_client_is_ended_by_the_watchdog_and_next_client_works(serve, gradient_dir, host_of):
    host = host_of(gradient_dir)
    # The watchdog counts the silence only once frames have arrived: how long that
    # takes is the machine's business, and a 1 s idle timeout from the start would
    # race it. The timer reads its timeout on every check.
    settings = WebRTCSettings(loopback_candidates=True, idle_timeout_s=WAIT_S, reconnect_grace_s=0)
    _, peer, client = await serve(host, settings, ping=False)
    await frames_after(client, 2)
    peer._timer.silence.idle_timeout_s = 1.0
    await within_deadline(peer.ended.wait(), "the watchdog to end the silent session")
    assert peer.end_reason == "timeout"
    ended = [m for m in client.messages if m["data"]["type"] == "sessionEnded"]
    assert ended and ended[0]["data"]["data"]["reason"] == "timeout"
    assert host.session is None  # the slot is free
    await client.close()
    _, peer2, client2 = await serve(host)
    frame = await frames_after(client2, 2)
    assert frame.image.shape == (480, 640, 3)
    await client2.close()


async def test_messages_arrive_with_snake_case_types(serve, host_of):
    host = host_of(REFERENCE / "run_loop")
    _, peer, client = await serve(host)
    message = await client.wait_for(
        lambda: next((m for m in client.messages if m["scope"] == "application"), None),
        WAIT_S,
        "a model message",
    )
    assert message["data"]["type"] == "progress"
    assert set(message["data"]["data"]) == {"step", "total"}
    await client.close()


async def test_reconnect_keeps_the_session_and_state(serve, gradient_dir):
    host, peer, client = await serve(gradient_dir)
    client.send_command("set_brightness", {"brightness": 0.5})
    await client.wait_for(lambda: host.model.state.brightness == 0.5, WAIT_S, "state change")
    session = peer.session
    second = ClientPeer(model_documents.capabilities(host.spec))
    # A new offer on the same session: PUT sdp_params.
    await second.connect(peer.answer, timeout=WAIT_S)
    await frames_after(second, 3)
    assert peer.session is session and not peer.ended.is_set()
    assert host.model.state.brightness == 0.5
    assert peer.connections == 2
    await second.close()
    await client.close()


async def test_malformed_offer_and_mapping_are_rejected(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    with pytest.raises(OfferRejected, match="SDP"):
        await peer.answer("v=0 garbage", [])
    client = ClientPeer({"tracks": [{"name": "main_video", "kind": "video", "direction": "recvonly"}]})

    async def bad_mapping(sdp, mapping):
        mapping[0]["name"] = "nope"
        return await peer.answer(sdp, mapping)

    with pytest.raises(OfferRejected, match="no output track 'nope'"):
        await client.connect(bad_mapping, timeout=WAIT_S)
    await client.close()
    await peer.close()


async def test_server_never_opens_a_data_channel_and_ignores_unmapped_lines(serve, gradient_dir):
    host, peer, client = await serve(gradient_dir)
    # The only channel is the client's own "data".
    assert list(peer._channels) == ["data"]
    await client.close()


async def test_trickled_candidates_connect_an_offer_without_candidates(host_of, gradient_dir):
    host = host_of(gradient_dir)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    client = ClientPeer(model_documents.capabilities(host.spec))
    trickled = []

    async def signal(sdp, mapping):
        lines = sdp.splitlines()
        mid = None
        kept = []
        for line in lines:
            if line.startswith("a=mid:"):
                mid = line[len("a=mid:"):]
            if line.startswith("a=candidate:"):
                trickled.append({"candidate": line[2:], "sdpMid": mid})
            elif line != "a=end-of-candidates":
                kept.append(line)
        answer_task = asyncio.create_task(peer.answer("\r\n".join(kept) + "\r\n", mapping))
        await peer.add_ice_candidates(trickled, is_final=True)
        return await answer_task

    await client.connect(signal, timeout=WAIT_S)
    assert trickled
    frame = await frames_after(client, 2)
    assert frame.image.shape == (480, 640, 3)
    with pytest.raises(OfferRejected, match="not an ICE candidate"):
        await peer.add_ice_candidates([{"candidate": "candidate:nonsense", "sdpMid": "0"}])
    await client.close()
    await peer.close()
