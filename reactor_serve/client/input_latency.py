"""The client's side of input-to-frame latency: which frame answered each command.

The client sends each command with an id and notes when. The server says which frame
answered it (`inputFrame`: the frame's offset in 90 kHz ticks from the first frame of
that track, since aiortc gives every sender a random RTP timestamp origin); the
tracker counts its own frames' RTP timestamps from the first one it received on that
track, and the first frame at or past the offset is the answer. Latency is that
frame's arrival minus the command's send time; the tracker hands it to `report`,
which tells the server (`inputLatency`), and keeps it for `records()`.

If a track's first frame never arrived, offsets count from a later one and the match
lands a frame late; a frame the server skipped or the client never decoded makes the
next one the answer. Both err by a frame at most.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from reactor_serve.runtime.input_latency import percentile

__all__ = ["InputLatencyTracker", "LatencyRecord"]

_RTP_MODULUS = 1 << 32
_HALF = 1 << 31
# RTP timestamps come back a tick or two off the server's pts (aiortc rounds between
# time bases on both sides): a frame this close before the target is the target.
# 5 ms, well under the 8.3 ms between frames even at 120 fps.
_SLACK_TICKS = 450


@dataclass(slots=True)
class LatencyRecord:
    """One command and the frame that answered it."""

    id: str | int
    command: str
    sent_at: float  # time.monotonic() when the client sent it
    latency_ms: float | None = None  # send -> the answering frame decoded here
    frame_offset: int | None = None  # 90 kHz ticks after the track's first frame
    track: str | None = None
    # Where the server's part went: to_apply, to_emit, queued, to_encoder, total (ms).
    server_ms: dict[str, float] = field(default_factory=dict)


class InputLatencyTracker:
    """Matches `inputFrame` answers to received frames. Not thread-safe: one loop."""

    KEEP = 512  # commands and frames remembered, at most

    def __init__(
        self,
        report: Callable[[str | int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.clock = clock
        self._sent: collections.OrderedDict[str | int, LatencyRecord] = collections.OrderedDict()
        self._first_rtp: dict[str, int] = {}
        # Per track: (offset, arrived_at) of recent frames, oldest first.
        self._frames: dict[str, collections.deque[tuple[int, float]]] = {}
        # Per track: answers whose frame has not arrived yet.
        self._waiting: dict[str, list[LatencyRecord]] = {}
        self._done: collections.deque[LatencyRecord] = collections.deque(maxlen=self.KEEP)

    def sent(self, command_id: str | int, command: str, at: float | None = None) -> None:
        self._sent[command_id] = LatencyRecord(command_id, command, self.clock() if at is None else at)
        while len(self._sent) > self.KEEP:
            self._sent.popitem(last=False)

    def new_connection(self) -> None:
        """A new peer connection: its senders start new RTP timestamp origins."""
        self._first_rtp.clear()
        self._frames.clear()
        # Answers still waiting point at frames of the old connection's tracks.
        self._waiting.clear()

    def frame(self, track: str, rtp_timestamp: int, arrived_at: float) -> None:
        first = self._first_rtp.setdefault(track, rtp_timestamp)
        offset = (rtp_timestamp - first) % _RTP_MODULUS
        frames = self._frames.setdefault(track, collections.deque(maxlen=self.KEEP))
        frames.append((offset, arrived_at))
        waiting = self._waiting.get(track)
        if waiting:
            still = []
            for record in waiting:
                if _at_or_after(offset, record.frame_offset or 0):
                    self._complete(record, arrived_at)
                else:
                    still.append(record)
            self._waiting[track] = still

    def answer(self, data: Any) -> None:
        """An `inputFrame` message's data from the server."""
        if not isinstance(data, dict):
            return
        record = self._sent.pop(data.get("id"), None) if _hashable(data.get("id")) else None
        offset, track = data.get("frame_offset"), data.get("track")
        if record is None or not isinstance(offset, int) or not isinstance(track, str):
            return
        record.frame_offset, record.track = offset, track
        server = data.get("server_ms")
        if isinstance(server, dict):
            record.server_ms = {
                k: float(v) for k, v in server.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            }
        for frame_offset, arrived_at in self._frames.get(track, ()):
            if _at_or_after(frame_offset, offset):
                self._complete(record, arrived_at)
                return
        self._waiting.setdefault(track, []).append(record)

    def _complete(self, record: LatencyRecord, arrived_at: float) -> None:
        record.latency_ms = round(max(0.0, arrived_at - record.sent_at) * 1000.0, 2)
        self._done.append(record)
        if self.report is not None:
            self.report(record.id, record.latency_ms)

    def records(self) -> list[LatencyRecord]:
        """Commands answered so far (the latest KEEP), oldest first."""
        return list(self._done)

    def summary(self) -> dict[str, Any]:
        """last / p50 / p95 of the answered commands' latency, in ms, and how many."""
        values = sorted(r.latency_ms for r in self._done if r.latency_ms is not None)
        if not values:
            return {"last": None, "p50": None, "p95": None, "count": 0}
        return {
            "last": self._done[-1].latency_ms,
            "p50": round(percentile(values, 0.5), 2),
            "p95": round(percentile(values, 0.95), 2),
            "count": len(values),
        }


def _at_or_after(offset: int, target: int) -> bool:
    # Offsets wrap at 2**32 (13 hours at 90 kHz): compare within half the circle.
    return (offset - target + _SLACK_TICKS) % _RTP_MODULUS < _HALF


def _hashable(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)
