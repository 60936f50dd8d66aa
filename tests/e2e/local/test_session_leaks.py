"""Nothing of an ended session stays alive in the server (issue 19, the memory leak).

Each session is served by `reactor run`'s app on a thread of this process (so its
objects can be looked at), with the gradient example: open, frames, a command, a
viewer, stop. After a few of them, every per-session object (the PeerSession, the
runtime Session with its latency tickets, the recorder, the viewer room, the
data-channel handler, the aiortc connection) must be collectable, and the process-
and backend-level tables must hold nothing of them: those are what made each
session's memory stay for good. benchmarks/soak.py shows the same as RSS.

The SeatedSessionBackend here is also what a Serve replica runs its sessions on
(serve/replica.py), so this covers the replica's side too.
"""

import asyncio
import gc
import time
import weakref

import pytest
from conftest import DevServer
from paths import ROOT

from reactor_serve.client import connect, watch

GRADIENT = ROOT / "examples" / "gradient"
SESSIONS = 3
# Sessions, their model process and the client on a loaded machine: waits are for a
# condition, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def _track_peers(backend):
    """Weak references to every PeerSession the backend makes from now on."""
    made = []
    factory = backend._peer_factory

    def tracking(*args, **kwargs):
        from reactor_serve.sessions.seated_sessions import _default_peer_factory

        peer = (factory or _default_peer_factory())(*args, **kwargs)
        made.append(weakref.ref(peer))
        return peer

    backend._peer_factory = tracking
    return made


def _parts_of(peer):
    """Weak references to what one live session holds (named, for the failure message)."""
    parts = {"PeerSession": peer}
    for name in ("session", "recordings", "viewers", "_pc", "inbound"):
        value = getattr(peer, name, None)
        if value is not None:
            parts[type(value).__name__] = value
    return {name: weakref.ref(value) for name, value in parts.items()}


async def _one_session(server, backend):
    client = await connect(server.url)
    try:
        for _ in range(5):
            await client.next_frame(timeout=DEADLINE_S)
        command_id = client.send_command("set_brightness", {"brightness": 0.5})
        link = await client.viewer_link()
        viewer = await watch(server.url, link["viewer_token"])
        try:
            await viewer.next_frame(timeout=DEADLINE_S)
        finally:
            await viewer.close()
        # The command's frame came back (its latency ticket went the whole way).
        await client.peer.wait_for(
            lambda: any(r.id == command_id and r.latency_ms is not None
                        for r in client.input_latency()),
            DEADLINE_S, "the commanded frame",
        )
        peer = backend.live_peer(client.session_id)
        assert peer is not None
        parts = _parts_of(peer)
    finally:
        await client.close()
    return parts


async def _wait_idle(backend, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    while backend.live_sessions():
        assert time.monotonic() < deadline, "the last session did not end"
        await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline


def _alive(refs, timeout=DEADLINE_S):
    """The names of `refs` still alive after collections, given the server's loop a
    moment to run its last callbacks (aiortc's closing timers)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        alive = sorted({name for parts in refs for name, ref in parts.items() if ref() is not None})
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)  # the poll interval of a wait with a deadline


@pytest.mark.parametrize("in_process", [False, True], ids=["model-process", "in-process"])
async def test_ended_sessions_leave_nothing_alive(monkeypatch, in_process):
    from reactor_serve.sessions import seated_sessions

    monkeypatch.setenv("REACTOR_IN_PROCESS", "1" if in_process else "0")
    trims = []
    monkeypatch.setattr(seated_sessions, "release_freed_memory", lambda: trims.append(1))
    with DevServer(GRADIENT) as server:
        backend = server.app.state.backend
        host = server.app.state.host
        made = _track_peers(backend)
        refs = [await _one_session(server, backend) for _ in range(SESSIONS)]
        await _wait_idle(backend)

        assert len(made) == SESSIONS
        assert await asyncio.to_thread(_alive, refs) == []
        # Each ended session hands the heap memory it freed back to the OS (glibc keeps
        # it otherwise: ~200 KB of RSS a session for good, see runtime/native_memory.py).
        deadline = time.monotonic() + DEADLINE_S
        while len(trims) < SESSIONS and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the poll interval of a wait with a deadline
        assert len(trims) == SESSIONS, "not every ended session handed its memory back"
        # The tables that outlive a session keep nothing of it.
        assert backend.viewer_links.count == 0
        ended = backend.ended_sessions()
        assert len(ended) == SESSIONS
        for held in ended:
            assert held.peer is None
            assert all(task is None for task in held.answering)
        if in_process:
            from reactor_serve.interface import context

            assert host._session is None
            assert host._answers == []
            assert context._live == []
        else:
            assert host._sessions == {} and host._ends == {}


async def test_an_ended_session_still_answers_late_requests():
    # What the ended-session table keeps is enough for a late poll and stop.
    import httpx

    with DevServer(GRADIENT) as server:
        client = await connect(server.url)
        sid = client.session_id
        await client.next_frame(timeout=DEADLINE_S)
        await client.close()
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            poll = await http.get(f"{server.url}/sessions/{sid}/transport/webrtc/sdp_params")
            stop = await http.post(f"{server.url}/stop_session", json={"session_id": sid})
        assert poll.status_code == 404 and "has ended" in poll.text
        assert stop.status_code in (200, 404)


class _FailingDirectory:
    """A session directory whose record writes fail (the GCS unreachable a moment)."""

    async def model_settings(self, name):
        return {}

    async def update(self, session_id, **fields):
        raise RuntimeError("the GCS did not answer")

    async def end(self, session_id, reason, message):
        pass

    async def drop_position(self, session_id):
        pass

    async def put_position(self, session_id, position, eta_s):
        pass


async def test_an_ingress_admission_that_fails_early_leaves_no_queue_entry():
    from types import SimpleNamespace

    from reactor_serve.serve.ingress_sessions import IngressSessions

    # Outside an actor: no actor name.
    backend = IngressSessions(SimpleNamespace(name="gradient"), None, _FailingDirectory(), [],
                              actor_name=None, admission_timeout_s=60.0)
    queue = backend.admission
    await queue.hold("a-session", claimed=False)
    assert queue._queue == [] and queue._queued_at == {}
