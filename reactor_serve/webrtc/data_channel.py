"""Inbound data-channel handling: every frame a client sends is hostile until parsed.

One `InboundHandler` per model session decodes each frame on `"data"` and `"control"`
(protocol.py), routes it (commands to the model session, `requestSchema` and
`requestCapabilities` answered here, `publish_track` answered on `"control"`), and
limits commands per session with a token bucket. ARCHITECTURE.md "Bad input and
faults" is the contract:

- a frame that is not a valid envelope (null, an array, binary, too big, too deep, not
  UTF-8) is dropped with one log line, rate-limited, and counted; the session goes on;
- an application envelope naming a command whose arguments cannot be accepted as sent
  (NaN, 1e309, a 5000-digit integer, a lone surrogate, 200 levels of nesting, data that
  is not an object) gets a `commandError` naming field and rule, with the value
  described, never echoed raw;
- commands past the rate limit are dropped, with one `commandError` (rule
  `rate_limited`) per flood, not one per dropped command;
- nothing is raised out of a handler, ever: an exception from an aiortc "message"
  handler propagates into its DTLS receive loop, which then closes the transport and
  the video stops. `guard_sctp_text_frames` (on each session's transport) covers the one case
  that fails inside aiortc before any handler runs: a text frame that is not UTF-8.

`receive(peer, label, raw)` is what `PeerSession`'s channel callback calls.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from reactor_serve.runtime.field_errors import command_error
from reactor_serve.webrtc import protocol, schema
from reactor_serve.webrtc.recording import RECORDING_REQUESTS

if TYPE_CHECKING:
    from reactor_serve.webrtc.peer import PeerSession

__all__ = [
    "COMMAND_BURST",
    "COMMAND_RATE",
    "InboundCounters",
    "InboundHandler",
    "LogThrottle",
    "TokenBucket",
    "command_of",
    "guard_sctp_text_frames",
    "handler_of",
    "receive",
]

log = logging.getLogger("reactor_serve.webrtc")

# Commands a session may send per second, sustained, and in a burst. A slider dragged
# by a person sends about 60 a second (one per animation frame), a held key repeats at
# about 30, a scripted client replaying a recording may send a few at once per frame:
# 200/s is several times any of those, while a flood of thousands a second would queue
# work on the model thread (each command is validated there) faster than frames are
# made. The burst lets a client set every field at connect without being throttled.
COMMAND_RATE = 200.0
COMMAND_BURST = 400

# Warnings about bad frames, across all sessions: at most LOG_LINES per LOG_WINDOW_S,
# then one line saying how many were suppressed. A client flooding garbage must not be
# able to fill the disk through our logs; a handful per window is enough to diagnose.
LOG_LINES = 20
LOG_WINDOW_S = 10.0


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`; `take()` spends one if there is
    one. `clock` is injectable so that tests need no sleeps."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        # max(): a clock that steps back must not drain the bucket.
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @property
    def full(self) -> bool:
        """True when at most one token short of `burst` (as right after a take from
        a full bucket): the sender has kept under the rate for a while."""
        return self._tokens >= self.burst - 1.0


class LogThrottle:
    """At most `lines` log lines per `window_s`; the rest are counted and reported in
    one line when the next window opens."""

    def __init__(
        self,
        logger: logging.Logger,
        lines: int = LOG_LINES,
        window_s: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.lines = lines
        self.window_s = window_s
        self._clock = clock
        self._start = clock()
        self._count = 0
        self.suppressed = 0

    def allow(self) -> bool:
        now = self._clock()
        if now - self._start >= self.window_s:
            if self.suppressed:
                self.logger.warning(
                    "%d more data-channel warnings suppressed in %.0f s",
                    self.suppressed, self.window_s,
                )
            self._start, self._count, self.suppressed = now, 0, 0
        if self._count < self.lines:
            self._count += 1
            return True
        self.suppressed += 1
        return False

    def warning(self, msg: str, *args: Any) -> None:
        if self.allow():
            self.logger.warning(msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        if self.allow():
            self.logger.exception(msg, *args)


_throttle = LogThrottle(log)


@dataclass
class InboundCounters:
    """What one session's handler has seen, for stats and for tests."""

    frames: int = 0  # every inbound frame, readable or not
    ignored: int = 0  # not a valid envelope: dropped with a (throttled) log line
    commands: int = 0  # valid commands handed to the model session
    rejected: int = 0  # commands answered here with a commandError (malformed arguments)
    rate_limited: int = 0  # frames dropped by the command rate limit
    faults: int = 0  # unexpected exceptions caught and swallowed


class InboundHandler:
    """Decodes, routes and rate-limits one session's inbound data-channel frames.

    `command(name, args, id)` hands a valid command to the model session (`id`: the
    client's id for it, or None); `send(text)` sends a `"data"` frame; `send_control(text)`
    a `"control"` frame; `spec()` gives the model's spec (for schema and track names).
    `report_latency(id, latency_ms)` takes a client's `inputLatency` report and returns
    why it was refused, or None (no callable: reports are ignored). `on_ignored()` is
    called for every frame dropped as unreadable. `on_message` never raises.
    """

    def __init__(
        self,
        *,
        session_id: str,
        command: Callable[[str, dict[str, Any], str | int | None], str | int | None],
        send: Callable[[str], None],
        send_control: Callable[[str], None],
        spec: Callable[[], Any],
        on_ignored: Callable[[], None] | None = None,
        bucket: TokenBucket | None = None,
        report_latency: Callable[[Any, Any], str | None] | None = None,
        on_command: Callable[[str, Any, dict[str, Any] | None, str | int | None], None] | None = None,
        recording: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self._command = command
        self._report_latency = report_latency
        self._send = send
        self._send_control = send_control
        self._spec = spec
        self._on_ignored = on_ignored
        # Told of every command (name, args, None, id) handed on, and of every one
        # refused here (name, None, its commandError, id): the session's recording
        # logs them. `command` returns the id the command went on with (the client's,
        # or one the session made up), which the model's commandError will name.
        self._on_command = on_command
        # startRecording / stopRecording / saveClip (webrtc/recording.py).
        self._recording = recording
        self.bucket = bucket or TokenBucket(COMMAND_RATE, COMMAND_BURST)
        self.counters = InboundCounters()
        # Set once a rate_limited commandError went out; cleared only once the bucket
        # has refilled (the client slowed down for burst/rate seconds). Clearing it on
        # the next admitted command instead would send an error per refilled token
        # under a sustained flood, which is as bad as one per dropped command.
        self._limit_reported = False

    def on_message(self, label: str, raw: Any) -> None:
        self.counters.frames += 1
        try:
            if label == "control":
                self._on_control(raw)
            else:
                self._on_data(raw)
        except Exception:
            self.counters.faults += 1
            _throttle.exception(
                "session %s: a %s frame broke its handler; dropped it", self.session_id, label
            )

    # ---- "data" -------------------------------------------------------------------

    def _on_data(self, raw: Any) -> None:
        try:
            message = protocol.decode(raw)
        except protocol.BadCommand as exc:
            if not self._admit(exc.command):
                return
            self.counters.rejected += 1
            error = command_error(exc.command, str(exc), exc.errors)
            if exc.command_id is not None:
                error["id"] = exc.command_id
            if self._on_command is not None:
                self._on_command(exc.command, None, error, exc.command_id)
            self._send(protocol.runtime("commandError", error))
            return
        except protocol.ProtocolError as exc:
            self._ignore("data-channel", exc)
            return
        if message.scope == "application":
            if self._admit(message.type):
                self.counters.commands += 1
                command_id = self._command(message.type, message.data, message.id)
                if self._on_command is not None:
                    self._on_command(message.type, message.data, None, command_id)
        elif message.type == "ping":
            pass  # liveness only, and the caller has noted it
        elif message.type == "requestSchema":
            # Answering builds a document: rate-limited like a command, silently.
            if self._admit(None):
                self._send(protocol.runtime("modelSchema", schema.model_schema(self._spec())))
        elif message.type == "requestCapabilities":
            if self._admit(None):
                self._send(protocol.runtime("modelCapabilities", schema.capabilities(self._spec())))
        elif message.type == "inputLatency":
            # One per answered command, each id taken once: no more than the commands
            # admitted, and as cheap to refuse as a ping, so it spends no command
            # token (that would halve a reporting client's command rate). Refused
            # silently: it is the client's measurement, nothing waits for an answer.
            if self._report_latency is not None:
                why = self._report_latency(message.data.get("id"), message.data.get("latency_ms"))
                if why is not None:
                    log.debug("session %s: inputLatency ignored: %s", self.session_id, why)
        elif message.type in RECORDING_REQUESTS and self._recording is not None:
            if self._admit(None):
                self._recording(message.type, message.data)
        else:
            log.debug("session %s: unhandled runtime message %s", self.session_id,
                      protocol.brief(message.type))

    # ---- "control" ----------------------------------------------------------------

    def _on_control(self, raw: Any) -> None:
        try:
            request = protocol.decode_control(raw)
        except protocol.ProtocolError as exc:
            self._ignore("control", exc)
            return
        if request["type"] != "request":
            return  # notifications (pause/resume/unpublish) need no answer
        if not self._admit(None):
            return
        name = request["data"].get("name")
        spec = self._spec()
        known = {t.name for t in spec.inputs} | {t.name for t in spec.outputs}
        # isinstance first: a list or object name is unhashable, and `in` on a set
        # would raise.
        if request["method"] == "publish_track" and not (isinstance(name, str) and name in known):
            reply = protocol.control_response(
                request, error=("unknown_track", f"the model has no track {protocol.brief(name)}")
            )
        else:
            reply = protocol.control_response(request, data={})
        self._send_control(reply)

    # ---- shared -------------------------------------------------------------------

    def _admit(self, command: str | None) -> bool:
        """Spend a token; past the limit, drop the frame and, for a command, tell the
        client once per flood (see _limit_reported)."""
        if self.bucket.take():
            if self._limit_reported and self.bucket.full:
                self._limit_reported = False
            return True
        self.counters.rate_limited += 1
        if command is not None and not self._limit_reported:
            self._limit_reported = True
            _throttle.warning(
                "session %s: more than %.0f commands/s; dropping commands until the rate falls",
                self.session_id, self.bucket.rate,
            )
            self._send(protocol.runtime("commandError", command_error(
                command,
                f"too many commands: at most {self.bucket.rate:.0f} a second (bursts of "
                f"{self.bucket.burst:.0f}); this and later commands are dropped until the "
                "rate falls",
                [{"field": None, "rule": "rate_limited", "value": None}],
            )))
        return False

    def _ignore(self, channel: str, exc: Exception) -> None:
        self.counters.ignored += 1
        if self._on_ignored is not None:
            self._on_ignored()
        # %.200s: the reason quotes the client's bytes (escaped); keep lines short.
        _throttle.warning("session %s: ignored a %s frame: %.200s", self.session_id, channel, exc)


# ---- PeerSession's side -------------------------------------------------------------

# One handler per PeerSession, kept as long as the peer lives. Keyed weakly so that this
# module holds no session alive; the bucket survives reconnects (same PeerSession).
_handlers: weakref.WeakKeyDictionary[Any, InboundHandler] = weakref.WeakKeyDictionary()


def handler_of(peer: PeerSession) -> InboundHandler:
    """The handler of `peer`'s inbound frames, made on first use."""
    handler = _handlers.get(peer)
    if handler is None:
        handler = _handlers[peer] = _make_handler(peer)
    return handler


def receive(peer: PeerSession, label: str, raw: Any) -> None:
    """Handle one frame that arrived on `peer`'s data channel `label`. Never raises."""
    try:
        handler_of(peer).on_message(label, raw)
    except Exception:  # only if making the handler failed: on_message itself is total
        _throttle.exception("session %s: could not handle a %s frame", getattr(peer, "id", "?"), label)


def command_of(raw: Any) -> tuple[str, Any] | None:
    """(command name, its errors as sent in commandError) if `raw` is an application
    envelope naming a command whose arguments cannot be accepted; else None."""
    try:
        protocol.decode(raw)
    except protocol.BadCommand as exc:
        return exc.command, exc.errors
    except protocol.ProtocolError:
        return None
    return None


def _make_handler(peer: PeerSession) -> InboundHandler:
    # The handler reads the peer through these small closures only, so that the peer's
    # session (opened after the first offer) and channels (replaced on reconnect) are
    # looked up per frame. They hold the peer weakly: the handler is `_handlers[peer]`,
    # and a value that refers to its weak key keeps both alive for good (every ended
    # session, its recorder, viewer room and aiortc objects with it).
    peer_ref = weakref.ref(peer)
    host = peer.host

    def command(name: str, args: dict[str, Any], command_id: str | int | None) -> str | int | None:
        live = peer_ref()
        session = live.session if live is not None else None
        if session is None:
            return command_id
        return session.command(name, args, command_id).id

    def report_latency(command_id: Any, latency_ms: Any) -> str | None:
        live = peer_ref()
        session = live.session if live is not None else None
        if session is None:
            return "no session"
        return session.report_latency(command_id, latency_ms)

    def send(text: str) -> None:
        live = peer_ref()
        if live is not None:
            live._send(text)

    def send_control(text: str) -> None:
        live = peer_ref()
        channel = live._channels.get("control") if live is not None else None
        if channel is not None and channel.readyState == "open":
            channel.send(text)

    def ignored() -> None:
        live = peer_ref()
        if live is not None:
            live.ignored_frames += 1

    def on_command(
        name: str, args: Any, error: dict[str, Any] | None, command_id: str | int | None
    ) -> None:
        live = peer_ref()
        recordings = live.recordings if live is not None else None
        if recordings is not None:
            recordings.command(name, args, error, command_id)

    def recording(type_: str, data: dict[str, Any]) -> None:
        live = peer_ref()
        recordings = live.recordings if live is not None else None
        if recordings is not None:
            recordings.request(type_, data)
        else:
            send(protocol.runtime("recordingError", command_error(
                type_, "the session is not open yet", [{"field": None, "rule": "not_open", "value": None}]
            )))

    return InboundHandler(
        session_id=peer.id,
        command=command,
        send=send,
        send_control=send_control,
        spec=lambda: host.spec,
        on_ignored=ignored,
        report_latency=report_latency,
        on_command=on_command,
        recording=recording,
    )


# ---- aiortc --------------------------------------------------------------------------


def guard_sctp_text_frames(transport: Any) -> None:
    """Make one of our peer connections' SCTP transports survive a hostile peer.

    aiortc decodes a text frame with strict UTF-8 before any "message" handler runs, and
    an exception there (or from any handler, or from malformed channel-open messages)
    unwinds into the DTLS receive loop, which closes the transport: one bad frame would
    end the session. Guarded, a text frame that is not UTF-8 is handed on as a str
    whose bad bytes are lone surrogates (`surrogateescape`), which protocol.decode
    rejects as "not valid UTF-8 text"; anything else raised while receiving a
    data-channel frame is logged (throttled) and the frame dropped.

    Per transport, not on aiortc's class: only the server's own sessions are changed,
    never another RTCPeerConnection in the process (a client, a test). Call it after
    setRemoteDescription (which makes the transport) and before the answer is sent
    (no frame can arrive earlier). Idempotent; None (an offer without a data channel)
    is ignored.
    """
    if transport is None or getattr(transport, "_reactor_guarded", False):
        return
    from aiortc import rtcsctptransport as sctp

    original = transport._data_channel_receive

    async def _data_channel_receive(stream_id: int, pp_id: int, data: bytes) -> None:
        try:
            if pp_id == sctp.WEBRTC_STRING and stream_id in transport._data_channels:
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    transport._data_channels[stream_id].emit(
                        "message", data.decode("utf-8", "surrogateescape")
                    )
                    return
            await original(stream_id, pp_id, data)
        except Exception:
            _throttle.exception("a data-channel frame broke aiortc's receive path; dropped it")

    transport._data_channel_receive = _data_channel_receive
    transport._reactor_guarded = True
