"""Input-to-frame latency: which frame answered which command, and how long it took.

Every command a client sends is given a `CommandTicket` when it comes off the data
channel: the client's own id (or one the server makes up) and the arrival time. The
model host notes when it applied the command (a pipeline between yields, a run-loop
model once its handler returned) and puts a `FrameAnswer` on the first frame of the
model's next emit: the first frame made after the change. The answer rides with that
frame through the output buffer and the emission clock to the video track, which
reports it with the frame's timestamp when it hands the frame to the encoder; the
client is told which frame to wait for and reports when it got there
(`LatencyWindow` keeps those reports).

Times are `time.monotonic()`: one clock for the whole machine, so a model process
and the media process can compare them.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "AnswerSink",
    "CommandTicket",
    "FrameAnswer",
    "LatencyWindow",
    "MAX_COMMAND_ID_LENGTH",
    "MAX_LATENCY_MS",
    "percentile",
    "report_answers",
]

log = logging.getLogger(__name__)

MAX_COMMAND_ID_LENGTH = 64
# A report longer than this is not a latency but a clock or client bug: dropped.
MAX_LATENCY_MS = 600_000.0


@dataclass(frozen=True, slots=True)
class CommandTicket:
    """One command on its way to the model."""

    id: str | int  # the client's id, as it sent it, or "s<N>" made by the server
    command: str
    session_id: str
    arrived_at: float  # time.monotonic() when it came off the data channel
    # The client waits for an answer naming `id` (wire v1): the host says
    # `commandAccepted` once the command validates, as it says `commandError` if not.
    reply: bool = False


@dataclass(frozen=True, slots=True)
class FrameAnswer:
    """A command the model applied, riding on the first frame made after it."""

    ticket: CommandTicket
    applied_at: float

    def server_ms(self, emitted_at: float, presented_at: float, encoding_at: float) -> dict[str, float]:
        """Where the server's part of the latency went, in ms: waiting for the model to
        apply the command, the model making the answering frame, the frame queued in
        the output buffer until its slot, and the slot to the encoder taking it."""
        return {
            "to_apply": _ms(self.applied_at - self.ticket.arrived_at),
            "to_emit": _ms(emitted_at - self.applied_at),
            "queued": _ms(presented_at - emitted_at),
            "to_encoder": _ms(encoding_at - presented_at),
            "total": _ms(encoding_at - self.ticket.arrived_at),
        }


class AnswerSink(Protocol):
    """Told when a frame that answers commands goes to the encoder, with its pts
    offset from the track's first frame (`Session.frame_answered`)."""

    def __call__(
        self, answer: FrameAnswer, track: str, frame_offset: int,
        emitted_at: float, presented_at: float, encoding_at: float,
    ) -> None: ...


def report_answers(
    sink: AnswerSink, answers: tuple[FrameAnswer, ...], track: str, frame_offset: int,
    emitted_at: float, presented_at: float, encoding_at: float,
) -> None:
    """Tell `sink` of each command the frame answers; a failing report is logged, and
    the frame is sent all the same."""
    for answer in answers:
        try:
            sink(answer, track, frame_offset, emitted_at, presented_at, encoding_at)
        except Exception:
            log.exception("reporting the frame that answered a command failed")


def _ms(seconds: float) -> float:
    return round(max(0.0, seconds) * 1000.0, 2)


class LatencyWindow:
    """Recent input-to-frame latencies of one session: last, p50, p95, and a count of
    every one recorded (for a metric that reads what came since it last looked)."""

    def __init__(self, size: int = 200) -> None:
        self._recent: collections.deque[float] = collections.deque(maxlen=size)
        self.count = 0

    def record(self, latency_ms: float) -> None:
        self._recent.append(float(latency_ms))
        self.count += 1

    def since(self, count: int) -> list[float]:
        """The latencies recorded after the first `count` (those still kept)."""
        new = self.count - count
        if new <= 0:
            return []
        return list(self._recent)[-min(new, len(self._recent)) :]

    def summary(self) -> dict[str, Any]:
        if not self._recent:
            return {"last": None, "p50": None, "p95": None, "count": self.count}
        ordered = sorted(self._recent)
        return {
            "last": round(self._recent[-1], 1),
            "p50": round(percentile(ordered, 0.50), 1),
            "p95": round(percentile(ordered, 0.95), 1),
            "count": self.count,
        }


def percentile(ordered: list[float], q: float) -> float:
    """The `q` quantile of sorted `ordered`, linear between the closest ranks (as
    numpy's default does): no numpy for the few hundred values a session keeps."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
