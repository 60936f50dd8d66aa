"""Routing one session's wire v1 frames (protocol/wire_v1): every request is answered.

The v1 client correlates each request with its reply by `request_id` and waits for
it, so where v0 may drop a frame silently, v1 answers: a command is accepted (a
bodyless response), refused (an `error` whose code the official SDK maps to its
exceptions: BAD_REQUEST naming the field, RATE_LIMITED), or coalesced into a newer
value of its field (accepted). A frame that does not decode is answered with
BAD_REQUEST when its `request_id` can be read, and dropped with a throttled log line
when not. Notifications (`ping`, `pause_track`, `client_stats`, ...) get no answer, as
the protocol says.

Commands share the v0 path from here on (`InboundHandler.submit`): one rate limit,
one set of argument rules, one way to the model.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Protocol

from reactor_serve.protocol import model_documents
from reactor_serve.protocol.channel_codec import BadCommand, ProtocolError, brief
from reactor_serve.protocol.wire_v1 import codec as wire_v1

__all__ = ["CommandIntake", "WireV1Requests"]

log = logging.getLogger(__name__)

STREAMED_STEP = (
    'this session streams: a step needs a session started with "generation": "stepped"'
)
NO_CLIPS = "recorder disabled: this session is not recorded"


class CommandIntake(Protocol):
    """What routing v1 frames needs of the session's inbound handler (InboundHandler)."""

    session_id: str

    @property
    def bucket(self) -> Any: ...

    def spec(self) -> Any: ...

    def admit(self, command: str | None, request_id: str | int | None = None) -> bool: ...

    def submit(
        self, name: str, args: dict[str, Any], command_id: str | int | None, *, reply: bool = False
    ) -> None: ...

    def reject(self, exc: BadCommand, command_id: str | int | None, *, reply: bool = False) -> None: ...

    def ignore(self, channel: str, exc: Exception) -> None: ...
    def control_track(self, event: Any, name: Any) -> None: ...

    @property
    def step_bytes(self) -> int:
        """How big a step request may be (0: this session does not step)."""

    def request_step(self, request_id: str, request: Any) -> bool:
        """Run a step (answered by the session); False when this session streams."""

    def request_clip(self, seconds: float | None, answer: Callable[[Any], None]) -> bool:
        """Cut a clip (None: the whole session) and `answer` with a ClipAnswer; False
        when the session has no recordings to cut from."""


class WireV1Requests:
    """Decodes and answers the v1 frames of the session `handler` serves; `send_frame`
    sends one encoded frame on the channel it names."""

    def __init__(self, handler: CommandIntake, send_frame: Callable[[str, bytes], None]) -> None:
        self._handler = handler
        self._send = send_frame

    def on_message(self, label: str, raw: Any) -> None:
        if label == wire_v1.CONTROL:
            self._on_control(raw)
        else:
            self._on_data(raw)

    # ---- "data" -------------------------------------------------------------------

    def _on_data(self, raw: Any) -> None:
        handler = self._handler
        try:
            request = wire_v1.decode_data(raw, handler.step_bytes)
        except wire_v1.WireError as exc:
            self._refuse(wire_v1.DATA, exc.request_id, exc)
            return
        request_id = request.request_id or None
        if request.method == "command":
            try:
                name, args = wire_v1.command_arguments(request.payload)
            except BadCommand as exc:
                handler.reject(exc, request_id, reply=request_id is not None)
                return
            except ProtocolError as exc:
                self._refuse(wire_v1.DATA, request_id, exc)
                return
            handler.submit(name, args, request_id, reply=request_id is not None)
        elif request.method == "request_step":
            if request_id is None or not handler.admit(None):
                return  # nothing waits for a step without an id
            if not handler.request_step(request_id, request.payload):
                self._send(wire_v1.DATA, wire_v1.step_refused(request_id, STREAMED_STEP))
        elif request.method == "error":
            log.debug("session %s: the client reported an error: %s %s", handler.session_id,
                      brief(request.payload.code), brief(request.payload.message))

    # ---- "control" ----------------------------------------------------------------

    def _on_control(self, raw: Any) -> None:
        handler = self._handler
        try:
            request = wire_v1.decode_control(raw)
        except wire_v1.WireError as exc:
            self._refuse(wire_v1.CONTROL, exc.request_id, exc)
            return
        request_id, method = request.request_id, request.method
        if method in ("pause_track", "resume_track"):
            handler.control_track(method, request.payload.name)
        if not request_id or method in ("ping", "pause_track", "resume_track", "unpublish_track",
                                        "file_uploaded", "client_stats", "error"):
            # Notifications: liveness (noted by the caller) and state the client keeps;
            # nothing waits for an answer.
            return
        if not handler.admit(None):
            self._send(wire_v1.CONTROL, wire_v1.control_error(
                request_id, wire_v1.RATE_LIMITED,
                f"too many requests: at most {handler.bucket.rate:.0f} a second",
            ))
            return
        spec = handler.spec()
        if method == "request_schema":
            self._send(wire_v1.CONTROL, wire_v1.model_schema(request_id, model_documents.model_schema(spec)))
        elif method == "publish_track":
            name = request.payload.name
            inputs = [track.name for track in spec.inputs]
            if name in inputs:
                self._send(wire_v1.CONTROL, wire_v1.publish_track_reply(request_id, name))
            else:
                self._send(wire_v1.CONTROL, wire_v1.control_error(
                    request_id, wire_v1.BAD_REQUEST,
                    f"the model has no input track {brief(name)} (input tracks: "
                    f"{', '.join(inputs) or 'none'})",
                ))
        elif method in ("request_clip", "request_recording"):
            seconds = request.payload.duration_seconds if method == "request_clip" else None
            if not handler.request_clip(seconds, partial(self._clip_answered, request_id)):
                self._send(wire_v1.CONTROL, wire_v1.clip_failed(request_id, NO_CLIPS))

    def _clip_answered(self, request_id: str, answer: Any) -> None:
        if answer.failed is not None:
            self._send(wire_v1.CONTROL, wire_v1.clip_failed(request_id, answer.failed))
            return
        self._send(wire_v1.CONTROL, wire_v1.clip_ready(
            request_id, session_id=self._handler.session_id, kind=answer.kind,
            start_marker=answer.start_s, end_marker=answer.end_s, now_marker=answer.now_s,
            predicted_ready_at_ms=answer.ready_at_ms, playlist_url=answer.playlist_url,
        ))

    def _refuse(self, label: str, request_id: str | None, exc: Exception) -> None:
        """A frame dropped as unreadable: counted and logged, and answered BAD_REQUEST
        on its channel when its id could be read (within the rate limit)."""
        self._handler.ignore("data-channel" if label == wire_v1.DATA else label, exc)
        if request_id is not None and self._handler.admit(None):
            encode = wire_v1.data_error if label == wire_v1.DATA else wire_v1.control_error
            self._send(label, encode(request_id, wire_v1.BAD_REQUEST, str(exc)))
