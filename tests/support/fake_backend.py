"""An in-memory `SessionBackend` for tests of the session HTTP API (the routes, and the
middleware in front of them), with the request parts those tests send: an SDP offer,
a track mapping, a candidate, the transport URL template, and the calls that start a
session and read an error's detail.

The fixtures `fake` (a FakeBackend) and `http` (a client of the session app over it)
are imported by the test files that use them: a second conftest.py would shadow the
root one's importable helpers, as both load under the module name `conftest`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_calls import client
from paths import TEST_MODELS

from reactor_serve.http_api.routes import session_app
from reactor_serve.protocol.errors import (
    ClipGone,
    ModelBusy,
    OfferRejected,
    UnknownSession,
)
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.loading.model_spec import ModelSpec, inspect_model
from reactor_serve.sessions.contract import AnswerPending, ClientIdentity, SessionInfo
from reactor_serve.sessions.recording.served_clips import ServedClips
from reactor_serve.sessions.uploads.settings import UploadSettings
from reactor_serve.sessions.uploads.store import SessionUploads

__all__ = [
    "CANDIDATE",
    "CLIENT",
    "GENERATOR",
    "MAPPING",
    "OFFER",
    "SPEC",
    "Answer",
    "FakeBackend",
    "W",
    "detail",
    "fake",
    "http",
    "start",
]

GENERATOR = TEST_MODELS / "reference" / "generator"
SPEC = inspect_model(load_manifest(GENERATOR).load_class(), "generator")
OFFER = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
MAPPING = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]
CANDIDATE = "candidate:1 1 udp 2122260223 192.168.1.2 54321 typ host generation 0"
W = "/sessions/{sid}/transport/webrtc"
# What httpx's ASGITransport reports as the client address.
CLIENT = ClientIdentity.of("127.0.0.1", None, f"python-httpx/{httpx.__version__}")


class Answer(str):
    """An SDP answer that carries its connection id (what a flat poll reports)."""

    connection_id: int


class FakeBackend:
    """An in-memory SessionBackend whose answers the test hands out by hand; it records
    every call, so a test can tell that bad input never reached it."""

    def __init__(self, spec: ModelSpec = SPEC, *, max_sessions: int = 1) -> None:
        self._spec = spec
        self.max_sessions = max_sessions
        self.calls: list[tuple[str, Any]] = []
        self.sessions: dict[str, SessionInfo] = {}
        self.clients: dict[str, ClientIdentity] = {}
        self.offers: dict[int, tuple[str, str, list]] = {}
        self.registered: dict[str, set[int]] = {}
        self.answers: dict[int, str | Exception] = {}
        self.latest: dict[str, int] = {}
        self.pending_status: dict[str, Any] = {"status": "queued", "position": 1, "eta_s": 3}
        self.candidates: list[tuple[str, int | None, list, bool]] = []
        self.healthy = True
        # The max_duration_s of each create_session, in order.
        self.durations: list[float | None] = []
        self.raise_next: BaseException | None = None
        self._n = 0
        self._cid = 100
        # One store for every session: the routes' rules, not the ownership, are what
        # tests over this backend check.
        self.uploads = SessionUploads(
            UploadSettings(max_file_bytes=1000, max_session_bytes=3000, max_files=5)
        )
        self.clips: dict[str, ServedClips] = {}

    @property
    def spec(self) -> ModelSpec:
        return self._spec

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc

    def _get(self, session_id: str) -> SessionInfo:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise UnknownSession(f"unknown session {session_id!r}") from None

    def _live(self) -> list[SessionInfo]:
        return [s for s in self.sessions.values() if s.state != "ended"]

    async def create_session(
        self, extra_args: dict[str, Any], client: ClientIdentity, *, generation: str = "streamed",
        max_duration_s: float | None = None,
    ) -> SessionInfo:
        self.durations.append(max_duration_s)
        self._call("create_session", extra_args, client)
        if len(self._live()) >= self.max_sessions:
            raise ModelBusy(f"model {self._spec.name} is busy with another session")
        self._n += 1
        info = SessionInfo(f"sess-{self._n}", "created", time.time(), dict(extra_args),
                           generation=generation)
        self.sessions[info.session_id] = info
        self.clients[info.session_id] = client
        return info

    async def get_session(self, session_id: str) -> SessionInfo:
        self._call("get_session", session_id)
        return self._get(session_id)

    async def submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
    ) -> int:
        self._call("submit_offer", session_id, sdp_offer, track_mapping, connection_id)
        info = self._get(session_id)
        if info.state == "ended":
            raise UnknownSession(f"session {session_id} has ended")
        if "m=" not in sdp_offer:
            raise OfferRejected("malformed SDP offer: no m-line")
        if connection_id is None:
            self._cid += 1
            connection_id = self._cid
        elif connection_id not in self.registered.get(session_id, set()):
            raise UnknownSession(f"unknown connection {connection_id}")
        self.answers.pop(connection_id, None)
        self.offers[connection_id] = (session_id, sdp_offer, track_mapping)
        self.latest[session_id] = connection_id
        info.state = "waiting"
        return connection_id

    async def register_connection(self, session_id: str) -> int:
        self._call("register_connection", session_id)
        self._get(session_id)
        self._cid += 1
        self.registered.setdefault(session_id, set()).add(self._cid)
        return self._cid

    async def poll_answer(
        self, session_id: str, connection_id: int | None
    ) -> Answer | AnswerPending:
        self._call("poll_answer", session_id, connection_id)
        self._get(session_id)
        registered = self.registered.get(session_id, ())
        if connection_id in registered and connection_id not in self.offers:
            return AnswerPending({"status": "awaiting_offer"})
        cid = self.latest.get(session_id) if connection_id is None else connection_id
        if cid is None:
            return AnswerPending({"status": "awaiting_offer"})
        if cid not in self.offers:
            raise UnknownSession(f"unknown connection {cid}")
        result = self.answers.get(cid)
        if result is None:
            return AnswerPending(dict(self.pending_status))
        if isinstance(result, Exception):
            raise result
        answer = Answer(result)
        answer.connection_id = cid
        return answer

    async def add_ice_candidates(
        self,
        session_id: str,
        connection_id: int | None,
        candidates: list[Any],
        is_final: bool,
    ) -> None:
        self._call("add_ice_candidates", session_id, connection_id, candidates, is_final)
        self._get(session_id)
        self.candidates.append((session_id, connection_id, list(candidates), is_final))

    async def stop_session(self, session_id: str) -> None:
        self._call("stop_session", session_id)
        info = self._get(session_id)
        info.state = "ended"
        info.end_reason = "client_closed"

    async def stop_unnamed(self, client: ClientIdentity) -> int:
        self._call("stop_unnamed", client)
        matched = [s for s in self._live() if self.clients[s.session_id] == client]
        for info in matched:
            info.state = "ended"
        return len(matched)

    async def describe_sessions(self) -> list[dict[str, Any]]:
        self._call("describe_sessions")
        return []

    async def health(self) -> dict[str, Any]:
        self._call("health")
        return {"healthy": self.healthy, "live_sessions": len(self._live())}

    def ice_servers(self, session_id: str) -> list[dict[str, Any]]:
        return [{"uris": ["stun:stun.example.org:3478"]}]

    async def create_upload(self, session_id: str, name: str, size: int, mime_type: str) -> str:
        self._call("create_upload", session_id, name, size, mime_type)
        self._get(session_id)
        return self.uploads.reserve(name, size, mime_type)

    async def upload_size(self, upload_id: str) -> int:
        self._call("upload_size", upload_id)
        return self.uploads.size_of(upload_id)

    async def write_upload(self, upload_id: str, data: bytes) -> None:
        self._call("write_upload", upload_id, len(data))
        self.uploads.write(upload_id, data)

    async def clip_playlist(self, session_id: str, start: float, end: float) -> str | float:
        self._call("clip_playlist", session_id, start, end)
        return self.served_clips(session_id).playlist(start, end)

    async def clip_chunk(self, session_id: str, name: str) -> bytes:
        self._call("clip_chunk", session_id, name)
        return self.served_clips(session_id).chunk(name)

    def served_clips(self, session_id: str) -> ServedClips:
        """The session's clips (tests add to them); ClipGone once it has ended."""
        if self._get(session_id).state == "ended":
            raise ClipGone(f"session {session_id} has ended: its clips are gone")
        return self.clips.setdefault(session_id, ServedClips(session_id))

    def called(self, name: str) -> list[tuple]:
        """The arguments of every call to `name`, in order."""
        return [args for call, args in self.calls if call == name]


async def start(http: httpx.AsyncClient, prefix: str = "") -> str:
    """Start a session through `http` (under `prefix`); its id."""
    r = await http.post(f"{prefix}/start_session", json={})
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


def detail(r: httpx.Response) -> str:
    """An error answer's `detail`, which must be a string."""
    body = r.json()
    assert isinstance(body["detail"], str), body
    return body["detail"]


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(fake: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the session app (all its middleware) over `fake`."""
    async with client(session_app(lambda request: fake, server_version="9.9.9")) as c:
        yield c
