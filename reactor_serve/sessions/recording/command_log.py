"""The command log of a session's recordings: every command the client sent, and its verdict.

The model validates commands in arrival order and answers only refusals (`commandError`,
which names the command's id), so a command's verdict is known only later: it is
rejected by the commandError naming it, and accepted once a later command's error came
back, or after `ACCEPT_AFTER_S` with none. `CommandLog` holds the commands waiting for
their verdict, on the media loop, and hands each one on, settled and in arrival order.

On the encode worker, `CommandHistory` keeps the settled records (a clip's log is cut
from it, and a recording logs the commands that settled between its request and its
first keyframe), and `CommandFile` writes them to a recording's or a clip's
`commands.jsonl`, each timed from that file's first frame.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reactor_serve.runtime.pacing.emission_clock import VIDEO_CLOCK_RATE

__all__ = ["ACCEPT_AFTER_S", "COMMAND_HISTORY", "CommandFile", "CommandHistory", "CommandLog"]

# A command no commandError named within this long was accepted. The model validates a
# command as soon as its loop is free: well under this, unless a forward pass blocks
# its loop for longer (then the record says accepted; a late commandError still marks
# it rejected if the record has not been written yet).
ACCEPT_AFTER_S = 2.0
# Settled commands kept for clips' logs (and for a recording waiting for its keyframe).
COMMAND_HISTORY = 10_000


@dataclass
class _Waiting:
    record: dict[str, Any]
    arrived: float  # on the log's monotonic clock


class CommandLog:
    """Commands waiting for their verdict, in arrival order (media loop only).

    `settled` receives each record once its verdict is known, in arrival order:
    `{"seq", "id", "name", "args", "wall", "pts", "accepted"[, "error"]}`, where `pts`
    places the command on the presentation clock (90 kHz) from the latest presented
    slot, so its time in any file cut from the output follows from it."""

    def __init__(
        self,
        settled: Callable[[dict[str, Any]], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settled = settled
        self._clock = clock
        self._wall_clock = wall_clock
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._seq = 0
        # The latest presented slot: its pts and its time on `clock`.
        self._last_pts = 0
        self._last_slot: float | None = None

    @property
    def waiting(self) -> int:
        """How many commands wait for their verdict."""
        return len(self._waiting)

    def presented(self, pts: int, slot: float) -> None:
        """A slot was presented at `slot` (on `clock`) with `pts`; settles what timed out."""
        self._last_pts, self._last_slot = pts, slot
        if self._waiting:
            self.settle()

    def add(
        self, name: str, args: Any, error: dict[str, Any] | None = None,
        command_id: str | int | None = None,
    ) -> None:
        """A command the client sent: on its way to the model (`error` None), or
        refused before it (`error`: the commandError's data)."""
        self._seq += 1
        now = self._clock()
        record: dict[str, Any] = {
            "seq": self._seq,
            "id": command_id,
            "name": name,
            "args": args if error is None else None,
            "wall": round(self._wall_clock(), 6),
            "pts": self._pts_at(now),
            "accepted": None if error is None else False,
        }
        if error is not None:
            record["error"] = error
        self._waiting.append(_Waiting(record, now))
        self.settle()

    def command_error(self, data: Any) -> None:
        """A commandError the model sent: it names one waiting command of that name,
        and every command that arrived before it was accepted."""
        if not isinstance(data, dict):
            return
        name = data.get("command")
        waiting = [w.record for w in self._waiting
                   if w.record["accepted"] is None and w.record["name"] == name]
        # The error names its command's id (every command has one on its way in).
        match = next((r for r in waiting if r["id"] is not None and r["id"] == data.get("id")), None)
        if match is None:
            # An error without an id: validation depends on the name and arguments
            # only, so it is the oldest waiting command's whose arguments hold the
            # values it names (an earlier identical command had its own error already).
            match = next((r for r in waiting if _holds(r["args"], data.get("errors"))), None)
        if match is None and waiting:
            match = waiting[0]
        for index, entry in enumerate(self._waiting):
            if entry.record is match:
                entry.record["accepted"] = False
                entry.record["error"] = data
                for earlier in list(self._waiting)[:index]:
                    if earlier.record["accepted"] is None:
                        earlier.record["accepted"] = True
                break
        self.settle()

    def settle(self, force: bool = False) -> None:
        """Hand on the commands at the head whose verdict is known; `force`: take
        every command still waiting as accepted (a file is about to be cut)."""
        now = self._clock()
        while self._waiting:
            head = self._waiting[0]
            if head.record["accepted"] is None:
                if not force and now - head.arrived < ACCEPT_AFTER_S:
                    return
                head.record["accepted"] = True
            self._waiting.popleft()
            self._settled(head.record)

    def _pts_at(self, now: float) -> int:
        if self._last_slot is None:
            return 0
        return self._last_pts + round(max(0.0, now - self._last_slot) * VIDEO_CLOCK_RATE)


def _holds(args: Any, errors: Any) -> bool:
    """Whether a command's `args` hold the values a commandError's `errors` name."""
    if not isinstance(errors, list):
        return True
    for error in errors:
        if not isinstance(error, dict) or not error.get("field"):
            continue
        if not isinstance(args, dict) or str(error["field"]) not in args:
            return False
        if args[str(error["field"])] != error.get("value"):
            return False
    return True


class CommandHistory:
    """The latest settled commands, oldest first (encode worker only)."""

    def __init__(self, size: int = COMMAND_HISTORY) -> None:
        self._records: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def add(self, record: dict[str, Any]) -> None:
        self._records.append(record)

    def since_wall(self, wall: float) -> list[dict[str, Any]]:
        """The commands that arrived at `wall` (wall clock) or later."""
        return [r for r in self._records if r["wall"] >= wall]

    def since_pts(self, pts: int) -> list[dict[str, Any]]:
        """The commands placed at presentation time `pts` or later."""
        return [r for r in self._records if r["pts"] >= pts]


class CommandFile:
    """One `commands.jsonl`: a JSON object per command, its `t` the seconds from the
    file's first frame (`base_pts`, 90 kHz). Each line is flushed as it is written, so
    a recording cut short keeps its log."""

    def __init__(self, path: Path, base_pts: int) -> None:
        self.path = path
        self.base_pts = base_pts
        self.count = 0
        self._file = open(path, "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        line = dict(record)
        line["t"] = round((record["pts"] - self.base_pts) / VIDEO_CLOCK_RATE, 6)
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        self._file.close()
