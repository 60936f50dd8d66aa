"""`Session`: one connected client, and the seams a transport plugs into.

A transport (WebRTC, or the in-process `LocalClient`) opens a session on a
`SessionHost` (a `ModelProcess`, or a `ModelHost` running the model in this process)
with a `SessionSink` that receives messages and the end of the session. It then
drives the session's `EmissionClock` for output, pushes input frames, and forwards
commands. Everything here is safe to call from the transport's thread.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import secrets
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from reactor_serve.interface.messages import ModelMessage, message_payload
from reactor_serve.runtime.input_latency import (
    MAX_LATENCY_MS,
    CommandTicket,
    FrameAnswer,
    LatencyWindow,
)
from reactor_serve.runtime.pacing.emission_clock import EmissionClock
from reactor_serve.runtime.pacing.output_buffer import OutputBuffer
from reactor_serve.runtime.stepping import StepGate, StepOutcome

if TYPE_CHECKING:
    from reactor_serve.interface.context import SessionContext
    from reactor_serve.runtime.loading.model_spec import ModelSpec
    from reactor_serve.runtime.ranks.rank_census import RankProcess

__all__ = ["EndReason", "SeatedHost", "Session", "SessionHost", "SessionSink"]

# Ids for commands sent without one: unique in the process, so an answer carried
# over from an earlier session can never be taken for one of this session's.
_server_ids = itertools.count(1)
# Answered commands waiting for the client's report, at most (older ones are dropped:
# a client that never reports must not grow the session).
_ANSWERED_KEPT = 256


class EndReason:
    """Why a session ended, as sent in `sessionEnded`."""

    CLIENT_CLOSED = "client_closed"
    MODEL_ENDED = "model_ended"
    ERROR = "error"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"
    # The session reached the longest its API key or token allows.
    LIMIT = "limit"


class SessionSink(Protocol):
    """Where a session's output goes. Called from the model's threads: implementations
    hop to their own loop."""

    def message(self, envelope: dict[str, Any]) -> None:
        """A data-channel envelope: `{"scope": "application"|"runtime", "data": {...}}`."""

    def ended(self, reason: str, detail: str | None) -> None:
        """The session is over (after `sessionEnded` was delivered through `message`)."""


class SessionHost(Protocol):
    """What runs a model and its sessions, as transports use it: a `ModelProcess`, or
    a `ModelHost` running the model in this process. The frames the model made are
    queued in `output_buffer`; input and commands reach it through `push_input` and
    `submit_command`."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def config(self) -> Any:
        """The config mapping the model's `load()` gets."""

    @property
    def output_buffer(self) -> OutputBuffer: ...

    @property
    def healthy(self) -> bool:
        """Loaded and able to take a session."""

    @property
    def load_error(self) -> Exception | None:
        """Why the model is not loaded, if it failed to."""

    @property
    def model_errors(self) -> int:
        """Model errors so far that ended a session."""

    @property
    def restarts(self) -> int:
        """Times the model was started again after a crash or a failed load."""

    async def open_session(
        self, sink: SessionSink, session_id: str | None = None, *, stepped: bool = False
    ) -> Session:
        """Connect a client (raises SessionBusy while another session is live).
        `stepped`: the model makes nothing until asked, one unit per `step`."""

    async def step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> StepOutcome:
        """One step of a stepped session: apply `state` (each field through its
        setter) and `commands`, in order, then run one unit of the model's work, whose
        frames arrive in `output_buffer` before this returns."""

    def push_input(self, session: Session, track: str, frame: Any) -> None:
        """A client frame for input track `track` (raises KeyError for an unknown one)."""

    def push_inputs(self, session: Session, track: str, frames: list[Any]) -> None:
        """Client frames for `track`, oldest first, landing together: a read waiting
        meanwhile wakes once they are all in."""

    def submit_command(
        self, session: Session, name: str, data: Any, ticket: CommandTicket | None = None
    ) -> None:
        """A client command; a rejected one comes back as `commandError`."""

    async def end_session(self, session: Session, reason: str, detail: str | None = None) -> None:
        """End `session` and wait until it is cleaned up."""


class SeatedHost(SessionHost, Protocol):
    """What runs a model for transports: the model's life, and its seats, each a
    `SessionHost` serving one session at a time (runtime/seats.py). As a
    `SessionHost` itself it is its first seat."""

    @property
    def seats(self) -> Sequence[SessionHost]:
        """Every seat, the first seat (this host) first."""

    def start(self, timeout: float | None = None) -> None:
        """Load the model (once for every seat); raises ModelLoadError when
        `load()` fails."""

    def shutdown(self, timeout: float = 15.0) -> None:
        """End every live session, stop the model."""

    @property
    def ranks(self) -> int:
        """The rank processes the model's runner starts (runtime/ranks)."""

    def rank_processes(self) -> list[RankProcess]:
        """Those running now, by rank."""


class Session:
    """One live client of a `SessionHost`."""

    def __init__(
        self, host: SessionHost, sink: SessionSink, session_id: str | None = None,
        *, stepped: bool = False,
    ) -> None:
        self.id = session_id or secrets.token_urlsafe(16)
        # A stepped session's one unit of work per step (runtime/stepping.py); None
        # when it streams.
        self.step_gate: StepGate | None = StepGate() if stepped else None
        self.host = host
        self.sink = sink
        # What `get_ctx()` returns for this session, where the model runs (set by
        # the `ModelHost`; None on the media side of a model process).
        self.context: SessionContext | None = None
        self._stopping = threading.Event()
        self.ended = threading.Event()
        self.end_reason: str | None = None
        self.end_detail: str | None = None
        self.commands_rejected = 0
        # Setter values replaced by a newer value of their field before they applied
        # (CommandQueue): not errors, but the client may want to know.
        self.commands_coalesced = 0
        # Input-to-frame latency (runtime/input_latency.py): commands answered by a
        # frame sent to the client and not yet reported, by id; the reports.
        self._answered: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self._answered_lock = threading.Lock()
        self.input_latency = LatencyWindow()

    @property
    def stopping(self) -> bool:
        """True once the session is ending: producers should stop."""
        return self._stopping.is_set()

    def mark_stopping(self) -> None:
        """The session is ending: its producer stops, its input is dropped."""
        self._stopping.set()

    @functools.cached_property
    def clock(self) -> EmissionClock:
        """Paces the host's output buffer to this client (made when a transport
        first asks: where the model runs in a process of its own, nobody does)."""
        return EmissionClock(self.host.output_buffer, self.host.spec.outputs)

    def push_input(self, track: str, frame: Any) -> None:
        """Deliver a client frame to the model's input track `track`."""
        self.push_inputs(track, [frame])

    def push_inputs(self, track: str, frames: list[Any]) -> None:
        """Deliver client frames to `track`, oldest first, landing together (a step's
        frames: a read waiting meanwhile takes the latest of them, not the first)."""
        known = [t.name for t in self.host.spec.inputs]
        if track not in known:
            raise KeyError(
                f"model has no input track {track!r} (input tracks: {', '.join(known) or 'none'})"
            )
        # Frames from a session that is ending, or has ended, are dropped.
        if not self.stopping and not self.ended.is_set():
            self.host.push_inputs(self, track, frames)

    def command(
        self, name: str, data: Any = None, command_id: str | int | None = None, *, reply: bool = False
    ) -> CommandTicket:
        """Deliver a client command; a rejected one comes back as `commandError`.
        `command_id`: the client's id for it (checked by the protocol), else one is
        made; the frame that answers it is reported under that id (`inputFrame`).
        `reply`: an accepted one comes back as `commandAccepted` too."""
        ticket = CommandTicket(
            id=f"s{next(_server_ids)}" if command_id is None else command_id,
            command=name,
            session_id=self.id,
            arrived_at=time.monotonic(),
            reply=reply,
        )
        self.host.submit_command(self, name, {} if data is None else data, ticket)
        return ticket

    def count_coalesced(self, count: int = 1) -> None:
        """`count` of this session's setter values were superseded before applying."""
        self.commands_coalesced += count
        # Where the model runs in a process of its own, its session's sink forwards
        # the count to the media process's session, whose stats the client reads.
        forward = getattr(self.sink, "coalesced", None)
        if forward is not None:
            forward(count)

    def frame_answered(
        self, answer: FrameAnswer, track: str, frame_offset: int,
        emitted_at: float, presented_at: float, encoding_at: float,
    ) -> None:
        """The frame answering `answer`'s command went to the encoder of output video
        `track`, `frame_offset` 90 kHz ticks after that track's first frame: tell the
        client which frame to wait for, and where the server's time went."""
        ticket = answer.ticket
        if ticket.session_id != self.id:
            return  # carried over from a session before this one
        with self._answered_lock:
            self._answered[ticket.id] = None
            while len(self._answered) > _ANSWERED_KEPT:
                self._answered.popitem(last=False)
        self.send_runtime("inputFrame", {
            "id": ticket.id,
            "command": ticket.command,
            "track": track,
            "frame_offset": frame_offset,
            "server_ms": answer.server_ms(emitted_at, presented_at, encoding_at),
        })

    def report_latency(self, command_id: Any, latency_ms: Any) -> str | None:
        """The client's report of when a command's answering frame reached it. Returns
        why it was not taken (unknown or already reported id, not a latency), or None."""
        if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)):
            return "latency_ms must be a number"
        if not (math.isfinite(latency_ms) and 0 <= latency_ms <= MAX_LATENCY_MS):
            return f"latency_ms must be between 0 and {MAX_LATENCY_MS:.0f}"
        if isinstance(command_id, bool) or not isinstance(command_id, (str, int)):
            return "id must be a string or an integer"
        with self._answered_lock:
            if command_id not in self._answered:
                return "no answered command has this id (or it was reported already)"
            del self._answered[command_id]
        self.input_latency.record(float(latency_ms))
        return None

    def deliver(self, envelope: dict[str, Any]) -> None:
        if self.ended.is_set():
            return
        data = envelope.get("data")
        if (
            envelope.get("scope") == "runtime"
            and isinstance(data, dict)
            and data.get("type") == "commandError"
        ):
            self.commands_rejected += 1
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
            "step_ms": round(buffer.step_ms, 2) if buffer.step_ms is not None else None,
            "queue_depth": buffer.depth(),
            "dropped": buffer.dropped,
            "stale_dropped": buffer.stale_dropped,
            "presented": self.clock.presented,
            "new_frames": self.clock.new_frames,
            "commands_rejected": self.commands_rejected,
            "commands_coalesced": self.commands_coalesced,
            "input_to_frame_ms": self.input_latency.summary(),
        }
