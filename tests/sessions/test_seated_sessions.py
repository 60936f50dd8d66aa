"""A session's life on one host: created -> waiting -> streaming -> orphaned -> ended.

PeerSession and SeatedSessionBackend over real aiortc peers on 127.0.0.1, plus the runtime's
side (input buffers per session, the bounded command queue). Grace windows are short
(1 to 2 s) to keep the tests quick; nothing here asserts a speed. Every wait is for a
state or an event, with a deadline (`WAIT_S`) generous enough for a loaded machine.
"""

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from conftest import connected
from waits import within_deadline

from reactor_serve.client.peer import ClientPeer
from reactor_serve.interface import (
    Input,
    InputField,
    InputState,
    Output,
    ReactorModel,
    ReactorPipeline,
    Video,
    VideoModel,
    event,
    get_ctx,
)
from reactor_serve.interface import (
    connected as on_connect,
)
from reactor_serve.interface import (
    disconnected as on_disconnect,
)
from reactor_serve.local.app import create_app
from reactor_serve.protocol import model_documents
from reactor_serve.protocol.errors import ModelBusy, OfferRejected, UnknownSession
from reactor_serve.rtc.settings import WebRTCSettings, WebRTCSettingsError
from reactor_serve.runtime.input_buffer import InputBuffer
from reactor_serve.scaffold import init_model
from reactor_serve.sessions.candidates import parse_candidates
from reactor_serve.sessions.contract import ClientIdentity, SessionState
from reactor_serve.sessions.peer_session import PeerSession
from reactor_serve.sessions.seated_sessions import SeatedSessionBackend

# --------------------------------------------------------------------------- models


@dataclass
class Out(Output):
    main_video: Video


@dataclass
class LevelState(InputState):
    level: int = InputField(default=200, ge=0, le=255)


class Level(ReactorModel):
    """Emits flat frames of `state.level` as fast as the output buffer takes them, and
    counts its hooks."""

    state: LevelState
    output: Out
    fps = 30
    # A deep queue: a stale backlog would show for a full second.
    buffer_size = 30

    def load(self, config):
        self.connects = 0
        self.disconnects = 0
        self.connect_delay = 0.0

    @on_connect
    async def hello(self):
        self.connects += 1
        await asyncio.sleep(self.connect_delay)  # a slow hook, for the tests that need one

    @on_disconnect
    def bye(self):
        self.disconnects += 1

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                image = np.full((64, 64, 3), self.state.level, np.uint8)
                await self.emit(Out(main_video=image))


# Real peers, a model thread and codecs on a shared, loaded machine: a deadline is
# only there to fail a test that would otherwise hang.
WAIT_S = 60.0


def settings(**kw):
    return WebRTCSettings(loopback_candidates=True, **kw)


async def wait_until(predicate, timeout=WAIT_S, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # the poll interval; the deadline above is the bound


async def frames_after(client, count, timeout=WAIT_S):
    start = client.frames_received
    await client.wait_for(lambda: client.frames_received >= start + count, timeout,
                          f"{count} more frames")
    return client.video["main_video"][-1]


def ended_messages(client):
    return [m["data"]["data"] for m in client.messages if m["data"]["type"] == "sessionEnded"]


@pytest.fixture
async def clients():
    made = []

    def make(host, **kw):
        client = ClientPeer(model_documents.capabilities(host.spec), **kw)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def peers():
    made = []

    def make(host, settings_, **kw):
        peer = PeerSession(host, settings_, **kw)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        await peer.close()


# --------------------------------------------------------------------------- settings


def test_reconnect_grace_setting_defaults_and_validates():
    assert WebRTCSettings().reconnect_grace_s == 30
    assert WebRTCSettings.from_config({"webrtc": {"reconnect_grace_s": 0}}).reconnect_grace_s == 0
    with pytest.raises(WebRTCSettingsError, match="reconnect_grace_s"):
        WebRTCSettings.from_config({"webrtc": {"reconnect_grace_s": -1}})


# --------------------------------------------------------------------------- PeerSession


async def test_lost_transport_orphans_and_a_new_offer_resumes_with_state(host_of, peers, clients, caplog):
    caplog.set_level(logging.INFO, logger="reactor_serve.sessions")
    host = host_of(Level)
    states = []
    # The grace only has to outlast the test's own steps, however slow the machine.
    peer = peers(host, settings(reconnect_grace_s=WAIT_S),
                 on_state=lambda p, s: states.append(s))
    assert peer.state == SessionState.CREATED
    first = clients(host)
    await first.connect(peer.answer, timeout=WAIT_S)
    assert peer.state == SessionState.STREAMING
    first.send_command("set_level", {"level": 120})
    await wait_until(lambda: host.model.state.level == 120, what="the command")
    await frames_after(first, 2)

    await first.close()  # no stop_session: a network blip until proven otherwise
    await wait_until(lambda: peer.state == SessionState.ORPHANED, what="orphaned")
    # The operator's log says so, naming the session only as far as telling it apart.
    orphaned = [r.getMessage() for r in caplog.records if "orphaned for up to" in r.getMessage()]
    # How the server learnt of the close (the DTLS alert, or the path failing) is aiortc's.
    assert len(orphaned) == 1 and re.fullmatch(
        rf"session {re.escape(peer.id[:4])}…: transport (closed|failed); orphaned for up to {WAIT_S:g} s",
        orphaned[0]), orphaned
    assert peer.id not in caplog.text
    assert not peer.ended.is_set() and host.session is peer.session
    assert host.model.disconnects == 0  # the model is not told
    assert 0 < peer.grace_remaining() <= WAIT_S
    # Output pauses: nothing is presented, the bounded buffer fills, emit waits.
    await wait_until(lambda: host.output_buffer.depth() == host.output_buffer.capacity,
                     what="a full output buffer")
    presented = peer.session.clock.presented
    # A negative check: a slow machine only presents less during it, never more.
    await asyncio.sleep(0.3)
    assert peer.session.clock.presented == presented

    second = clients(host)
    await second.connect(peer.answer, timeout=WAIT_S)  # the JS SDK's reconnect(): a new offer
    assert peer.state == SessionState.STREAMING
    await frames_after(second, 3)
    assert peer.session.clock.presented > presented
    assert host.model.state.level == 120 and host.model.connects == 1
    assert host.model.disconnects == 0 and peer.connections == 2
    assert states == ["waiting", "streaming", "orphaned", "streaming"]


async def test_resume_presents_fresh_frames_not_the_backlog(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings(reconnect_grace_s=WAIT_S))  # outlasts the test's steps
    first = clients(host)
    await first.connect(peer.answer, timeout=WAIT_S)
    frame = await frames_after(first, 3)
    assert frame.image.mean() > 150
    await first.close()
    await wait_until(lambda: peer.state == SessionState.ORPHANED, what="orphaned")
    await wait_until(lambda: host.output_buffer.depth() == host.output_buffer.capacity,
                     what="a backlog of bright frames")
    host.model.state.level = 60  # what the model makes from now on
    dropped = host.output_buffer.dropped
    # Every frame since the resume is kept, however many a slow machine repeats.
    second = clients(host, keep_frames=100_000)
    await second.connect(peer.answer, timeout=WAIT_S)

    def fresh():
        return any(40 < f.image.mean() < 80 for f in second.video.get("main_video", ()))

    await second.wait_for(fresh, WAIT_S, "a fresh (level 60) frame after the resume")
    received = list(second.video["main_video"])
    assert received[0].index == 0  # none has been let go
    means = [f.image.mean() for f in received]
    # The queued bright frames are dropped, not presented: how many frames came
    # before a fresh one depends on the machine's speed (the clock holds the last
    # frame meanwhile), so the drop is read from the buffer's own count.
    assert host.output_buffer.dropped - dropped >= host.output_buffer.capacity
    assert all(m > 30 for m in means), means  # the last frame held: never a black flash


async def test_orphaned_session_ends_after_the_grace_and_runs_disconnected(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings(reconnect_grace_s=1))
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await frames_after(client, 2)
    await client.close()
    await within_deadline(peer.ended.wait(), "the session to end")
    assert peer.state == SessionState.ENDED
    assert peer.end_reason == "timeout"
    assert peer.end_detail == "the client did not reconnect within 1 s"
    assert host.model.disconnects == 1 and host.session is None
    late = clients(host)
    with pytest.raises(UnknownSession, match=r"ended \(timeout: the client did not reconnect"):
        await late.connect(peer.answer, timeout=WAIT_S)


async def test_silent_client_is_orphaned_by_the_watchdog(host_of, peers, clients):
    host = host_of(Level)
    # What the model was told is read when the session orphans: the 1 s grace may
    # well be over by the time a loaded machine gets back to the test.
    seen = []
    peer = peers(host, settings(reconnect_grace_s=1, idle_timeout_s=0.5),
                 on_state=lambda p, s: seen.append((s, host.model.disconnects)))
    client = clients(host)
    client._ping = _no_ping.__get__(client)  # a client that has gone silent
    await client.connect(peer.answer, timeout=WAIT_S)
    await within_deadline(peer.ended.wait(), "the session to end")
    assert ("orphaned", 0) in seen, seen
    assert peer.end_reason == "timeout" and "did not reconnect" in peer.end_detail


async def _no_ping(self):
    return None


async def test_a_connection_slower_to_come_up_than_the_idle_timeout_streams(host_of, peers, clients):
    host = host_of(Level)
    states = []
    # Silence counts from the moment the connection is up: a connection may take far
    # longer than idle_timeout_s to come up (a busy client or server) and still stream.
    peer = peers(host, settings(idle_timeout_s=0.5, reconnect_grace_s=WAIT_S),
                 on_state=lambda p, s: states.append(s))
    client = clients(host)

    async def slow_answer(sdp_offer, track_mapping):
        answer = await peer.answer(sdp_offer, track_mapping)
        # Past the idle timeout before the client even applies the answer: only more
        # of it passes on a loaded machine.
        await asyncio.sleep(2.0)
        return answer

    await client.connect(slow_answer, timeout=WAIT_S)
    await frames_after(client, 3)
    assert peer.state == SessionState.STREAMING
    assert states == ["waiting", "streaming"], states


def _never_applied(peer, answered):
    """A client's signal whose offer `peer` answers (setting `answered`) and whose
    answer never reaches the client's connection."""

    async def signal(sdp_offer, track_mapping):
        await peer.answer(sdp_offer, track_mapping)
        answered.set()
        await asyncio.Event().wait()

    return signal


async def test_a_connection_that_never_comes_up_is_a_lost_transport_after_connect_timeout(
    host_of, peers, clients, caplog,
):
    host = host_of(Level)
    # The timeout is the behaviour under test; the idle one is far longer, so it is the
    # connect window that ends the session.
    caplog.set_level(logging.INFO, logger="reactor_serve.sessions.peer_session")
    peer = peers(host, settings(idle_timeout_s=WAIT_S, connect_timeout_s=1.0, reconnect_grace_s=0))
    client = clients(host)
    answered = asyncio.Event()
    connecting = asyncio.ensure_future(
        client.connect(_never_applied(peer, answered), timeout=3 * WAIT_S))
    try:
        await within_deadline(peer.ended.wait(), "the session to end")
    finally:
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
    assert answered.is_set()
    assert peer.end_reason == "timeout"
    assert peer.end_detail == "the connection did not come up within 1 s"
    # The log says where it got to: the client's candidates came (in its offer), and
    # ICE never found a path, since the client never learnt the server's.
    said = [r.getMessage() for r in caplog.records if "did not come up" in r.getMessage()]
    assert len(said) == 1 and re.search(
        r"within 1 s \(connection \w+, ICE (new|checking), [1-9]\d* local and [1-9]\d* "
        r"remote candidates, DTLS new, SCTP \w+\)$", said[0]), said


async def test_a_connection_up_without_a_channel_has_the_connect_timeout_not_the_idle_one(
    host_of, peers, caplog,
):
    # ICE, DTLS and SCTP connect, but the client never announces a channel (its one is
    # pre-negotiated, so no open message goes out): it cannot speak, so it is not up.
    # Its silence must not be counted against idle_timeout_s (the session would end
    # as silent); it ends when connect_timeout_s runs out, saying it never came up.
    caplog.set_level(logging.INFO, logger="reactor_serve.sessions.peer_session")
    host = host_of(Level)
    peer = peers(host, settings(idle_timeout_s=0.5, connect_timeout_s=3.0, reconnect_grace_s=0))
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("video", direction="recvonly")
        pc.createDataChannel("data", negotiated=True, id=0)
        await pc.setLocalDescription(await pc.createOffer())
        mapping = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]
        answer = await peer.answer(pc.localDescription.sdp, mapping)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await within_deadline(peer.ended.wait(), "the session to end")
    finally:
        await pc.close()
    assert peer.end_reason == "timeout"
    assert peer.end_detail == "the connection did not come up within 3 s"
    said = [r.getMessage() for r in caplog.records if "did not come up" in r.getMessage()]
    # It got as far as SCTP: connected, every transport, and still not up.
    assert len(said) == 1 and said[0].endswith("DTLS connected, SCTP connected)"), said


async def test_a_session_stopped_while_its_connection_comes_up_logs_where_it_got_to(
    host_of, peers, clients, caplog,
):
    caplog.set_level(logging.INFO, logger="reactor_serve.sessions.peer_session")
    host = host_of(Level)
    peer = peers(host, settings(idle_timeout_s=WAIT_S))
    client = clients(host)
    answered = asyncio.Event()
    connecting = asyncio.ensure_future(
        client.connect(_never_applied(peer, answered), timeout=3 * WAIT_S))
    try:
        await within_deadline(answered.wait(), "the answer")
        await peer.close()  # the client gave up, as an SDK does after its own window
    finally:
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
    said = [r.getMessage() for r in caplog.records if "before its connection came up" in r.getMessage()]
    assert len(said) == 1 and re.search(
        r"\(connection \w+, ICE (new|checking), [1-9]\d* local and [1-9]\d* remote "
        r"candidates, DTLS new, SCTP \w+\)$", said[0]), said


async def test_close_sends_session_ended_with_reason_and_message(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings())
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await frames_after(client, 2)
    await peer.close("timeout", "the session reached its longest allowed time (60 s)")
    await client.wait_for(lambda: ended_messages(client), WAIT_S, "sessionEnded")
    assert ended_messages(client) == [
        {"reason": "timeout", "message": "the session reached its longest allowed time (60 s)"}
    ]
    assert peer.state == SessionState.ENDED and host.model.disconnects == 1
    await peer.close()  # again: nothing happens


async def test_close_of_an_orphaned_session_is_recorded(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings(reconnect_grace_s=30))
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await client.close()
    await wait_until(lambda: peer.state == SessionState.ORPHANED, what="orphaned")
    await within_deadline(peer.close("shutdown", "the server is shutting down"),
                          "the close of the orphaned session")
    assert (peer.end_reason, peer.end_detail) == ("shutdown", "the server is shutting down")
    assert host.model.disconnects == 1 and host.session is None


async def test_stop_on_close_ends_instead_of_orphaning(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings(reconnect_grace_s=30))
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    # The stop's window must outlast the transport's loss, however slow the machine.
    assert await peer.request_stop_on_close(WAIT_S)
    await client.close()
    await within_deadline(peer.ended.wait(), "the session to end")
    assert peer.end_reason == "client_closed"
    assert await peer.request_stop_on_close(5.0) is False  # ended: nothing to match


async def test_stop_on_close_of_a_just_orphaned_session_ends_it_now(host_of, peers, clients):
    host = host_of(Level)
    recent = peers(host, settings(reconnect_grace_s=30))
    client = clients(host)
    await client.connect(recent.answer, timeout=WAIT_S)
    await client.close()
    await wait_until(lambda: recent.state == SessionState.ORPHANED, what="orphaned")
    # The window below must have passed since the orphaning: a slow machine only
    # lets more pass.
    await asyncio.sleep(0.4)
    # Orphaned longer ago than the window: not this stop's session; it stays.
    assert await recent.request_stop_on_close(0.2) is False
    assert recent.state == SessionState.ORPHANED
    # A window no loaded machine outlasts: orphaned within it, the stop applies.
    assert await recent.request_stop_on_close(WAIT_S) is True
    assert recent.ended.is_set() and recent.end_reason == "client_closed"


async def test_output_failure_ends_the_session_with_an_error(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings())
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await frames_after(client, 2)

    async def broken():
        raise RuntimeError("encoder exploded")

    peer._fanout.pause()
    peer._fanout.clock.next_frame = broken
    peer._fanout.start()
    await within_deadline(peer.ended.wait(), "the session to end")
    assert peer.end_reason == "error" and "encoder exploded" in peer.end_detail
    await client.wait_for(lambda: ended_messages(client), WAIT_S, "sessionEnded")
    assert ended_messages(client)[0]["reason"] == "error"
    assert host.session is None and host.model.disconnects == 1


async def test_close_is_bounded_when_the_model_thread_is_stuck(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings())
    peer.CLOSE_TIMEOUT_S = 0.5  # the product's bound under test, not a wait of the test
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await frames_after(client, 2)
    release = threading.Event()
    # A forward pass that does not return until the test releases it.
    host._thread.call_soon(release.wait, 4 * WAIT_S)
    try:
        await within_deadline(peer.close(), "close() despite the stuck model thread")
        assert peer.ended.is_set() and not release.is_set()
        # The model could not say it; the peer did.
        await client.wait_for(lambda: ended_messages(client), WAIT_S, "sessionEnded")
        assert ended_messages(client)[0]["reason"] == "client_closed"
    finally:
        release.set()
    await wait_until(lambda: host.session is None, what="the model to catch up")


class RestartingHost:
    """`host` while its model is being restarted: an open waits until `released`."""

    def __init__(self, host):
        self._host = host
        self.asked = asyncio.Event()
        self.released = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._host, name)

    async def open_session(self, *args, **kwargs):
        self.asked.set()
        await self.released.wait()
        return await self._host.open_session(*args, **kwargs)


async def test_a_session_closed_while_its_model_restarts_leaves_the_model_free(
    host_of, peers, clients
):
    host = host_of(Level)
    restarting = RestartingHost(host)
    peer = peers(restarting, settings())
    peer.CLOSE_TIMEOUT_S = 0.5  # the product's bound under test, not a wait of the test
    client = clients(host)
    connecting = asyncio.ensure_future(client.connect(peer.answer, timeout=WAIT_S))
    await within_deadline(restarting.asked.wait(), "the offer to open the model session")
    await within_deadline(peer.close(), "close() while the model restarts")
    assert peer.ended.is_set()
    # The model comes back after the session ended: what the open made is ended again,
    # not left holding the model for a client that is gone.
    restarting.released.set()
    await wait_until(lambda: host.model.disconnects == 1, what="the late open to be ended")
    assert host.model.connects == 1 and host.session is None
    with pytest.raises(Exception):
        await connecting


async def test_close_is_bounded_when_the_model_thread_is_gone(host_of, peers, clients):
    host = host_of(Level)
    peer = peers(host, settings())
    client = clients(host)
    await client.connect(peer.answer, timeout=WAIT_S)
    await frames_after(client, 2)
    host._thread.stop(WAIT_S)  # waits for the thread to be gone; only a hang outlasts it
    await within_deadline(peer.close(), "close() despite the stopped model thread")
    assert peer.ended.is_set() and peer.end_reason == "client_closed"


async def test_cancelled_first_offer_leaves_no_half_open_session(host_of, peers, clients):
    host = host_of(Level)
    # A slow @connected: the offer is cancelled during it. The hook counts its call
    # before it sleeps, so the cancel waits for that count, not for a guessed time.
    host.model.connect_delay = 0.5
    peer = peers(host, settings())
    client = clients(host)
    offers = []

    async def signal(sdp, mapping):
        task = asyncio.ensure_future(peer.answer(sdp, mapping))
        offers.append(task)
        await wait_until(lambda: host.model.connects == 1 or task.done(),
                         what="@connected to start")
        task.cancel()  # the client hung up mid-request
        return await task

    with pytest.raises(asyncio.CancelledError):
        await client.connect(signal, timeout=WAIT_S)
    await within_deadline(peer.ended.wait(), "the session to end")
    await wait_until(lambda: host.session is None, what="the host to be free")
    assert all(conn.pc is None for conn in peer._candidates.connections())
    host.model.connect_delay = 0.0
    again = peers(host, settings())
    other = clients(host)
    await other.connect(again.answer, timeout=WAIT_S)
    await frames_after(other, 2)


async def test_close_during_answer_leaves_nothing_behind(host_of, peers, clients, monkeypatch):
    host = host_of(Level)
    peer = peers(host, settings())
    client = clients(host)
    created = []
    original = RTCPeerConnection.setLocalDescription

    async def slow_local(self, description):
        if description.type == "answer":
            created.append(self)
            await peer.close()  # stop_session arrives while the answer gathers
        return await original(self, description)

    monkeypatch.setattr(RTCPeerConnection, "setLocalDescription", slow_local)
    with pytest.raises(UnknownSession, match="ended"):
        await client.connect(peer.answer, timeout=WAIT_S)
    monkeypatch.undo()
    assert created and created[0].connectionState == "closed"
    assert host.session is None and peer.end_reason == "client_closed"


async def test_candidates_trickled_while_the_answer_gathers_are_kept(host_of, peers, clients, monkeypatch):
    host = host_of(Level)
    peer = peers(host, settings())
    client = clients(host)
    gathering = asyncio.Event()
    go_on = asyncio.Event()
    original = RTCPeerConnection.setLocalDescription

    async def gated(self, description):
        if description.type == "answer":  # the server's side, not the client's offer
            gathering.set()
            await go_on.wait()
        return await original(self, description)

    monkeypatch.setattr(RTCPeerConnection, "setLocalDescription", gated)

    async def signal(sdp, mapping):
        kept, trickled = _strip_candidates(sdp)
        answer = asyncio.ensure_future(peer.answer(kept, mapping, connection_id=7))
        await gathering.wait()
        await peer.add_ice_candidates(trickled, is_final=True, connection_id=7)
        go_on.set()
        return await answer

    await client.connect(signal, timeout=WAIT_S)
    monkeypatch.undo()
    await frames_after(client, 2)


def _strip_candidates(sdp):
    mid, kept, trickled = None, [], []
    for line in sdp.splitlines():
        if line.startswith("a=mid:"):
            mid = line[len("a=mid:"):]
        if line.startswith("a=candidate:"):
            trickled.append({"candidate": line[2:], "sdpMid": mid})
        elif line != "a=end-of-candidates":
            kept.append(line)
    assert trickled
    return "\r\n".join(kept) + "\r\n", trickled


@pytest.mark.parametrize(
    "candidate, problem",
    [
        ({"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host", "sdpMLineIndex": "abc"},
         "sdpMLineIndex"),
        ({"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host", "sdpMLineIndex": True},
         "sdpMLineIndex"),
        ({"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host", "sdpMid": 5}, "sdpMid"),
        (42, "must be an object"),
        ({"candidate": ["x"]}, "must be a string"),
        ({"candidate": "candidate:" + "1" * 5000}, "too long"),
        ({"candidate": "candidate:nonsense"}, "not an ICE candidate"),
    ],
)
def test_malformed_candidates_are_rejected_by_name(candidate, problem):
    with pytest.raises(OfferRejected, match=problem):
        parse_candidates([candidate])


def test_candidates_must_be_a_short_list():
    with pytest.raises(OfferRejected, match="list"):
        parse_candidates({"candidate": "x"})
    with pytest.raises(OfferRejected, match="too many"):
        parse_candidates([""] * 1000)
    assert [c.candidate for c in parse_candidates([], is_final=True)] == [None]


# --------------------------------------------------------------------------- SeatedSessionBackend


def backend_signal(backend, sid, connection_id=None, trickle=False):
    async def signal(sdp, mapping):
        candidates = []
        if trickle:
            sdp, candidates = _strip_candidates(sdp)
        cid = await backend.submit_offer(sid, sdp, mapping, connection_id)
        if candidates:
            await backend.add_ice_candidates(sid, cid, candidates, True)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            result = await backend.poll_answer(sid, cid)
            if isinstance(result, str):
                return result
            await asyncio.sleep(0.02)  # the poll interval; the deadline is the bound
        raise AssertionError("no SDP answer from the backend")

    return signal


ME = ClientIdentity.of("127.0.0.1", "http://localhost", "test")
SOMEONE_ELSE = ClientIdentity.of("127.0.0.2", None, "other")


@pytest.fixture
async def backends():
    made = []

    def make(host, **kw):
        grace = kw.pop("grace", 30)
        backend = SeatedSessionBackend(host, settings(reconnect_grace_s=grace), **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


async def test_backend_orphaned_session_holds_the_slot_then_resumes(host_of, backends, clients):
    host = host_of(Level)
    backend = backends(host, grace=WAIT_S)  # outlasts the test's steps
    info = await backend.create_session({"a": 1}, ME)
    sid = info.session_id
    assert info.state == "created" and len(sid) >= 16
    first = clients(host)
    await first.connect(backend_signal(backend, sid), timeout=WAIT_S)
    assert (await backend.get_session(sid)).state == "streaming"
    await frames_after(first, 2)
    await first.close()
    await wait_until(lambda: backend.live_sessions()[0].state == "orphaned", what="orphaned")

    with pytest.raises(ModelBusy, match="reconnect") as busy:
        await backend.create_session({}, SOMEONE_ELSE)
    assert 0 < busy.value.retry_after_s <= WAIT_S
    assert busy.value.status == 409
    described = await backend.describe_sessions()
    assert described[0]["state"] == "orphaned"
    assert described[0]["session_id"] == sid[:4] + "…" and sid not in str(described)
    assert (await backend.health())["live_sessions"] == 1

    second = clients(host)
    await second.connect(backend_signal(backend, sid), timeout=WAIT_S)  # PUT sdp_params
    await frames_after(second, 2)
    assert (await backend.get_session(sid)).state == "streaming"
    assert host.model.disconnects == 0


async def test_backend_grace_end_is_remembered_with_its_reason(host_of, backends, clients):
    host = host_of(Level)
    backend = backends(host, grace=1)
    sid = (await backend.create_session({}, ME)).session_id
    client = clients(host)
    await client.connect(backend_signal(backend, sid), timeout=WAIT_S)
    await client.close()
    await wait_until(lambda: not backend.live_sessions(), what="the end of the grace")
    info = await backend.get_session(sid)
    assert (info.state, info.end_reason) == ("ended", "timeout")
    assert info.end_message == "the client did not reconnect within 1 s"
    with pytest.raises(UnknownSession, match=r"has ended \(timeout: the client did not reconnect"):
        await backend.submit_offer(sid, "v=0", [])
    with pytest.raises(UnknownSession, match="ended"):
        await backend.poll_answer(sid, None)
    await backend.stop_session(sid)  # a late stop: harmless
    assert (await backend.health())["live_sessions"] == 0
    await backend.create_session({}, ME)


async def test_backend_stop_unnamed_matches_only_its_client(host_of, backends, clients):
    host = host_of(Level)
    backend = backends(host)
    # The stop's window must outlast the transport's loss, however slow the machine.
    backend.STOP_UNNAMED_WINDOW_S = WAIT_S
    sid = (await backend.create_session({}, ME)).session_id
    client = clients(host)
    await client.connect(backend_signal(backend, sid), timeout=WAIT_S)
    assert await backend.stop_unnamed(SOMEONE_ELSE) == 0
    assert await backend.stop_unnamed(ME) == 1
    assert (await backend.get_session(sid)).state == "streaming"  # not on a guess
    await client.close()  # the JS SDK closes its connection right after
    await wait_until(lambda: not backend.live_sessions(), what="the end")
    info = await backend.get_session(sid)
    assert info.end_reason == "client_closed"


async def test_backend_stop_unnamed_ends_a_just_orphaned_session(host_of, backends, clients):
    host = host_of(Level)
    backend = backends(host)
    # "Just orphaned" must still hold when a loaded machine gets to the stop.
    backend.STOP_UNNAMED_WINDOW_S = WAIT_S
    sid = (await backend.create_session({}, ME)).session_id
    client = clients(host)
    await client.connect(backend_signal(backend, sid), timeout=WAIT_S)
    await client.close()
    await wait_until(lambda: backend.live_sessions()[0].state == "orphaned", what="orphaned")
    assert await backend.stop_unnamed(SOMEONE_ELSE) == 0
    assert backend.live_sessions()[0].state == "orphaned"
    assert await backend.stop_unnamed(ME) == 1
    info = await backend.get_session(sid)
    assert (info.state, info.end_reason) == ("ended", "client_closed")


async def test_backend_bad_candidate_is_400_and_does_not_poison(host_of, backends, clients):
    host = host_of(Level)
    # The first session's offer may come as late as a loaded machine makes it.
    backend = backends(host, offer_timeout_s=WAIT_S)
    sid = (await backend.create_session({}, ME)).session_id
    bad = {"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host", "sdpMLineIndex": "abc"}
    for batch in ([bad], [42], [{"candidate": "candidate:" + "9" * 5000}]):
        with pytest.raises(OfferRejected) as rejected:
            await backend.add_ice_candidates(sid, None, batch, False)
        assert rejected.value.status == 400
    client = clients(host)
    await client.connect(backend_signal(backend, sid), timeout=WAIT_S)  # the offer still works
    await frames_after(client, 2)
    await backend.stop_session(sid)

    # A bad candidate and then no offer: the session still expires, the next client
    # gets the model. The short expiry is the duration under test; the wait below is
    # for the resulting state.
    backend._offer_timeout_s = 1.0
    sid2 = (await backend.create_session({}, ME)).session_id
    with pytest.raises(OfferRejected):
        await backend.add_ice_candidates(sid2, None, [bad], False)
    await wait_until(lambda: not backend.live_sessions(), what="the offer expiry")
    assert (await backend.get_session(sid2)).end_reason == "timeout"
    await backend.create_session({}, ME)


async def test_backend_registered_connection_with_trickled_candidates(host_of, backends, clients):
    host = host_of(Level)
    backend = backends(host)
    sid = (await backend.create_session({}, ME)).session_id
    cid = await backend.register_connection(sid)
    assert cid == 1
    assert (await backend.poll_answer(sid, cid)).status == {"status": "awaiting_offer"}
    with pytest.raises(UnknownSession, match="unknown connection"):
        await backend.add_ice_candidates(sid, 99, [], True)
    with pytest.raises(UnknownSession, match="unknown connection"):
        await backend.submit_offer(sid, "v=0\r\n", [], 99)
    client = clients(host)
    await client.connect(backend_signal(backend, sid, connection_id=cid, trickle=True), timeout=WAIT_S)
    await frames_after(client, 2)
    assert backend.stats(sid)["presented"] > 0


async def test_backend_malformed_offer_is_rejected_at_once(host_of, backends):
    host = host_of(Level)
    backend = backends(host)
    sid = (await backend.create_session({}, ME)).session_id
    with pytest.raises(OfferRejected, match="SDP"):
        await backend.submit_offer(sid, "garbage", [])
    assert backend.live_sessions()[0].state == "created"


async def test_backend_stop_during_answer_frees_the_model(host_of, backends, clients):
    host = host_of(Level)
    host.model.connect_delay = 0.5  # the stop comes once the hook has started
    backend = backends(host)
    sid = (await backend.create_session({}, ME)).session_id
    client = clients(host)

    async def signal(sdp, mapping):
        await backend.submit_offer(sid, sdp, mapping)
        await wait_until(lambda: host.model.connects == 1, what="@connected to start")
        await backend.stop_session(sid)  # while @connected runs
        return await backend_signal(backend, sid)(sdp, mapping)

    with pytest.raises(UnknownSession, match="ended"):
        await client.connect(signal, timeout=WAIT_S)
    assert (await backend.get_session(sid)).end_reason == "client_closed"
    await wait_until(lambda: host.session is None, what="the host to be free")
    host.model.connect_delay = 0.0
    sid2 = (await backend.create_session({}, ME)).session_id
    other = clients(host)
    await other.connect(backend_signal(backend, sid2), timeout=WAIT_S)
    await frames_after(other, 2)


@pytest.fixture
def gradient_dir(tmp_path):
    init_model(tmp_path / "gradient", "gradient")
    return tmp_path / "gradient"


async def test_shutdown_ends_streaming_and_orphaned_sessions_with_shutdown(gradient_dir, clients):
    app = create_app(gradient_dir, settings_override={"loopback_candidates": True})
    async with app.router.lifespan_context(app):
        backend = app.state.backend
        host = app.state.host
        sid = (await backend.create_session({}, ME)).session_id
        client = clients(host)
        await client.connect(backend_signal(backend, sid), timeout=WAIT_S)
        await frames_after(client, 2)
    await client.wait_for(lambda: ended_messages(client), WAIT_S, "sessionEnded")
    assert ended_messages(client)[0] == {"reason": "shutdown", "message": "the server is shutting down"}
    assert (await backend.get_session(sid)).end_reason == "shutdown"

    app = create_app(gradient_dir, settings_override={"loopback_candidates": True})
    async with app.router.lifespan_context(app):
        backend = app.state.backend
        sid = (await backend.create_session({}, ME)).session_id
        client = clients(app.state.host)
        await client.connect(backend_signal(backend, sid), timeout=WAIT_S)
        await client.close()
        await wait_until(lambda: backend.live_sessions()[0].state == "orphaned", what="orphaned")
    info = await backend.get_session(sid)
    assert (info.state, info.end_reason) == ("ended", "shutdown")


# --------------------------------------------------------------------------- runtime


@dataclass
class CameraIn(Input):
    camera: Video


class CameraPipeline(ReactorPipeline):
    input: CameraIn
    output: Out

    def inference(self):
        while True:
            yield None  # idle: never reads, so pushed frames stay queued


class CameraModel(ReactorModel):
    input: CameraIn
    output: Out

    async def run(self):
        while True:
            await asyncio.sleep(0.05)  # the model idles; no test waits on it


class CameraLegacy(VideoModel):
    input: CameraIn

    def start_session(self):
        while not get_ctx().should_stop():
            time.sleep(0.01)  # the legacy loop's pace; no test waits on it


@pytest.mark.parametrize("model", [CameraPipeline, CameraModel, CameraLegacy])
async def test_leftover_input_frames_never_reach_the_next_session(host_of, model):
    host = host_of(model)
    buffer = host.input_buffers["camera"]
    frame = np.full((8, 8, 3), 7, np.uint8)
    async with connected(host) as first:
        for _ in range(3):
            first.send_frame("camera", frame)
        assert len(buffer) == 3
        old = first.session
    old.push_input("camera", frame)  # in flight when the session ended
    async with connected(host) as second:
        assert len(buffer) == 0 and not buffer.closed
        old.push_input("camera", frame)
        buffer.push(frame, owner=old)  # even past the session's own checks
        assert len(buffer) == 0
        second.send_frame("camera", frame)
        assert len(buffer) == 1


def test_input_buffer_takes_frames_from_its_session_only():
    buffer = InputBuffer("camera")
    a, b = object(), object()
    frame = np.zeros((4, 4, 3), np.uint8)
    buffer.attach(a)
    buffer.push(frame, owner=b)
    assert len(buffer) == 0
    buffer.push(frame, owner=a)
    assert len(buffer) == 1
    buffer.detach()
    assert len(buffer) == 0 and not buffer.closed
    buffer.push(frame, owner=a)
    assert len(buffer) == 0
    # The reference's own cleanup still works: close() ends reads, reset() reopens.
    buffer.attach(b)
    buffer.close()
    buffer.push(frame, owner=b)
    assert len(buffer) == 0
    buffer.reset()
    buffer.push(frame, owner=b)
    assert len(buffer) == 1


class Slow(ReactorModel):
    output: Out

    def load(self, config):
        self.pokes = 0

    @event(name="poke", description="Slow to apply")
    async def poke(self):
        await asyncio.sleep(0.05)  # simulated work, so that the queue fills
        self.pokes += 1

    async def run(self):
        while True:
            await asyncio.sleep(0.05)  # the model idles; no test waits on it


async def test_a_command_flood_is_bounded_and_the_session_goes_on(host_of):
    host = host_of(Slow)
    async with connected(host) as client:
        for _ in range(300):
            client.send_command("poke")
        await wait_until(
            lambda: any(m["data"]["type"] == "commandError" for m in client.messages),
            what="commandError",
        )
        errors = [m["data"]["data"] for m in client.messages if m["data"]["type"] == "commandError"]
        assert errors[0]["errors"][0]["rule"] == "queue_full"
        assert len(errors) >= 300 - host.MAX_QUEUED_COMMANDS
        await wait_until(lambda: host.model.pokes == 300 - len(errors), what="the accepted pokes")
        assert not client.closed
        client.send_command("poke")  # the queue drained: accepted again
        await wait_until(lambda: host.model.pokes == 301 - len(errors), what="one more poke")


async def test_mapping_of_the_wrong_kind_is_rejected_before_the_model_opens(host_of, backends):
    host = host_of(Level)
    backend = backends(host)
    sid = (await backend.create_session({}, ME)).session_id
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        mapping = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]
        with pytest.raises(OfferRejected, match="is a audio m-line"):
            await backend.submit_offer(sid, pc.localDescription.sdp, mapping)
    finally:
        await pc.close()
    assert backend.live_sessions()[0].state == "created"
    assert host.session is None and host.model.connects == 0


async def test_ending_a_session_whose_model_thread_is_gone_frees_it(host_of):
    from reactor_serve.interface.context import _live

    host = host_of(Level)
    async with connected(host) as client:
        session = client.session
        host._thread.stop(WAIT_S)  # waits for the thread to be gone; only a hang outlasts it
        await within_deadline(session.close(), "close() despite the stopped model thread")
    assert session.ended.is_set() and host.session is None
    assert session.context not in _live  # get_ctx() no longer finds it
    assert client.end_reason == "client_closed"


def test_a_memory_trim_due_after_the_loops_executor_shut_down_ends_quietly(monkeypatch):
    # Serve stops a replica within the trim's delay after a session ended: the loop's
    # default executor is gone by the time the trim is due, and the trim task raised
    # "cannot schedule new futures after shutdown" into "Task exception was never
    # retrieved". With nothing left to trim for, the task just ends.
    from reactor_serve.sessions import seated_sessions

    trims = []
    monkeypatch.setattr(seated_sessions, "release_freed_memory", lambda: trims.append(1))

    class Backend:
        TRIM_DELAY_S = 0.0

    async def trim_after_shutdown():
        await asyncio.get_running_loop().shutdown_default_executor()
        await SeatedSessionBackend._release_freed_memory(Backend())

    asyncio.run(trim_after_shutdown())
    assert trims == []
