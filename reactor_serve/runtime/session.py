"""`Session`: one connected client, and the seams a transport plugs into.

A transport (WebRTC, or the in-process `LocalClient`) opens a session on a
`ModelHost` with a `SessionSink` that receives messages and the end of the session.
It then drives the session's `EmissionClock` for output, pushes input frames, and
forwards commands. Everything here is safe to call from the transport's thread.
"""

from __future__ import annotations

import secrets
import threading
from typing import TYPE_CHECKING, Any, Protocol

from reactor_serve.interface.context import SessionContext
from reactor_serve.interface.messages import ModelMessage, message_payload
from reactor_serve.runtime.emission_clock import EmissionClock

if TYPE_CHECKING:
    from reactor_serve.runtime.host import ModelHost

__all__ = ["EndReason", "Session", "SessionSink"]


class EndReason:
    """Why a session ended, as sent in `sessionEnded`."""

    CLIENT_CLOSED = "client_closed"
    MODEL_ENDED = "model_ended"
    ERROR = "error"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


class SessionSink(Protocol):
    """Where a session's output goes. Called from the model's threads: implementations
    hop to their own loop."""

    def message(self, envelope: dict[str, Any]) -> None:
        """A data-channel envelope: `{"scope": "application"|"runtime", "data": {...}}`."""

    def ended(self, reason: str, detail: str | None) -> None:
        """The session is over (after `sessionEnded` was delivered through `message`)."""


class Session:
    """One live client of a `ModelHost`."""

    def __init__(self, host: ModelHost, sink: SessionSink, session_id: str | None = None) -> None:
        self.id = session_id or secrets.token_urlsafe(16)
        self.host = host
        self.sink = sink
        self.clock = EmissionClock(host.output_buffer, host.spec.outputs)
        self.context = _LiveContext(self)
        self._stopping = threading.Event()
        self.ended = threading.Event()
        self.end_reason: str | None = None
        self.end_detail: str | None = None
        self.commands_rejected = 0

    @property
    def stopping(self) -> bool:
        """True once the session is ending: producers should stop."""
        return self._stopping.is_set()

    def _mark_stopping(self) -> None:
        self._stopping.set()

    def push_input(self, track: str, frame: Any) -> None:
        """Deliver a client frame to the model's input track `track`."""
        buffer = self.host.input_buffers.get(track)
        if buffer is None:
            known = ", ".join(self.host.input_buffers) or "none"
            raise KeyError(f"model has no input track {track!r} (input tracks: {known})")
        # Frames from a session that is ending, or has ended, are dropped: the buffer
        # accepts only the session attached to it now (see InputBuffer.attach).
        if not self.stopping and not self.ended.is_set():
            buffer.push(frame, owner=self)
            self.host._input_arrived()

    def command(self, name: str, data: Any = None) -> None:
        """Deliver a client command; a rejected one comes back as `commandError`."""
        self.host._submit_command(self, name, {} if data is None else data)

    def deliver(self, envelope: dict[str, Any]) -> None:
        if not self.ended.is_set():
            self.sink.message(envelope)

    def send_runtime(self, type_: str, data: dict[str, Any]) -> None:
        self.deliver({"scope": "runtime", "data": {"type": type_, "data": data}})

    def send_application(self, message: ModelMessage | dict[str, Any]) -> None:
        self.deliver({"scope": "application", "data": message_payload(message)})

    async def close(self, reason: str = EndReason.CLIENT_CLOSED, detail: str | None = None) -> None:
        """End the session from the transport's side and wait until it is cleaned up.
        `detail` is the `message` of `sessionEnded`."""
        await self.host.end_session(self, reason, detail)

    def stats(self) -> dict[str, Any]:
        """Numbers for the client's overlay and for metrics."""
        buffer = self.host.output_buffer
        rate = buffer.rate.rate()
        return {
            "fps": round(self.clock.fps, 2),
            "jitter_ms": round(self.clock.jitter_ms, 3),
            "target_fps": buffer.target_fps,
            "production_fps": round(rate, 2) if rate is not None else None,
            "queue_depth": buffer.depth(),
            "dropped": buffer.dropped,
            "presented": self.clock.presented,
            "new_frames": self.clock.new_frames,
            "commands_rejected": self.commands_rejected,
        }


class _LiveContext(SessionContext):
    """`get_ctx()` while this session is live."""

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def session_id(self) -> str:
        return self._session.id

    def should_stop(self) -> bool:
        return self._session.stopping

    def emit_block(self, frames: Any) -> None:
        self._session.host._emit_block(self._session, frames)

    def send(self, message: Any) -> None:
        self._session.send_application(message)

    def disable_monitoring(self) -> None:
        buffer = self._session.host.output_buffer
        buffer.rate.set_monitoring(False, buffer.clock())

    def enable_monitoring(self) -> None:
        buffer = self._session.host.output_buffer
        buffer.rate.set_monitoring(True, buffer.clock())
