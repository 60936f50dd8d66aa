"""`SessionBackend`: the one contract between the HTTP session API (docs/protocol.md) and
whatever runs the sessions: an in-process model for `reactor run`, Ray Serve replicas
behind a stateless ingress. One contract suite (`tests/e2e/contract/test_session_contract.py`) runs
against both.

A session's id is its capability: whoever holds it may offer, trickle, poll and stop.
So no method here lists ids to anyone but an operator, and those are masked.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from reactor_serve.runtime.loading.model_spec import ModelSpec

__all__ = [
    "AnswerPending",
    "ClientIdentity",
    "ClipBackend",
    "SdpAnswer",
    "SessionBackend",
    "SessionEvents",
    "SessionInfo",
    "SessionState",
    "StepBackend",
    "UploadBackend",
    "ViewerBackend",
    "mask_session_id",
]


class SessionState:
    """A session's life: created -> waiting -> streaming <-> orphaned -> ended.

    `waiting`: offered, waiting for a slot or for negotiation to finish. `orphaned`:
    the transport was lost without `stop_session`; the model keeps its state for
    `reconnect_grace_s` and a new offer resumes it.
    """

    CREATED = "created"
    WAITING = "waiting"
    STREAMING = "streaming"
    ORPHANED = "orphaned"
    ENDED = "ended"


class SessionEvents(Protocol):
    """Told every state change of every session, for usage metering. Called on the
    server's loop and must not block it (queue the work)."""

    def session_state(self, session_id: str, state: str, at: float, *,
                      reason: str | None = None, frames: int = 0) -> None:
        """`state` (a `SessionState`) since `at` (wall-clock seconds); `reason` with
        `ended`; `frames`: the session's frames delivered so far."""


@dataclass(frozen=True)
class ClientIdentity:
    """Who sent a request, as far as HTTP can tell: a digest of the client's address,
    `Origin` and `User-Agent`. It is never a credential: it only narrows which
    session a `stop_session` that names none may mean (see `stop_unnamed`)."""

    digest: str

    @classmethod
    def of(cls, address: str | None, origin: str | None, user_agent: str | None) -> ClientIdentity:
        text = "\x1f".join(part or "" for part in (address, origin, user_agent))
        return cls(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32])


@dataclass
class AnswerPending:
    """The answer is not ready yet; `status` is what a polling client is told
    (for example `{"status": "queued", "position": 2, "eta_s": 30}`)."""

    status: dict[str, Any] = field(default_factory=dict)


class SdpAnswer(str):
    """An SDP answer that knows which connection it answers: a flat `GET sdp_params`
    names no connection, and the client matches the reply to its latest offer."""

    connection_id: int | None

    def __new__(cls, sdp: str, connection_id: int | None) -> SdpAnswer:
        answer = super().__new__(cls, sdp)
        answer.connection_id = connection_id
        return answer

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses Ray calls (a replica answers an ingress) with its connection id.
        return (SdpAnswer, (str(self), self.connection_id))


@dataclass
class SessionInfo:
    session_id: str
    state: str
    created_at: float
    extra_args: dict[str, Any] = field(default_factory=dict)
    # Set once the session has ended: the `sessionEnded` reason and message.
    end_reason: str | None = None
    end_message: str | None = None
    # "streamed", or "stepped": the model makes nothing until the client asks for a step.
    generation: str = "streamed"


def mask_session_id(session_id: str) -> str:
    """What operators see of an id: enough to tell sessions apart, not to use one."""
    return session_id[:4] + "…" if len(session_id) > 4 else "…"


class SessionBackend(Protocol):
    """Runs the sessions of one model. All methods are called on the server's event
    loop; any of them may raise a `BackendError`, never anything else on bad input."""

    @property
    def spec(self) -> ModelSpec:
        """The model's spec (tracks, commands, fps), for descriptors and schemas."""

    async def create_session(
        self,
        extra_args: dict[str, Any],
        client: ClientIdentity,
        *,
        generation: str = "streamed",
        max_duration_s: float | None = None,
    ) -> SessionInfo:
        """Reserve a session in state `created` (`generation`: "streamed" or
        "stepped"). `max_duration_s`: from now, the session ends with reason `limit`
        (an API key's or token's limit). Raises ModelBusy / ModelUnavailable, and
        OfferRejected for a stepped session of a model that cannot step."""

    async def get_session(self, session_id: str) -> SessionInfo:
        """The session, ended ones included for a while (with their end reason).
        Raises UnknownSession."""

    async def submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
    ) -> int:
        """Start negotiating; returns the connection id the answer will carry.

        The first offer opens the model session (waiting for a slot if need be); a
        later one (a reconnect, or a resume within the grace window) replaces the
        peer connection and keeps the model's state. `connection_id` is a registered
        connection's id (`register_connection`), or None to mint one.
        Raises UnknownSession, OfferRejected."""

    async def register_connection(self, session_id: str) -> int:
        """A connection id for newer clients' `POST .../connections`, offered on later."""

    async def poll_answer(
        self, session_id: str, connection_id: int | None
    ) -> SdpAnswer | AnswerPending:
        """The SDP answer (with its connection id) of the given connection (None: the latest offer), or
        AnswerPending. Raises UnknownSession; OfferRejected / ModelBusy if that
        negotiation failed; UnknownSession for an unregistered connection id."""

    async def add_ice_candidates(
        self,
        session_id: str,
        connection_id: int | None,
        candidates: list[Any],
        is_final: bool,
    ) -> None:
        """Trickled client candidates for the given (None: the latest) connection,
        kept until that connection can take them. Raises UnknownSession,
        OfferRejected naming a malformed candidate."""

    async def stop_session(self, session_id: str) -> None:
        """End the session now (`sessionEnded{reason: "client_closed"}`) and free its
        slot. Stopping an ended session is a no-op. Raises UnknownSession."""

    async def stop_unnamed(self, client: ClientIdentity) -> int:
        """A `stop_session` that names no session (JS SDK 2.9.0 sends none).

        Never ends a session on a guess. Sessions started by the same `client` that
        lost their transport within the last few seconds end now; the others of
        that client end if their client closes its transport within the next few
        seconds (the JS SDK closes its peer connection right after this call)
        instead of being kept for a reconnect. Returns how many sessions it matched.
        """

    async def describe_sessions(self) -> list[dict[str, Any]]:
        """Live sessions for operators: masked ids, state, where they run."""

    async def health(self) -> dict[str, Any]:
        """`{"healthy": bool, "live_sessions": int, ...}`."""

    def ice_servers(self, session_id: str) -> list[dict[str, Any]]:
        """`[{"uris": [...], "credentials"?: {"username", "password"}}]` for the client
        of `session_id`: TURN credentials minted from a secret are its own."""


class UploadBackend(Protocol):
    """What the upload routes need of a backend. The session id proves ownership when
    an upload is reserved; the upload id it mints (random) is then the capability to
    write that one upload's bytes. A session's uploads go when it ends."""

    async def create_upload(self, session_id: str, name: str, size: int, mime_type: str) -> str:
        """Reserve an upload of `size` bytes in a live session; returns its id. Raises
        UnknownSession, UploadTooLarge, UploadRejected."""

    async def upload_size(self, upload_id: str) -> int:
        """The size a reserved upload was reserved with, asked before its body is read
        (so a body that does not fit is refused unread). Raises UnknownUpload,
        UploadConflict."""

    async def write_upload(self, upload_id: str, data: bytes) -> None:
        """The bytes of a reserved upload, exactly its size, once. Raises UnknownUpload
        (never issued, or its session ended), UploadRejected (wrong length),
        UploadConflict (already written)."""


class ClipBackend(Protocol):
    """What the clip routes need of a backend: the clips a session's wire v1 client
    asked for (sessions/recording/served_clips.py), by the session id that proves it
    is the owner. A session's clips go when it ends."""

    async def clip_playlist(self, session_id: str, start: float, end: float) -> str | float:
        """The HLS playlist of the session's clip with these markers, or the seconds
        to wait before asking again while its end is not written. Raises
        UnknownSession, UnknownClip, ClipGone."""

    async def clip_chunk(self, session_id: str, name: str) -> bytes:
        """A segment a playlist named. Raises UnknownSession, UnknownClip, ClipGone."""


class StepBackend(Protocol):
    """What the step routes need of a backend: a stepped session's kept steps
    (sessions/step_store.py), by the session id that proves it is the owner."""

    async def kept_steps(self, session_id: str) -> list[int]:
        """The numbers of the session's kept steps. Raises UnknownSession, UnknownStep."""

    async def kept_step(self, session_id: str, step: int) -> dict[str, Any]:
        """Step `step`'s `result.json`. Raises UnknownSession, UnknownStep."""

    async def kept_step_file(self, session_id: str, step: int, name: str) -> tuple[bytes, str]:
        """One file of step `step` and its content type. Raises UnknownSession, UnknownStep."""


class ViewerBackend(Protocol):
    """What the viewer routes need of a backend. A viewer token is a capability to
    watch one session and nothing else: no method taking one reveals the session id,
    and none lets its holder command, stop or reconnect the session."""

    async def viewer_link(self, session_id: str) -> dict[str, Any]:
        """The session's viewer token (minted on first request, then the same one):
        `{"viewer_token", "viewers", "max_viewers"}`. Raises UnknownSession,
        ViewersUnavailable."""

    async def revoke_viewers(self, session_id: str) -> bool:
        """Forget the session's viewer token and end its viewers; whether there was one."""

    async def watch_info(self, viewer_token: str) -> dict[str, Any]:
        """`{"state", "viewers", "max_viewers"}` of the watched session. Raises
        UnknownSession for an unknown token or an ended session."""

    async def watch_offer(
        self, viewer_token: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        """Start answering a viewer's offer; returns its connection id. Raises
        UnknownSession, OfferRejected, ViewerLimitReached."""

    async def watch_poll(self, viewer_token: str, connection_id: int) -> SdpAnswer | AnswerPending:
        """The answer to viewer connection `connection_id`, or AnswerPending."""

    async def watch_ice_servers(self, viewer_token: str) -> list[dict[str, Any]]:
        """The ICE servers a viewer uses (TURN credentials minted for the token)."""
