"""Inbound data-channel handling: every frame a client sends is hostile until parsed.

One `InboundHandler` per model session decodes each frame on `"data"` and `"control"`
(channel_codec.py), routes it (commands to the model session, `requestSchema` and
`requestCapabilities` answered here, `publish_track` answered on `"control"`), and
limits commands per session with a token bucket. docs/architecture.md "Bad input and
faults" is the contract:

- a frame that is not a valid envelope (null, an array, binary, malformed JSON) is
  dropped with one log line, rate-limited, and counted; the session goes on;
- a text frame refused whole (too big, nested past MAX_PARSE_DEPTH, not UTF-8, a
  lone surrogate in its type) is dropped and counted the same way, and also answered
  with a `commandError` naming the rule it broke (and the command and id, where the
  text shows them): a client must never be left guessing why its command vanished;
- an application envelope naming a command whose arguments cannot be accepted as sent
  (NaN, 1e309, a 5000-digit integer, a lone surrogate, 200 levels of nesting, data that
  is not an object) gets a `commandError` naming field and rule, with the value
  described, never echoed raw;
- commands past the rate limit are dropped, with one `commandError` (rule
  `rate_limited`) per flood, not one per dropped command; except generated setters
  (`set_<field>`), whose newest value must win: one refused by the limit is held,
  replacing any held value of its field (counted as coalesced, not an error), and
  handed on when the bucket has a token again. At most one value per field is held,
  so a flood costs a dict update per frame and no memory;
- nothing is raised out of a handler, ever: an exception from an aiortc "message"
  handler propagates into its DTLS receive loop, which then closes the transport and
  the video stops. `guard_sctp_text_frames` (on each session's transport) covers the one case
  that fails inside aiortc before any handler runs: a text frame that is not UTF-8.

`PeerSession` makes one handler per session and hands it every frame of its channels.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from reactor_serve.protocol import channel_codec, model_documents
from reactor_serve.protocol.wire_v1 import codec as wire_v1
from reactor_serve.protocol.wire_version import Wire, sniff
from reactor_serve.runtime.command_queue import CommandQueue
from reactor_serve.runtime.field_errors import command_error
from reactor_serve.runtime.log_throttle import LogThrottle
from reactor_serve.sessions.recording.recorder import RECORDING_REQUESTS
from reactor_serve.sessions.uploads.arguments import (
    FileLookup,
    described,
    resolve_files,
)
from reactor_serve.sessions.wire_v1_requests import WireV1Requests

__all__ = [
    "COMMAND_BURST",
    "COMMAND_RATE",
    "InboundCounters",
    "InboundHandler",
    "TokenBucket",
]

log = logging.getLogger(__name__)

# Commands a session may send per second, sustained, and in a burst. A slider dragged
# by a person sends about 60 a second (one per animation frame), a held key repeats at
# about 30, a scripted client replaying a recording may send a few at once per frame:
# 200/s is several times any of those, while a flood of thousands a second would queue
# work on the model thread (each command is validated there) faster than frames are
# made. The burst lets a client set every field at connect without being throttled.
COMMAND_RATE = 200.0
COMMAND_BURST = 400


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

    def delay(self) -> float:
        """Seconds until `take()` can succeed (0.0: now)."""
        elapsed = max(0.0, self._clock() - self._at)
        tokens = min(self.burst, self._tokens + elapsed * self.rate)
        return max(0.0, (1.0 - tokens) / self.rate)

    @property
    def full(self) -> bool:
        """True when at most one token short of `burst` (as right after a take from
        a full bucket): the sender has kept under the rate for a while."""
        return self._tokens >= self.burst - 1.0


_throttle = LogThrottle(log)


@dataclass
class InboundCounters:
    """What one session's handler has seen, for stats and for tests."""

    frames: int = 0  # every inbound frame, readable or not
    ignored: int = 0  # not a valid envelope: dropped with a (throttled) log line
    commands: int = 0  # valid commands handed to the model session
    rejected: int = 0  # commands answered here with a commandError (malformed arguments)
    rate_limited: int = 0  # frames dropped by the command rate limit
    held: int = 0  # setters past the rate limit, held for the next token
    coalesced: int = 0  # held setters replaced by a newer value of their field
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
        command: Callable[..., str | int | None],
        send: Callable[[str], None],
        send_control: Callable[[str], None],
        spec: Callable[[], Any],
        on_ignored: Callable[[], None] | None = None,
        bucket: TokenBucket | None = None,
        report_latency: Callable[[Any, Any], str | None] | None = None,
        on_command: Callable[[str, Any, dict[str, Any] | None, str | int | None], None] | None = None,
        recording: Callable[[str, dict[str, Any]], None] | None = None,
        on_coalesced: Callable[[], None] | None = None,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
        send_frame: Callable[[str, bytes], None] | None = None,
        files: FileLookup | None = None,
        track_control: Callable[[str, str], None] | None = None,
        clips: Callable[[float | None, Callable[[Any], None]], bool] | None = None,
        steps: Callable[[str, Any], None] | None = None,
        step_bytes: int = 0,
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
        # startRecording / stopRecording / saveClip (sessions/recording/recorder.py).
        self._recording = recording
        self.bucket = bucket or TokenBucket(COMMAND_RATE, COMMAND_BURST)
        self.counters = InboundCounters()
        # Set once a rate_limited commandError went out; cleared only once the bucket
        # has refilled (the client slowed down for burst/rate seconds). Clearing it on
        # the next admitted command instead would send an error per refilled token
        # under a sustained flood, which is as bad as one per dropped command.
        self._limit_reported = False
        # Setters past the rate limit, newest value per command (see the module doc).
        self._held: CommandQueue[tuple[str, dict[str, Any], str | int | None]] = CommandQueue()
        self._on_coalesced = on_coalesced
        # Schedules the release of held setters once a token is back (the running
        # loop's call_later unless injected); without it they wait for the next frame.
        self._call_later = call_later or _loop_call_later
        self._release_scheduled = False
        # Wire v1 (protocol/wire_v1): spoken where frames can be sent binary to the
        # client; `wire` is told per connection by its first frame (None: not yet).
        self._send_frame = send_frame
        self.wire: Wire | None = None
        self._v1 = WireV1Requests(self, send_frame) if send_frame is not None else None
        # The session's uploads by id: upload references in a command's file-typed
        # arguments become the files (sessions/uploads/arguments.py).
        self._files = files
        # `pause_track` / `resume_track` from the client, for its connection's tracks.
        self._track_control = track_control
        # Wire v1 clip requests (SessionRecordings.request_clip); None: not recorded.
        self._clips = clips
        # Wire v1 step requests of a stepped session (SessionSteps.request), and the
        # most one may weigh; None: the session streams.
        self._steps = steps
        self.step_bytes = step_bytes if steps is not None else 0

    def spec(self) -> Any:
        """The model's spec (commands, tracks), as it is now."""
        return self._spec()

    def new_connection(self) -> None:
        """The client connected again: its next frame tells which wire it speaks."""
        self.wire = None

    def on_message(self, label: str, raw: Any) -> None:
        self.counters.frames += 1
        try:
            if self.wire is None:
                self.wire = sniff(raw) if self._v1 is not None else Wire.V0
            if self.wire is Wire.V1 and self._v1 is not None:
                self._v1.on_message(label, raw)
            elif label == "control":
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
            message = channel_codec.decode(raw)
        except channel_codec.BadCommand as exc:
            self.reject(exc, exc.command_id)
            return
        except channel_codec.RefusedFrame as exc:
            self.ignore("data-channel", exc)
            self._refuse_frame(raw, exc)
            return
        except channel_codec.ProtocolError as exc:
            self.ignore("data-channel", exc)
            return
        if message.scope == "application":
            self.submit(message.type, message.data, message.id)
        elif message.type == "ping":
            pass  # liveness only, and the caller has noted it
        elif message.type == "requestSchema":
            # Answering builds a document: rate-limited like a command, silently.
            if self.admit(None):
                self.send_runtime("modelSchema", model_documents.model_schema(self._spec()))
        elif message.type == "requestCapabilities":
            if self.admit(None):
                self.send_runtime("modelCapabilities", model_documents.capabilities(self._spec()))
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
            if self.admit(None):
                self._recording(message.type, message.data)
        else:
            log.debug("session %s: unhandled runtime message %s", self.session_id,
                      channel_codec.brief(message.type))

    def submit(
        self, name: str, args: dict[str, Any], command_id: str | int | None, *, reply: bool = False
    ) -> None:
        """A decoded command, from either wire: rate-limited, setters past the limit
        held, the rest handed to the model session. `reply`: the client waits for an
        answer naming `command_id` (wire v1), so every command gets one: accepted,
        refused, or coalesced away."""
        # Held values go first: a token they wait for is theirs before a newer
        # command's, and an older value must never land after a newer one.
        self._release_held()
        try:
            resolved = self._resolve_files(name, args)
        except channel_codec.BadCommand as exc:
            self.reject(exc, command_id, reply=reply)
            return
        # The log shows what the client sent: references, not the files' bytes.
        logged = described(resolved) if resolved is not args else args
        setter = self._is_setter(name)
        if setter and (name in self._held or not self.bucket.take()):
            self._hold(name, resolved, command_id, reply, logged)
        elif setter or self.admit(name, command_id if reply else None):
            self._hand_on(name, resolved, command_id, reply, logged)

    def _resolve_files(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        command = getattr(self._spec(), "commands", {}).get(name)
        if self._files is None or command is None:
            return args
        return resolve_files(name, command.params, args, self._files)

    def _hand_on(
        self, name: str, args: dict[str, Any], command_id: str | int | None, reply: bool,
        logged: dict[str, Any],
    ) -> None:
        self.counters.commands += 1
        command_id = self._call_command(name, args, command_id, reply)
        if self._on_command is not None:
            self._on_command(name, logged, None, command_id)

    def reject(self, exc: channel_codec.BadCommand, command_id: str | int | None, *, reply: bool = False) -> None:
        """Answer a command whose arguments cannot be accepted as sent, naming the field
        and rule, and log it with the session's commands."""
        if not self.admit(exc.command, command_id if reply else None):
            return
        self.counters.rejected += 1
        error = command_error(exc.command, str(exc), exc.errors)
        if command_id is not None:
            error["id"] = command_id
        if self._on_command is not None:
            self._on_command(exc.command, None, error, command_id)
        self.send_runtime("commandError", error)

    def send_runtime(self, type_: str, data: dict[str, Any]) -> None:
        """A runtime message to the client, on the wire it speaks."""
        if self.wire is Wire.V1 and self._send_frame is not None:
            envelope = {"scope": "runtime", "data": {"type": type_, "data": data}}
            for label, frame in wire_v1.from_envelope(envelope):
                self._send_frame(label, frame)
        else:
            self._send(channel_codec.runtime(type_, data))

    def _refuse_frame(self, raw: Any, exc: channel_codec.RefusedFrame) -> None:
        name, command_id = channel_codec.salvage_command(raw)
        # A token, as for any command answered here: a flood of such frames gets one
        # rate_limited error, not one error each.
        if not self.admit(name if name is not None else "<unreadable frame>"):
            return
        self.counters.rejected += 1
        error = command_error(
            name, str(exc), [{"field": None, "rule": exc.rule, "value": None}]
        )
        if command_id is not None:
            error["id"] = command_id
        if self._on_command is not None and name is not None:
            self._on_command(name, None, error, command_id)
        self.send_runtime("commandError", error)

    # ---- setters past the rate limit ----------------------------------------------

    def _is_setter(self, name: str) -> bool:
        command = getattr(self._spec(), "commands", {}).get(name)
        return getattr(command, "kind", None) == "setter"

    def _hold(
        self, name: str, args: dict[str, Any], command_id: str | int | None, reply: bool,
        logged: dict[str, Any],
    ) -> None:
        self.counters.held += 1
        replaced = self._held.put((name, args, command_id, reply), name)
        if replaced is not None:
            self.counters.coalesced += 1
            if self._on_coalesced is not None:
                self._on_coalesced()
            if replaced[3]:
                self._settle_replaced(*replaced[:3])
        # Logged as it arrives, like every command handed on: the log is what the
        # client sent, in order; a value coalesced away was still accepted.
        if self._on_command is not None:
            self._on_command(name, logged, None, command_id)
        self._schedule_release()

    def _settle_replaced(self, name: str, args: dict[str, Any], command_id: str | int | None) -> None:
        """Answer a held setter a newer value replaced before it applied: accepted if
        the model would have taken it (the newer value simply won), refused if not."""
        command = getattr(self._spec(), "commands", {}).get(name)
        try:
            command.validate(args)
        except Exception as exc:  # InputRejected, or a model's own validator failing
            errors = getattr(exc, "errors", None) or [{"field": None, "rule": "invalid", "value": None}]
            error = command_error(name, getattr(exc, "message", str(exc)), errors)
            error["id"] = command_id
            self.send_runtime("commandError", error)
            return
        self.send_runtime("commandAccepted", {"id": command_id, "command": name})

    def _release_held(self) -> None:
        while self._held and self.bucket.take():
            name, args, command_id, reply = self._held.popleft()
            self.counters.commands += 1
            self._call_command(name, args, command_id, reply)

    def _call_command(
        self, name: str, args: dict[str, Any], command_id: str | int | None, reply: bool
    ) -> str | int | None:
        # `reply` only when set: a `command` callable of a v0-only handler (a viewer's)
        # takes no such keyword.
        if reply:
            return self._command(name, args, command_id, reply=True)
        return self._command(name, args, command_id)

    def _schedule_release(self) -> None:
        if self._release_scheduled or not self._held:
            return
        try:
            self._call_later(self.bucket.delay(), self._on_release_due)
        except RuntimeError:  # no running loop: the next frame releases them
            return
        self._release_scheduled = True

    def _on_release_due(self) -> None:
        self._release_scheduled = False
        try:
            self._release_held()
        except Exception:
            self.counters.faults += 1
            _throttle.exception("session %s: releasing held commands failed", self.session_id)
        self._schedule_release()

    # ---- "control" ----------------------------------------------------------------

    def _on_control(self, raw: Any) -> None:
        try:
            request = channel_codec.decode_control(raw)
        except channel_codec.ProtocolError as exc:
            self.ignore("control", exc)
            return
        if request["type"] != "request":
            # Notifications need no answer.
            self.control_track(request.get("event"), request["data"].get("name"))
            return
        if not self.admit(None):
            return
        name = request["data"].get("name")
        spec = self._spec()
        known = {t.name for t in spec.inputs} | {t.name for t in spec.outputs}
        # isinstance first: a list or object name is unhashable, and `in` on a set
        # would raise.
        if request["method"] == "publish_track" and not (isinstance(name, str) and name in known):
            reply = channel_codec.control_response(
                request, error=("unknown_track", f"the model has no track {channel_codec.brief(name)}")
            )
        else:
            reply = channel_codec.control_response(request, data={})
        self._send_control(reply)

    # ---- shared -------------------------------------------------------------------

    def control_track(self, event: Any, name: Any) -> None:
        """A `pause_track` or `resume_track` notification naming one of the tracks the
        session sends this client; anything else is nothing to do."""
        if (
            self._track_control is not None
            and event in ("pause_track", "resume_track")
            and isinstance(name, str)
        ):
            self._track_control(event, name)

    def request_step(self, request_id: str, request: Any) -> bool:
        """A wire v1 step; False when this session streams."""
        if self._steps is None:
            return False
        self._steps(request_id, request)
        return True

    def resolve_files(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """`args` of command `name` with its upload references made files (raises
        BadCommand naming the field for one that names no upload of the session)."""
        return self._resolve_files(name, args)

    def request_clip(self, seconds: float | None, answer: Callable[[Any], None]) -> bool:
        """A wire v1 clip (`seconds`) or recording (None) request; False when this
        session cannot cut one."""
        return self._clips is not None and self._clips(seconds, answer)

    def admit(self, command: str | None, request_id: str | int | None = None) -> bool:
        """Spend a token; past the limit, drop the frame and, for a command, tell the
        client once per flood (see _limit_reported). A command whose sender waits for
        an answer naming `request_id` (wire v1) is answered each time: a waiting
        client must never be left to time out."""
        if self.bucket.take():
            if self._limit_reported and self.bucket.full:
                self._limit_reported = False
            return True
        self.counters.rate_limited += 1
        if command is None:
            return False
        first = not self._limit_reported
        if first:
            self._limit_reported = True
            _throttle.warning(
                "session %s: more than %.0f commands/s; dropping commands until the rate falls",
                self.session_id, self.bucket.rate,
            )
        if first or request_id is not None:
            error = command_error(
                command,
                f"too many commands: at most {self.bucket.rate:.0f} a second (bursts of "
                f"{self.bucket.burst:.0f}); this and later commands are dropped until the "
                "rate falls",
                [{"field": None, "rule": "rate_limited", "value": None}],
            )
            if request_id is not None:
                error["id"] = request_id
            self.send_runtime("commandError", error)
        return False

    def ignore(self, channel: str, exc: Exception) -> None:
        """Count and log (throttled) a frame dropped as unreadable."""
        self.counters.ignored += 1
        if self._on_ignored is not None:
            self._on_ignored()
        # %.200s: the reason quotes the client's bytes (escaped); keep lines short.
        _throttle.warning("session %s: ignored a %s frame: %.200s", self.session_id, channel, exc)


def _loop_call_later(delay: float, callback: Callable[[], None]) -> Any:
    return asyncio.get_running_loop().call_later(delay, callback)
