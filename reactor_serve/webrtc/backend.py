"""`SessionBackend`: what the HTTP session API (PROTOCOL.md) needs from whatever runs
the sessions: an in-process model for `reactor run`, Ray Serve replicas for the ingress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from reactor_serve.runtime.model_spec import ModelSpec

__all__ = [
    "AnswerPending",
    "BackendError",
    "ModelBusy",
    "ModelUnavailable",
    "OfferRejected",
    "SessionBackend",
    "SessionInfo",
    "UnknownSession",
]


class BackendError(Exception):
    """Base of the errors a backend reports; each maps to one HTTP status."""

    status = 500


class UnknownSession(BackendError):
    status = 404


class ModelBusy(BackendError):
    """No slot for a new session (a single-session server with one live, or a full
    queue past its admission timeout)."""

    status = 409

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelUnavailable(BackendError):
    """The model is not loaded (still loading, or its load failed)."""

    status = 503


class OfferRejected(BackendError):
    """A malformed SDP offer or track mapping."""

    status = 400


@dataclass
class AnswerPending:
    """The answer is not ready yet; `status` is what a polling client is told
    (for example `{"status": "queued", "position": 2, "eta_s": 30}`)."""

    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionInfo:
    session_id: str
    state: str  # "created" | "connecting" | "live" | "ended"
    created_at: float
    extra_args: dict[str, Any] = field(default_factory=dict)


class SessionBackend(Protocol):
    """Runs sessions of one model. All methods are called on the server's event loop."""

    @property
    def spec(self) -> ModelSpec:
        """The model's spec (tracks, commands, fps), for descriptors and schemas."""

    async def create_session(self, extra_args: dict[str, Any]) -> SessionInfo:
        """Reserve a session. Raises ModelBusy when none can be had."""

    def get_session(self, session_id: str) -> SessionInfo:
        """Raises UnknownSession."""

    def live_sessions(self) -> list[SessionInfo]:
        """Sessions not yet ended, oldest first."""

    async def submit_offer(
        self, session_id: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        """Start negotiating; returns the new connection id. A later offer for the same
        session replaces its peer connection and keeps the model's state (reconnect).
        Raises UnknownSession, OfferRejected."""

    def poll_answer(self, session_id: str, connection_id: int | None) -> str | AnswerPending:
        """The SDP answer of the latest (or the given) connection, or AnswerPending.
        Raises UnknownSession, and OfferRejected if negotiation failed."""

    async def add_ice_candidates(
        self, session_id: str, candidates: list[Any], is_final: bool
    ) -> None:
        """Trickled client candidates for the session's latest connection.
        Raises UnknownSession, OfferRejected (a malformed candidate)."""

    async def stop_session(self, session_id: str) -> None:
        """End the session and free its slot. Raises UnknownSession."""

    def ice_servers(self) -> list[dict[str, Any]]:
        """`[{"uris": [...], "credentials"?: {"username", "password"}}]` for clients."""
