"""Recordings of one session's output, as the client saw it, plus the commands it sent.

`SessionRecordings` belongs to one `PeerSession` of a model that opted in (config
`recording: {enabled: true}`, see recording_settings.py). It watches the session's
`OutputFanout` (`observe`): every presented slot, at its presentation time, repeats
included (a slot that showed the previous picture again is written as a frame with
its own pts, so the file plays back with exactly the client's timing and its frame
count is the number of slots presented while recording).

Encoding never runs on the media loop. The observer hands each slot to one worker
thread through a queue bounded at `queue_frames` slots; when the worker falls behind,
slots are dropped (counted, logged once per recording, noted in meta.json) rather
than stalling the loop or growing memory. The worker encodes once per session, H.264
(libx264, zerolatency, a keyframe forced every `keyframe_interval_s`) for the first
video track and AAC for each audio track, and the packets go to:

- the recording in progress, if any: a fragmented MP4 (`frag_keyframe+empty_moov+
  default_base_moof`, so a file cut short by a crash still plays up to its last
  fragment) that starts at a forced keyframe;
- a ring of the last `clip_seconds` (whole keyframe intervals, bounded in bytes too),
  from which `saveClip` writes its own MP4 without encoding again.

So while a model is opted in (and clips are on), every live session costs one extra
H.264 encode of its output, recording or not, on a thread of its own: with libx264
`ultrafast` (the default) about 3.5 ms of CPU per 640x480 frame and 8 ms per 1280x720
one on this machine (`veryfast`: 9 and 23 ms; benchmarks/recording.py). Set
`clip_seconds: 0` to encode only while a recording runs.

Commands: every command the client sends (while something records) is logged with its
arrival (wall clock, and the presentation clock at that instant, from which its time
in each file follows) and whether it was accepted. The model validates commands in
arrival order and answers only refusals (`commandError`, which names the command's
id), so a command is marked rejected by the commandError naming it, and accepted once a
later command's error came back, or after `ACCEPT_AFTER_S` with none.

Files, per recording, under `<destination>/<model>/<session id>/<n>/` (clips under
`.../clips/<n>/`): `video.mp4`, `commands.jsonl` (one JSON object per command),
`meta.json`. A destination that is an fsspec URL is written to a local staging
directory first and uploaded when the file is complete, on a thread of its own, so a
slow store never stalls encoding.

A recording that fails (encoder, disk, upload) tells the client and stops; the
session goes on. Every recording is finalised when the session ends, however it ends.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import math
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.runtime.field_errors import command_error, describe_value
from reactor_serve.runtime.pacing.emission_clock import (
    AUDIO_CLOCK_RATE,
    VIDEO_CLOCK_RATE,
    PresentedFrame,
)
from reactor_serve.sessions.recording.encoding import (
    EncodedPacket,
    Mp4Writer,
    RecordingEncoder,
)
from reactor_serve.sessions.recording.settings import (
    RecordingSettings,
    RecordingSettingsError,
)

__all__ = [
    "ACCEPT_AFTER_S",
    "RECORDING_REQUESTS",
    "SessionRecordings",
]

log = logging.getLogger(__name__)

# The runtime messages a client sends to drive recordings (PROTOCOL, ours).
RECORDING_REQUESTS = ("startRecording", "stopRecording", "saveClip")
# A command no commandError named within this long was accepted. The model validates a
# command as soon as its loop is free: well under this, unless a forward pass blocks
# its loop for longer (then the record says accepted; a late commandError still marks
# it rejected if the record has not been written yet).
ACCEPT_AFTER_S = 2.0
# How long closing waits for the worker to finalise files and for uploads.
CLOSE_TIMEOUT_S = 20.0
# The clip ring's byte cap, on top of its time span: a picture that compresses badly
# must not make a clip buffer grow without bound.
CLIP_MAX_BYTES = 256 * 1024 * 1024
# Commands kept for clips' logs (and for records waiting for their verdict).
_COMMAND_HISTORY = 10_000

class _Refused(Exception):
    """A recording request that cannot be done; `rule` and `field` name why."""

    def __init__(self, message: str, rule: str, field_: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.field = field_
        self.value = value


# ---- one recording or clip ------------------------------------------------------------


@dataclass
class _Output:
    """Where one recording (or clip) goes: a local directory, uploaded after."""

    id: str
    kind: str  # "recording" | "clip"
    local: Path  # where the files are written
    remote: str | None  # fsspec URL they are uploaded to, or None (local destination)

    @property
    def location(self) -> str:
        return self.remote if self.remote is not None else str(self.local)


@dataclass
class _Recording:
    output: _Output
    started_wall: float
    meta: dict[str, Any]
    mp4: Mp4Writer | None = None  # opened at the first keyframe
    commands: Any = None  # the open commands.jsonl
    command_count: int = 0
    dropped: int = 0
    stop_reason: str | None = None
    stop_message: str | None = None
    # Set once a limit is reached: nothing more is written; the loop stops it (after
    # settling the verdicts of the commands still waiting, which belong in its log).
    limited: bool = False


@dataclass
class _Gop:
    """Packets from one video keyframe up to the next."""

    start_pts: int
    items: list[EncodedPacket] = field(default_factory=list)
    bytes: int = 0


# ---- the session's recordings ---------------------------------------------------------


class SessionRecordings:
    """Recordings and clips of one session. Create and call it on the media loop."""

    def __init__(
        self,
        *,
        model: str,
        session_id: str,
        outputs: tuple[TrackDecl, ...],
        settings: RecordingSettings | None,
        send: Callable[[str, dict[str, Any]], None],
        settings_error: str | None = None,
    ) -> None:
        self.model = model
        self.session_id = session_id
        self.settings = settings
        self._settings_error = settings_error
        self._send = send
        videos = [t for t in outputs if t.kind == "video"]
        self._video = videos[0].name if videos else None
        self._audio = [t for t in outputs if t.kind == "audio"]
        self._outputs = outputs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._queued_frames = 0
        self._queued_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reactor-recording-upload"
        )
        self._unobserve: Callable[[], None] | None = None
        self._closed = False
        # On the loop: whether a recording is running (the worker's view may lag).
        self._recording_id: str | None = None
        self._recordings = 0
        self._clips = 0
        # The latest presented slot, to place a command on the presentation clock.
        self._last_pts = 0
        self._last_slot: float | None = None
        # Commands: waiting for their verdict (in arrival order), and a history for clips.
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._seq = 0
        self.dropped_frames = 0
        # Worker-only state.
        self._encoder: RecordingEncoder | None = None
        self._active: _Recording | None = None
        self._want_keyframe = False
        self._last_keyframe_pts: int | None = None
        self._gops: collections.deque[_Gop] = collections.deque()
        self._gop_bytes = 0
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_COMMAND_HISTORY)
        self._history_lock = threading.Lock()
        self._drop_logged = False
        self._fps: float | None = None

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def for_session(
        cls,
        *,
        model: str,
        session_id: str,
        config: Any,
        outputs: tuple[TrackDecl, ...],
        send: Callable[[str, dict[str, Any]], None],
        override: dict[str, Any] | None = None,
    ) -> SessionRecordings:
        """The recordings of a session of a model whose config is `config` (its
        `recording` section, then `override`'s keys). Bad settings refuse every
        request, naming the field; they never end the session."""
        try:
            section = dict((config or {}).get("recording") or {}) if isinstance(config, dict) else {}
            if override:
                section.update(override)
            settings: RecordingSettings | None = RecordingSettings.from_config(
                {"recording": section}, source=f"model {model}"
            )
            error = None
        except (RecordingSettingsError, TypeError, ValueError) as exc:
            settings, error = None, str(exc)
        return cls(model=model, session_id=session_id, outputs=outputs, settings=settings,
                   send=send, settings_error=error)

    @property
    def enabled(self) -> bool:
        return self.settings is not None and self.settings.enabled and self._video is not None

    @property
    def recording(self) -> str | None:
        """The id of the recording in progress, if any."""
        return self._recording_id

    def attach(self, fanout: Any, record: Any = False) -> None:
        """Watch `fanout` (an OutputFanout); `record`: the session's start option."""
        self._loop = asyncio.get_running_loop()
        if not self.enabled:
            if record is not False and record is not None:
                self._refuse("startRecording", self._not_enabled())
            return
        assert self.settings is not None
        self._worker = threading.Thread(target=self._work, name="reactor-recording", daemon=True)
        self._worker.start()
        self._unobserve = fanout.observe(self._observe)
        if record is not None and record is not False and record is not True:
            self._refuse("startRecording", _Refused(
                f"the start option 'record' must be true or false, got {describe_value(record)}",
                "type", "extra_args.record", describe_value(record)))
        elif record or self.settings.record_by_default:
            self.start()

    # ---- requests (media loop) ---------------------------------------------------------

    def request(self, type_: str, data: dict[str, Any]) -> None:
        """A client's startRecording / stopRecording / saveClip. Never raises: what
        cannot be done is answered with `recordingError` naming the problem."""
        try:
            if not self.enabled:
                raise self._not_enabled()
            if self._closed:
                raise _Refused("the session is ending", "ended")
            if type_ == "startRecording":
                _no_arguments(data, ())
                self.start()
            elif type_ == "stopRecording":
                _no_arguments(data, ())
                if self._recording_id is None:
                    raise _Refused("no recording is running", "not_recording")
                self.stop("requested")
            elif type_ == "saveClip":
                _no_arguments(data, ("seconds",))
                self.save_clip(self._clip_seconds(data))
        except _Refused as exc:
            self._refuse(type_, exc)
        except Exception as exc:  # never out of a data-channel handler
            log.exception("session %s: a %s request failed", self.session_id, type_)
            self._refuse(type_, _Refused(f"failed: {type(exc).__name__}", "internal"))

    def start(self) -> str:
        if self._recording_id is not None:
            raise _Refused(f"recording {self._recording_id} is already running", "already_recording")
        self._recordings += 1
        rid = str(self._recordings)
        self._recording_id = rid
        self._put(("start", rid))
        return rid

    def stop(self, reason: str) -> None:
        if self._recording_id is not None:
            self._recording_id = None
            self._resolve(force=True)
            self._put(("stop", reason, None))

    def save_clip(self, seconds: float) -> str:
        self._clips += 1
        cid = str(self._clips)
        self._resolve(force=True)
        self._put(("clip", cid, seconds))
        return cid

    def _clip_seconds(self, data: dict[str, Any]) -> float:
        assert self.settings is not None
        limit = self.settings.clip_seconds
        if limit <= 0:
            raise _Refused("clips are off for this model (recording.clip_seconds is 0)",
                           "clips_disabled", "seconds")
        if "seconds" not in data:
            return limit
        seconds = data["seconds"]
        # bool is an int; NaN and 1e309 never get here (the protocol drops the frame).
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise _Refused(f"'seconds' must be a number, got {describe_value(seconds)}",
                           "type", "seconds", describe_value(seconds))
        if not math.isfinite(seconds) or seconds <= 0 or seconds > limit:
            raise _Refused(f"'seconds' must be more than 0 and at most {limit:g} "
                           f"(recording.clip_seconds), got {describe_value(seconds)}",
                           "out_of_range", "seconds", describe_value(seconds))
        return float(seconds)

    def _not_enabled(self) -> _Refused:
        if self._settings_error is not None:
            return _Refused(f"recording is unavailable: {self._settings_error}", "bad_settings")
        if self._video is None:
            return _Refused(f"model {self.model} has no video output to record", "no_video")
        return _Refused(f"model {self.model} does not allow recording (its config has no "
                        "'recording: {enabled: true}')", "not_enabled")

    def _refuse(self, type_: str, exc: _Refused) -> None:
        self._send("recordingError", command_error(
            type_, str(exc), [{"field": exc.field, "rule": exc.rule, "value": exc.value}]
        ))

    # ---- commands (media loop) ----------------------------------------------------------

    def command(
        self, name: str, args: Any, error: dict[str, Any] | None = None,
        command_id: str | int | None = None,
    ) -> None:
        """A command the client sent: on its way to the model (`error` None), or
        refused before it (`error`: the commandError's data). `command_id`: its id, which
        a commandError from the model names."""
        if not self.enabled or self._closed:
            return
        self._seq += 1
        now = time.monotonic()
        record: dict[str, Any] = {
            "seq": self._seq,
            "id": command_id,
            "name": name,
            "args": args if error is None else None,
            "wall": round(time.time(), 6),
            "pts": self._pts_at(now),
            "accepted": None if error is None else False,
            "_at": now,
        }
        if error is not None:
            record["error"] = error
        self._pending.append(record)
        self._resolve()

    def command_error(self, data: Any) -> None:
        """A commandError the model sent: it names the oldest waiting command of
        that name, and every command before it was accepted."""
        if not self.enabled or not isinstance(data, dict):
            return
        name = data.get("command")
        waiting = [r for r in self._pending if r["accepted"] is None and r["name"] == name]
        # The error names its command's id (every command has one on its way in).
        match = next((r for r in waiting if r["id"] is not None and r["id"] == data.get("id")), None)
        if match is None:
            # An error without an id: validation depends on the name and arguments
            # only, so it is the oldest waiting command's whose arguments hold the
            # values it names (an earlier identical command had its own error already).
            match = next((r for r in waiting if _holds(r["args"], data.get("errors"))), None)
        if match is None and waiting:
            match = waiting[0]
        for index, record in enumerate(self._pending):
            if record is match:
                record["accepted"] = False
                record["error"] = data
                for earlier in list(self._pending)[:index]:
                    if earlier["accepted"] is None:
                        earlier["accepted"] = True
                break
        self._resolve()

    def _resolve(self, force: bool = False) -> None:
        now = time.monotonic()
        while self._pending:
            head = self._pending[0]
            if head["accepted"] is None:
                if not force and now - head["_at"] < ACCEPT_AFTER_S:
                    return
                head["accepted"] = True
            self._pending.popleft()
            record = {k: v for k, v in head.items() if not k.startswith("_")}
            self._put(("command", record))

    def _pts_at(self, now: float) -> int:
        if self._last_slot is None:
            return 0
        return self._last_pts + round(max(0.0, now - self._last_slot) * VIDEO_CLOCK_RATE)

    # ---- frames (media loop) -------------------------------------------------------------

    def _observe(self, presented: PresentedFrame) -> None:
        self._last_pts, self._last_slot = presented.pts, presented.slot
        if self._pending:
            self._resolve()
        assert self.settings is not None
        if self._recording_id is None and self.settings.clip_seconds <= 0:
            return
        with self._queued_lock:
            if self._queued_frames >= self.settings.queue_frames:
                self.dropped_frames += 1
                drop = True
            else:
                self._queued_frames += 1
                drop = False
        if drop:
            self._put(("dropped",))
            return
        self._put(("frame", presented))

    def _put(self, item: tuple[Any, ...]) -> None:
        if self._worker is not None:
            self._queue.put(item)

    def _tell(self, type_: str, data: dict[str, Any]) -> None:
        """From the worker: a runtime message to the client, sent on the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._send, type_, data)
            except RuntimeError:
                pass

    # ---- end (media loop) ---------------------------------------------------------------

    async def close(self, reason: str) -> None:
        """The session ended (`reason`): finalise what records, wait (bounded) for the
        files and uploads. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._unobserve is not None:
            self._unobserve()
        self._resolve(force=True)
        worker = self._worker
        if worker is None:
            self._uploads.shutdown(wait=False)
            return
        self._recording_id = None
        self._queue.put(("close", f"session ended ({reason})"))
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        await asyncio.to_thread(worker.join, CLOSE_TIMEOUT_S)
        if worker.is_alive():
            log.warning("session %s: the recording worker did not finish within %.0f s",
                        self.session_id, CLOSE_TIMEOUT_S)
        uploads = self._uploads
        await asyncio.to_thread(_shutdown_within, uploads, max(1.0, deadline - time.monotonic()))

    # ---- the worker thread ---------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == "frame":
                    with self._queued_lock:
                        self._queued_frames -= 1
                    self._on_frame(item[1])
                elif kind == "dropped":
                    self._on_dropped()
                elif kind == "command":
                    self._on_command(item[1])
                elif kind == "start":
                    self._on_start(item[1])
                elif kind == "stop":
                    self._on_stop(item[1], item[2])
                elif kind == "clip":
                    self._on_clip(item[1], item[2])
                elif kind == "close":
                    self._on_stop("session_ended", item[1])
                    if self._encoder is not None:
                        self._encoder.close()
                    return
            except Exception as exc:
                log.exception("session %s: recording worker: %s failed", self.session_id, kind)
                self._fail(f"{type(exc).__name__}: {exc}")

    def _on_frame(self, presented: PresentedFrame) -> None:
        assert self.settings is not None and self._video is not None
        image = presented.video.get(self._video)
        if image is None:
            return
        if self._encoder is None and not presented.is_new:
            # The black placeholder shown before the model's first frame (at a default
            # size) is not recorded: files start with the model's own picture and size.
            return
        started = time.thread_time()
        try:
            if self._encoder is None:
                height, width = image.shape[:2]
                self._encoder = RecordingEncoder(self.settings, max(2, width - width % 2),
                                         max(2, height - height % 2), presented.fps, self._audio)
                self._want_keyframe = True
                self._fps = presented.fps
            encoder = self._encoder
            interval = self.settings.keyframe_interval_s * VIDEO_CLOCK_RATE
            keyframe = (
                self._want_keyframe or self._last_keyframe_pts is None
                or presented.pts - self._last_keyframe_pts >= interval
            )
            packets = encoder.video(image, presented.pts, keyframe)
            for index, track in enumerate(self._audio):
                chunk = presented.audio.get(track.name)
                if chunk is not None and chunk.shape[1]:
                    packets += encoder.audio(index, chunk, presented.audio_pts)
        except Exception as exc:
            # The encoder is made again at the next frame; what was recording stops.
            log.exception("session %s: the recording encoder failed", self.session_id)
            if self._encoder is not None:
                self._encoder.close()
            self._encoder = None
            self._fail(f"the encoder failed: {type(exc).__name__}: {exc}")
            return
        finally:
            if self._encoder is not None:
                self._encoder.cpu_s += time.thread_time() - started
        for item in packets:
            if item.stream == 0 and item.keyframe:
                self._want_keyframe = False
                self._last_keyframe_pts = item.pts
            self._keep_for_clips(item)
            self._write(item)

    def _on_dropped(self) -> None:
        active = self._active
        if active is not None:
            active.dropped += 1
            if not self._drop_logged:
                self._drop_logged = True
                log.warning("session %s: recording %s: the encoder falls behind; dropping "
                            "frames (counted in meta.json)", self.session_id, active.output.id)

    def _write(self, item: EncodedPacket) -> None:
        active = self._active
        if active is None or active.limited:
            return
        assert self.settings is not None
        try:
            if active.mp4 is None:
                if item.stream != 0 or not item.keyframe:
                    return  # a recording starts at a (forced) keyframe
                active.mp4 = Mp4Writer(active.output.local / "video.mp4", self._encoder, item.pts)  # type: ignore[arg-type]
                active.meta["start_pts"] = item.pts
                self._write_meta(active)
                self._backfill_commands(active)
                self._tell("recordingStarted", {"id": active.output.id, "url": active.output.location})
            active.mp4.write(item)
        except Exception as exc:
            log.warning("session %s: recording %s failed: %r", self.session_id, active.output.id, exc)
            self._fail(f"writing {active.output.location} failed: {type(exc).__name__}: {exc}")
            return
        mp4 = active.mp4
        if mp4.seconds >= self.settings.max_seconds:
            self._limit(active, f"recording.max_seconds ({self.settings.max_seconds:g}) reached")
        elif mp4.bytes >= self.settings.max_bytes:
            self._limit(active, f"recording.max_bytes ({self.settings.max_bytes}) reached")

    def _limit(self, active: _Recording, message: str) -> None:
        active.limited = True
        loop = self._loop
        rid = active.output.id

        def stop() -> None:
            if self._recording_id != rid:
                return  # already stopped (requested, or the session ended)
            self._recording_id = None
            self._resolve(force=True)
            self._put(("stop", "limit", message))

        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("no loop")
            loop.call_soon_threadsafe(stop)
        except RuntimeError:
            self._on_stop("limit", message)

    def _keep_for_clips(self, item: EncodedPacket) -> None:
        assert self.settings is not None
        span = self.settings.clip_seconds
        if span <= 0:
            return
        if item.stream == 0 and item.keyframe:
            self._gops.append(_Gop(item.pts))
        if not self._gops:
            return
        gop = self._gops[-1]
        gop.items.append(item)
        gop.bytes += len(item.data)
        self._gop_bytes += len(item.data)
        newest = self._gops[-1].items[-1].pts if item.stream == 0 else None
        # Drop the oldest interval once the next one alone still covers the span.
        while len(self._gops) > 1 and (
            (newest is not None and newest - self._gops[1].start_pts >= span * VIDEO_CLOCK_RATE)
            or self._gop_bytes > CLIP_MAX_BYTES
        ):
            self._gop_bytes -= self._gops.popleft().bytes

    def _on_command(self, record: dict[str, Any]) -> None:
        with self._history_lock:
            self._history.append(record)
        active = self._active
        if active is not None and active.mp4 is not None:
            self._log_command(active, record)

    def _backfill_commands(self, active: _Recording) -> None:
        # Commands resolved between the request and the first keyframe.
        since = active.meta["requested_wall"]
        with self._history_lock:
            records = [r for r in self._history if r["wall"] >= since]
        for record in records:
            self._log_command(active, record)

    def _log_command(self, active: _Recording, record: dict[str, Any]) -> None:
        assert active.mp4 is not None
        if active.commands is None:
            active.commands = open(active.output.local / "commands.jsonl", "a", encoding="utf-8")
        line = dict(record)
        line["t"] = round((record["pts"] - active.mp4.base_pts) / VIDEO_CLOCK_RATE, 6)
        active.commands.write(json.dumps(line, separators=(",", ":")) + "\n")
        active.commands.flush()
        active.command_count += 1

    def _on_start(self, rid: str) -> None:
        assert self.settings is not None
        if self._active is not None:
            self._on_stop("replaced", None)
        try:
            output = self._output("recording", rid)
            output.local.mkdir(parents=True, exist_ok=True)
            (output.local / "commands.jsonl").touch()
        except Exception as exc:
            error = command_error(
                "startRecording",
                f"cannot write to {self.settings.destination}: {type(exc).__name__}: {exc}",
                [{"field": "recording.destination", "rule": "write_failed", "value": None}],
            )
            self._tell("recordingError", dict(error, id=rid))
            self._clear_loop_recording(rid)
            return
        self._drop_logged = False
        self._want_keyframe = True
        self._active = _Recording(output, time.time(), self._meta(output, rid))
        self._active.meta["requested_wall"] = round(time.time(), 6)

    def _on_stop(self, reason: str, message: str | None) -> None:
        active, self._active = self._active, None
        if active is None:
            return
        active.stop_reason, active.stop_message = reason, message
        self._clear_loop_recording(active.output.id)
        try:
            self._finalise(active)
        except Exception as exc:
            log.warning("session %s: finalising recording %s failed: %r",
                        self.session_id, active.output.id, exc)
            self._tell("recordingStopped", {"id": active.output.id, "reason": "error",
                                            "message": f"finalising failed: {type(exc).__name__}: {exc}"})
            return
        self._upload(active.output, "recordingStopped", self._summary(active))

    def _finalise(self, active: _Recording) -> None:
        if active.mp4 is not None:
            active.mp4.close()
        if active.commands is not None:
            active.commands.close()
        self._write_meta(active, ended=True)

    def _summary(self, active: _Recording) -> dict[str, Any]:
        mp4 = active.mp4
        summary: dict[str, Any] = {
            "id": active.output.id,
            "url": active.output.location,
            "frames": mp4.frames if mp4 else 0,
            "bytes": mp4.bytes if mp4 else 0,
            # From the first frame's pts to the last one's.
            "seconds": round(mp4.seconds, 3) if mp4 else 0.0,
            "commands": active.command_count,
            "dropped": active.dropped,
            "reason": active.stop_reason,
        }
        if active.stop_message:
            summary["message"] = active.stop_message
        return summary

    def _fail(self, message: str) -> None:
        """A recording failed: stop it, keep what was written, tell the client."""
        active, self._active = self._active, None
        if active is None:
            return
        self._clear_loop_recording(active.output.id)
        active.stop_reason, active.stop_message = "error", message
        try:
            self._finalise(active)
        except Exception:
            pass
        self._tell("recordingStopped", self._summary(active))

    def _clear_loop_recording(self, rid: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def clear() -> None:
            if self._recording_id == rid:
                self._recording_id = None

        try:
            loop.call_soon_threadsafe(clear)
        except RuntimeError:
            pass

    def _on_clip(self, cid: str, seconds: float) -> None:
        if not self._gops or self._encoder is None:
            self._tell("recordingError", command_error("saveClip", "nothing to save yet: no frame was encoded", [
                {"field": None, "rule": "empty", "value": None}]))
            return
        newest = max(item.pts for item in self._gops[-1].items if item.stream == 0)
        start = self._gops[0]
        for gop in self._gops:
            if gop.start_pts <= newest - seconds * VIDEO_CLOCK_RATE:
                start = gop
        items = [item for gop in self._gops if gop.start_pts >= start.start_pts for item in gop.items]
        try:
            output = self._output("clip", cid)
            output.local.mkdir(parents=True, exist_ok=True)
            mp4 = Mp4Writer(output.local / "video.mp4", self._encoder, start.start_pts)
            try:
                for item in items:
                    mp4.write(item)
            finally:
                mp4.close()
            start_wall = time.time() - (newest - start.start_pts) / VIDEO_CLOCK_RATE
            with self._history_lock:
                records = [r for r in self._history if r["pts"] >= start.start_pts]
            with open(output.local / "commands.jsonl", "w", encoding="utf-8") as log_file:
                for record in records:
                    line = dict(record)
                    line["t"] = round((record["pts"] - start.start_pts) / VIDEO_CLOCK_RATE, 6)
                    log_file.write(json.dumps(line, separators=(",", ":")) + "\n")
            meta = self._meta(output, cid)
            meta.update(start_pts=start.start_pts, started_at=round(start_wall, 3), frames=mp4.frames,
                        bytes=mp4.bytes, seconds=round(mp4.seconds, 3), requested_seconds=seconds,
                        commands=len(records), ended_at=round(time.time(), 3), end_reason="clip")
            _write_json(output.local / "meta.json", meta)
        except Exception as exc:
            self._tell("recordingError", command_error("saveClip", f"saving the clip failed: {type(exc).__name__}: {exc}", [
                {"field": None, "rule": "write_failed", "value": None}]))
            return
        self._upload(output, "clipSaved", {
            "id": cid, "url": output.location, "frames": mp4.frames, "bytes": mp4.bytes,
            "seconds": round(mp4.seconds, 3), "commands": len(records),
        })

    # ---- files ---------------------------------------------------------------------------

    def _output(self, kind: str, oid: str) -> _Output:
        assert self.settings is not None
        parts = [_safe(self.model), _safe(self.session_id)] + (["clips"] if kind == "clip" else []) + [oid]
        destination = self.settings.destination
        if "://" in destination and not destination.startswith("file://"):
            staging = Path(tempfile.mkdtemp(prefix="reactor-recording-"))
            return _Output(oid, kind, staging, destination.rstrip("/") + "/" + "/".join(parts))
        if destination.startswith("file://"):
            destination = destination[len("file://"):]
        return _Output(oid, kind, Path(destination).joinpath(*parts).absolute(), None)

    def _meta(self, output: _Output, oid: str) -> dict[str, Any]:
        encoder = self._encoder
        return {
            "kind": output.kind,
            "id": oid,
            "model": self.model,
            "session_id": self.session_id,
            "started_at": round(time.time(), 3),
            "fps": round(self._fps, 3) if self._fps else None,
            "video_track": self._video,
            "tracks": [{"name": t.name, "kind": t.kind,
                        **({"width": encoder.width, "height": encoder.height}
                           if t.name == self._video and encoder is not None else {}),
                        **({"sample_rate": AUDIO_CLOCK_RATE, "channels": 2 if t.channels == 2 else 1}
                           if t.kind == "audio" else {})}
                       for t in self._outputs],
            "recorded_tracks": [self._video] + [t.name for t in self._audio],
            "video": {"codec": "h264", "time_base": f"1/{VIDEO_CLOCK_RATE}"},
            "audio": {"codec": "aac", "time_base": f"1/{AUDIO_CLOCK_RATE}"},
            "repeats": "every presented slot is a frame, repeated pictures included",
        }

    def _write_meta(self, active: _Recording, ended: bool = False) -> None:
        meta = active.meta
        if self._encoder is not None:
            meta["tracks"] = self._meta(active.output, active.output.id)["tracks"]
        if ended:
            meta.update(self._summary(active))
            meta.pop("url", None)
            meta["ended_at"] = round(time.time(), 3)
            meta["end_reason"] = active.stop_reason
            if active.stop_message:
                meta["end_message"] = active.stop_message
        _write_json(active.output.local / "meta.json", meta)

    def _upload(self, output: _Output, message: str, summary: dict[str, Any]) -> None:
        if output.remote is None:
            self._tell(message, summary)
            return

        def upload() -> None:
            try:
                import fsspec

                fs, path = fsspec.core.url_to_fs(output.remote)
                fs.makedirs(path, exist_ok=True)
                for local in sorted(output.local.iterdir()):
                    fs.put_file(str(local), f"{path.rstrip('/')}/{local.name}")
            except Exception as exc:
                log.warning("session %s: uploading %s failed: %r", self.session_id, output.remote, exc)
                failed = dict(summary, reason="error",
                              message=f"uploading to {output.remote} failed: {type(exc).__name__}: {exc}"
                              + f"; the files stay in {output.local}")
                failed["url"] = str(output.local)
                if message == "clipSaved":
                    self._tell("recordingError", command_error(
                        "saveClip", failed["message"], [{"field": None, "rule": "upload_failed", "value": None}]))
                else:
                    self._tell(message, failed)
                return
            shutil.rmtree(output.local, ignore_errors=True)
            self._tell(message, summary)

        try:
            self._uploads.submit(upload)
        except RuntimeError:
            upload()  # shutting down: upload on this thread

    def stats(self) -> dict[str, Any]:
        encoder = self._encoder
        return {
            "recording": self._recording_id,
            "recording_dropped_frames": self.dropped_frames,
            "recording_encode_cpu_ms": round(encoder.cpu_s * 1000.0, 1) if encoder else 0.0,
        }


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


def _no_arguments(data: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise _Refused("the request's data must be an object", "type")
    extra = [key for key in data if key not in allowed]
    if extra:
        raise _Refused(f"unknown field {describe_value(extra[0])}"
                       + (f" (allowed: {', '.join(allowed)})" if allowed else " (it takes none)"),
                       "unknown_field", str(extra[0])[:64])


def _safe(part: str) -> str:
    """A path segment made of a model name or session id (URL-safe already; this
    makes sure of it)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in part)[:128]
    return cleaned.strip(".") or "_"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
    os.replace(tmp, path)


def _shutdown_within(executor: concurrent.futures.ThreadPoolExecutor, timeout: float) -> None:
    done = threading.Event()

    def wait() -> None:
        executor.shutdown(wait=True)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    done.wait(timeout)
