"""The recording in progress: its three files, its counts and its limits (encode worker only).

A recording is asked for at any moment, but its video starts at the next keyframe
(`begin`), which the recorder has the encoder force. Its `meta.json` is written when the video starts and again, with the summary, when it
ends, however it ends: a reader of a recording cut short by a crash still finds what
it holds. Once a limit is reached nothing more is written; the recorder stops it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from reactor_serve.sessions.recording.command_log import CommandFile
from reactor_serve.sessions.recording.destinations import Output
from reactor_serve.sessions.recording.encoding import (
    EncodedPacket,
    Mp4Writer,
    RecordingEncoder,
)

__all__ = ["ActiveRecording"]


class ActiveRecording:
    """One recording: `video.mp4`, `commands.jsonl` and `meta.json` in `output.local`."""

    def __init__(
        self,
        output: Output,
        meta: dict[str, Any],
        *,
        max_seconds: float,
        max_bytes: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.output = output
        self.meta = meta
        self.max_seconds = max_seconds
        self.max_bytes = max_bytes
        self._wall_clock = wall_clock
        self.mp4: Mp4Writer | None = None  # opened at the first keyframe
        self.commands: CommandFile | None = None
        self.dropped = 0
        self.stop_reason: str | None = None
        self.stop_message: str | None = None
        # Set once a limit is reached: nothing more is written; the recorder stops it
        # (after settling the verdicts of the commands still waiting, which belong in
        # its log).
        self.limited = False

    @property
    def id(self) -> str:
        return self.output.id

    @property
    def started(self) -> bool:
        """Whether its video has started (at a keyframe)."""
        return self.mp4 is not None

    def begin(self, encoder: RecordingEncoder, keyframe_pts: int,
              tracks: list[dict[str, Any]] | None) -> None:
        """Start the video at the keyframe at `keyframe_pts`, and its command log."""
        self.mp4 = Mp4Writer(self.output.local / "video.mp4", encoder, keyframe_pts)
        self.meta["start_pts"] = keyframe_pts
        self.write_meta(tracks)
        self.commands = CommandFile(self.output.local / "commands.jsonl", keyframe_pts)

    def write(self, packet: EncodedPacket) -> None:
        assert self.mp4 is not None
        self.mp4.write(packet)

    def log_command(self, record: dict[str, Any]) -> None:
        """A settled command: logged once the video has started (those before it are
        handed to `log_command` again by the recorder once it has)."""
        if self.commands is not None:
            self.commands.write(record)

    def limit_reached(self) -> str | None:
        """Which limit the video has reached, in words, or None."""
        mp4 = self.mp4
        if mp4 is None:
            return None
        if mp4.seconds >= self.max_seconds:
            return f"recording.max_seconds ({self.max_seconds:g}) reached"
        if mp4.bytes >= self.max_bytes:
            return f"recording.max_bytes ({self.max_bytes}) reached"
        return None

    def summary(self) -> dict[str, Any]:
        """What recordingStopped says (and meta.json ends with)."""
        mp4 = self.mp4
        summary: dict[str, Any] = {
            "id": self.output.id,
            "url": self.output.location,
            "frames": mp4.frames if mp4 else 0,
            "bytes": mp4.bytes if mp4 else 0,
            # From the first frame's pts to the last one's.
            "seconds": round(mp4.seconds, 3) if mp4 else 0.0,
            "commands": self.commands.count if self.commands else 0,
            "dropped": self.dropped,
            "reason": self.stop_reason,
        }
        if self.stop_message:
            summary["message"] = self.stop_message
        return summary

    def write_meta(self, tracks: list[dict[str, Any]] | None, ended: bool = False) -> None:
        """`tracks`: the tracks as encoded (None: keep those `meta` has)."""
        meta = self.meta
        if tracks is not None:
            meta["tracks"] = tracks
        if ended:
            meta.update(self.summary())
            meta.pop("url", None)
            meta["ended_at"] = round(self._wall_clock(), 3)
            meta["end_reason"] = self.stop_reason
            if self.stop_message:
                meta["end_message"] = self.stop_message
        self.output.write_meta(meta)

    def finalise(self, reason: str, message: str | None,
                 tracks: list[dict[str, Any]] | None) -> None:
        """It ended (`reason`, `message`): close its files, write its summary."""
        self.stop_reason, self.stop_message = reason, message
        if self.mp4 is not None:
            self.mp4.close()
        if self.commands is not None:
            self.commands.close()
        self.write_meta(tracks, ended=True)
