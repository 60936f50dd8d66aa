"""Recordings of one session's output, as the client saw it, plus the commands it sent.

`SessionRecordings` belongs to one `PeerSession` of a model that opted in (config
`recording: {enabled: true}`, see settings.py); the session calls it on the media loop:
the client's requests (startRecording, stopRecording, saveClip), the commands it sent
and the commandErrors that came back, and the end. It watches the session's
`OutputFanout` (`observe`): every presented slot, at its presentation time, repeats
included (a slot that showed the previous picture again is written as a frame with
its own pts, so the file plays back with exactly the client's timing and its frame
count is the number of slots presented while recording).

The work runs on the encode worker (encode_worker.py), never on the media loop: one
encode per session (`OutputEncode`: H.264 for the first video track, AAC for each
audio track), whose packets go to the recording in progress (active_recording.py), a
fragmented MP4 that starts at a forced keyframe, and to the clip ring
(clip_ring.py), from which `saveClip` writes its own MP4 without encoding again. So
while a model is opted in (and clips are on), every live session costs one extra
H.264 encode of its output, recording or not, on a thread of its own (libx264's
preset sets its cost; benchmarks/recording.py measures it). Set `clip_seconds: 0` to
encode only while a recording runs.

Every command the client sends is logged (command_log.py) with its arrival and its
verdict; files go to a local directory or are uploaded to an fsspec URL
(destinations.py). A recording that fails (encoder, disk, upload) tells the client
and stops; the session goes on. Every recording is finalised when the session ends,
however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.protocol.clip_urls import playlist_path
from reactor_serve.runtime.field_errors import command_error, describe_value
from reactor_serve.runtime.pacing.emission_clock import (
    AUDIO_CLOCK_RATE,
    VIDEO_CLOCK_RATE,
    PresentedFrame,
)
from reactor_serve.sessions.recording.active_recording import ActiveRecording
from reactor_serve.sessions.recording.clip_ring import ClipRing
from reactor_serve.sessions.recording.command_log import (
    CommandFile,
    CommandHistory,
    CommandLog,
)
from reactor_serve.sessions.recording.destinations import Destination, Output, Uploads
from reactor_serve.sessions.recording.encode_worker import EncodeWorker
from reactor_serve.sessions.recording.encoding import (
    EncodedPacket,
    Mp4Writer,
    OutputEncode,
)
from reactor_serve.sessions.recording.served_clips import ServedClip, ServedClips
from reactor_serve.sessions.recording.settings import (
    RecordingSettings,
    RecordingSettingsError,
)

__all__ = [
    "CLOSE_TIMEOUT_S",
    "RECORDER_DISABLED",
    "RECORDING_REQUESTS",
    "ClipAnswer",
    "SessionRecordings",
]

log = logging.getLogger(__name__)

# The runtime messages a client sends to drive recordings (docs/protocol.md).
RECORDING_REQUESTS = ("startRecording", "stopRecording", "saveClip")
# How long closing waits for the worker to finalise files and for uploads.
CLOSE_TIMEOUT_S = 20.0
# How a clip refused because there is nothing recording begins: the official SDK
# raises its RecorderDisabledError for a `clip_failed` reason that does.
RECORDER_DISABLED = "recorder disabled"


@dataclass(frozen=True)
class ClipAnswer:
    """The answer to a wire v1 clip request: its markers (session seconds) and where
    to fetch it, or `failed`, the reason there is none."""

    kind: str = "clip"  # "clip" | "recording"
    start_s: float = 0.0
    end_s: float = 0.0
    now_s: float = 0.0
    ready_at_ms: int = 0
    playlist_url: str = ""
    failed: str | None = None


class _Refused(Exception):
    """A recording request that cannot be done; `rule` and `field` name why."""

    def __init__(self, message: str, rule: str, field_: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.field = field_
        self.value = value


class SessionRecordings:
    """Recordings and clips of one session. Create and call it on the media loop; the
    methods named `_on_...` run on its encode worker."""

    def __init__(
        self,
        *,
        model: str,
        session_id: str,
        outputs: tuple[TrackDecl, ...],
        settings: RecordingSettings | None,
        send: Callable[[str, dict[str, Any]], None],
        settings_error: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.model = model
        self.session_id = session_id
        self.settings = settings
        self._settings_error = settings_error
        self._send = send
        self._clock = clock
        self._wall_clock = wall_clock
        videos = [t for t in outputs if t.kind == "video"]
        self._video = videos[0].name if videos else None
        self._audio = [t for t in outputs if t.kind == "audio"]
        self._outputs = outputs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: EncodeWorker[PresentedFrame] | None = None
        self._uploads = Uploads(session_id)
        self._unobserve: Callable[[], None] | None = None
        self._closed = False
        # On the loop: whether a recording is running (the worker's view may lag).
        self._recording_id: str | None = None
        self._recordings = 0
        self._clips = 0
        self._commands = CommandLog(self._settled, clock=clock, wall_clock=wall_clock)
        # Worker-only state, made by `attach` when recording is enabled.
        self._destination: Destination | None = None
        self._encode: OutputEncode | None = None
        self._ring: ClipRing | None = None
        self._history = CommandHistory()
        self._active: ActiveRecording | None = None
        self._drop_logged = False
        # The clips a wire v1 client fetches over HTTP (served_clips.py).
        self.served = ServedClips(session_id)
        # On the loop: the newest presented slot's pts ("now" in a clip's markers).
        self._now_pts: int | None = None
        # Worker-only: the first keyframe ever encoded (where "the whole session" starts).
        self._first_keyframe_pts: int | None = None

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

    @property
    def dropped_frames(self) -> int:
        """Presented slots dropped because the encode worker fell behind."""
        return self._worker.dropped_frames if self._worker is not None else 0

    def attach(self, fanout: Any, record: Any = False) -> None:
        """Watch `fanout` (an OutputFanout); `record`: the session's start option."""
        self._loop = asyncio.get_running_loop()
        if not self.enabled:
            if record is not False and record is not None:
                self._refuse("startRecording", self._not_enabled())
            return
        assert self.settings is not None and self._video is not None
        self._destination = Destination(self.settings.destination, self.model, self.session_id)
        self._encode = OutputEncode(self.settings, self._video, self._audio)
        self._ring = ClipRing(self.settings.clip_seconds)
        self._worker = EncodeWorker(
            queue_frames=self.settings.queue_frames, on_frame=self._on_frame,
            on_dropped=self._on_dropped, on_failure=self._on_failure,
        )
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
        self._put("start", partial(self._on_start, rid))
        return rid

    def stop(self, reason: str, message: str | None = None) -> None:
        if self._recording_id is not None:
            self._recording_id = None
            # The commands still waiting belong in its log: they are taken as accepted.
            self._commands.settle(force=True)
            self._put("stop", partial(self._on_stop, reason, message))

    def save_clip(self, seconds: float) -> str:
        self._clips += 1
        cid = str(self._clips)
        self._commands.settle(force=True)
        self._put("clip", partial(self._on_clip, cid, seconds))
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
        self._commands.add(name, args, error, command_id)

    def command_error(self, data: Any) -> None:
        """A commandError the model sent: it settles the command it names."""
        if not self.enabled:
            return
        self._commands.command_error(data)

    def _settled(self, record: dict[str, Any]) -> None:
        self._put("command", partial(self._on_command, record))

    # ---- frames (media loop) -------------------------------------------------------------

    def _observe(self, presented: PresentedFrame) -> None:
        self._now_pts = presented.pts
        self._commands.presented(presented.pts, presented.slot)
        assert self.settings is not None and self._worker is not None
        if self._recording_id is None and self.settings.clip_seconds <= 0:
            return
        self._worker.offer(presented)

    def _put(self, kind: str, task: Callable[[], None]) -> None:
        if self._worker is not None:
            self._worker.submit(kind, task)

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
        self._commands.settle(force=True)
        worker = self._worker
        if worker is None:
            self._uploads.shutdown_now()
            self.served.close()
            return
        self._recording_id = None
        worker.finish(partial(self._on_close, f"session ended ({reason})"))
        deadline = self._clock() + CLOSE_TIMEOUT_S
        if not await asyncio.to_thread(worker.join, CLOSE_TIMEOUT_S):
            log.warning("session %s: the recording worker did not finish within %.0f s",
                        self.session_id, CLOSE_TIMEOUT_S)
        await asyncio.to_thread(self._uploads.shutdown_within, max(1.0, deadline - self._clock()))
        self.served.close()

    def stats(self) -> dict[str, Any]:
        encoder = self._encode.encoder if self._encode is not None else None
        return {
            "recording": self._recording_id,
            "recording_dropped_frames": self.dropped_frames,
            "recording_encode_cpu_ms": round(encoder.cpu_s * 1000.0, 1) if encoder else 0.0,
        }

    # ---- the encode worker ---------------------------------------------------------------

    def _on_failure(self, kind: str, exc: Exception) -> None:
        log.exception("session %s: recording worker: %s failed", self.session_id, kind)
        self._fail(f"{type(exc).__name__}: {exc}")

    def _on_frame(self, presented: PresentedFrame) -> None:
        assert self._encode is not None and self._ring is not None
        try:
            packets = self._encode.encode(presented)
        except Exception as exc:
            # The encoder is made again at the next frame; what was recording stops.
            log.exception("session %s: the recording encoder failed", self.session_id)
            self._fail(f"the encoder failed: {type(exc).__name__}: {exc}")
            return
        for packet in packets:
            if packet.stream == 0 and packet.keyframe and self._first_keyframe_pts is None:
                self._first_keyframe_pts = packet.pts
            self._ring.add(packet)
            self._write(packet)

    def _on_dropped(self) -> None:
        active = self._active
        if active is not None:
            active.dropped += 1
            if not self._drop_logged:
                self._drop_logged = True
                log.warning("session %s: recording %s: the encoder falls behind; dropping "
                            "frames (counted in meta.json)", self.session_id, active.id)

    def _on_command(self, record: dict[str, Any]) -> None:
        self._history.add(record)
        if self._active is not None:
            self._active.log_command(record)

    def _write(self, packet: EncodedPacket) -> None:
        active = self._active
        if active is None or active.limited:
            return
        assert self._encode is not None and self._encode.encoder is not None
        try:
            if not active.started:
                if packet.stream != 0 or not packet.keyframe:
                    return  # a recording starts at a (forced) keyframe
                active.begin(self._encode.encoder, packet.pts, self._encoded_tracks())
                # Commands settled between the request and this keyframe.
                for record in self._history.since_wall(active.meta["requested_wall"]):
                    active.log_command(record)
                self._tell("recordingStarted", {"id": active.id, "url": active.output.location})
            active.write(packet)
        except Exception as exc:
            log.warning("session %s: recording %s failed: %r", self.session_id, active.id, exc)
            self._fail(f"writing {active.output.location} failed: {type(exc).__name__}: {exc}")
            return
        limit = active.limit_reached()
        if limit is not None:
            self._limit(active, limit)

    def _limit(self, active: ActiveRecording, message: str) -> None:
        active.limited = True
        loop = self._loop
        rid = active.id

        def stop() -> None:
            if self._recording_id == rid:  # else already stopped (requested, or the session ended)
                self.stop("limit", message)

        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("no loop")
            loop.call_soon_threadsafe(stop)
        except RuntimeError:
            self._on_stop("limit", message)

    def _on_start(self, rid: str) -> None:
        assert self.settings is not None and self._destination is not None and self._encode is not None
        if self._active is not None:
            self._on_stop("replaced", None)
        try:
            output = self._destination.output("recording", rid)
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
        self._encode.want_keyframe()
        self._active = ActiveRecording(
            output, self._meta(output, rid), max_seconds=self.settings.max_seconds,
            max_bytes=self.settings.max_bytes, wall_clock=self._wall_clock,
        )
        self._active.meta["requested_wall"] = round(self._wall_clock(), 6)

    def _on_stop(self, reason: str, message: str | None) -> None:
        active, self._active = self._active, None
        if active is None:
            return
        self._clear_loop_recording(active.id)
        try:
            active.finalise(reason, message, self._encoded_tracks())
        except Exception as exc:
            log.warning("session %s: finalising recording %s failed: %r",
                        self.session_id, active.id, exc)
            self._tell("recordingStopped", {"id": active.id, "reason": "error",
                                            "message": f"finalising failed: {type(exc).__name__}: {exc}"})
            return
        summary = active.summary()

        def failed(text: str) -> None:
            self._tell("recordingStopped", dict(summary, reason="error", message=text,
                                                url=str(active.output.local)))

        self._uploads.deliver(active.output, partial(self._tell, "recordingStopped", summary), failed)

    def _fail(self, message: str) -> None:
        """A recording failed: stop it, keep what was written, tell the client."""
        active, self._active = self._active, None
        if active is None:
            return
        self._clear_loop_recording(active.id)
        try:
            active.finalise("error", message, self._encoded_tracks())
        except Exception:
            pass
        self._tell("recordingStopped", active.summary())

    def _on_close(self, message: str) -> None:
        self._on_stop("session_ended", message)
        if self._encode is not None:
            self._encode.close()

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
        try:
            output, mp4, commands = self._write_clip(cid, seconds)
        except _Refused as exc:
            self._tell("recordingError", command_error("saveClip", str(exc), [
                {"field": None, "rule": exc.rule, "value": None}]))
            return

        def failed(text: str) -> None:
            self._tell("recordingError", command_error(
                "saveClip", text, [{"field": None, "rule": "upload_failed", "value": None}]))

        self._uploads.deliver(output, partial(self._tell, "clipSaved", {
            "id": cid, "url": output.location, "frames": mp4.frames, "bytes": mp4.bytes,
            "seconds": round(mp4.seconds, 3), "commands": commands,
        }), failed)

    def _write_clip(self, cid: str, seconds: float) -> tuple[Output, Mp4Writer, int]:
        """Write clip `cid`, the last `seconds` of the ring, with its commands and
        meta.json; raises _Refused naming why it could not."""
        assert self._ring is not None and self._encode is not None and self._destination is not None
        clip = self._ring.cut(seconds)
        encoder = self._encode.encoder
        if clip is None or encoder is None:
            raise _Refused("nothing to save yet: no frame was encoded", "empty")
        try:
            output = self._destination.output("clip", cid)
            output.local.mkdir(parents=True, exist_ok=True)
            mp4 = Mp4Writer(output.local / "video.mp4", encoder, clip.start_pts)
            try:
                for packet in clip.packets:
                    mp4.write(packet)
            finally:
                mp4.close()
            start_wall = self._wall_clock() - (clip.newest_pts - clip.start_pts) / VIDEO_CLOCK_RATE
            records = self._history.since_pts(clip.start_pts)
            commands = CommandFile(output.local / "commands.jsonl", clip.start_pts)
            try:
                for record in records:
                    commands.write(record)
            finally:
                commands.close()
            meta = self._meta(output, cid)
            meta.update(start_pts=clip.start_pts, started_at=round(start_wall, 3), frames=mp4.frames,
                        bytes=mp4.bytes, seconds=round(mp4.seconds, 3), requested_seconds=seconds,
                        commands=len(records), ended_at=round(self._wall_clock(), 3), end_reason="clip")
            output.write_meta(meta)
        except Exception as exc:
            raise _Refused(f"saving the clip failed: {type(exc).__name__}: {exc}", "write_failed") from exc
        return output, mp4, len(records)

    # ---- wire v1 clips ------------------------------------------------------------------

    def request_clip(self, seconds: float | None, answer: Callable[[ClipAnswer], None]) -> None:
        """A wire v1 client's `request_clip` (the last `seconds`) or `request_recording`
        (None: the whole session so far). `answer` is called once, on the loop: the
        clip's markers and playlist, or why there is none. Never raises."""
        try:
            if not self.enabled:
                raise self._not_enabled()
            if self._closed:
                raise _Refused("the session is ending", "ended")
            assert self.settings is not None
            if seconds is not None:
                if not math.isfinite(seconds) or seconds <= 0:
                    raise _Refused(f"duration_seconds must be a number above 0, got {seconds!r}",
                                   "out_of_range")
                if self.settings.clip_seconds <= 0:
                    raise _Refused(f"{RECORDER_DISABLED}: clips are off for this model "
                                   "(recording.clip_seconds is 0)", "clips_disabled")
                # More than the ring holds is what it holds: the markers say what it is.
                seconds = min(seconds, self.settings.clip_seconds)
            self._clips += 1
            cid = f"{'c' if seconds is not None else 'r'}{self._clips}"
            self._commands.settle(force=True)
            self._put("clip", partial(self._on_served_clip, cid, seconds, self._now_pts, answer))
        except _Refused as exc:
            reason = str(exc)
            if exc.rule in ("not_enabled", "no_video", "bad_settings"):
                reason = f"{RECORDER_DISABLED}: {reason}"
            answer(ClipAnswer(failed=reason))

    def _on_served_clip(
        self, cid: str, seconds: float | None, now_pts: int | None,
        answer: Callable[[ClipAnswer], None],
    ) -> None:
        assert self.settings is not None
        now_s = (now_pts or 0) / VIDEO_CLOCK_RATE
        active = self._active
        try:
            if seconds is None and active is not None and active.mp4 is not None:
                # The recording in progress: the playlist grows with it, and is ready
                # once the fragment holding "now" is written.
                mp4 = active.mp4
                served = ServedClip(
                    cid, mp4.path, mp4.base_pts / VIDEO_CLOCK_RATE, mp4.base_pts / VIDEO_CLOCK_RATE,
                    max(now_s, mp4.base_pts / VIDEO_CLOCK_RATE),
                    written_s=mp4.written_s, retry_after_s=self.settings.keyframe_interval_s,
                    staging=active.output.local if active.output.remote is not None else None,
                )
                ready_at = self._wall_clock() + self.settings.keyframe_interval_s
                kind = "recording"
            else:
                if seconds is None:
                    held = self._ring.start_pts if self._ring is not None else None
                    if held is None or held != self._first_keyframe_pts:
                        raise _Refused(
                            f"{RECORDER_DISABLED}: no recording of the whole session is running, "
                            f"and only its last {self.settings.clip_seconds:g} s are kept (set "
                            "recording.record_by_default: true, or start the session with "
                            "extra_args.record: true)", "not_recording")
                    seconds = math.inf
                    kind = "recording"
                else:
                    kind = "clip"
                output, mp4, _ = self._write_clip(cid, seconds)
                served = ServedClip(
                    cid, mp4.path, mp4.base_pts / VIDEO_CLOCK_RATE, mp4.base_pts / VIDEO_CLOCK_RATE,
                    mp4.last_pts / VIDEO_CLOCK_RATE, written_s=mp4.written_s,
                    staging=output.local if output.remote is not None else None,
                )
                ready_at = self._wall_clock()
                # A URL destination gets its copy too; the served one stays until the end.
                self._uploads.deliver(output, lambda: None, lambda text: log.warning(
                    "session %s: clip %s: %s", self.session_id, cid, text), keep_local=True)
        except _Refused as exc:
            self._answer(answer, ClipAnswer(failed=str(exc)))
            return
        self.served.add(served)
        self._answer(answer, ClipAnswer(
            kind=kind, start_s=served.start_s, end_s=served.end_s, now_s=max(now_s, served.end_s),
            ready_at_ms=round(ready_at * 1000),
            playlist_url=playlist_path(self.session_id, served.start_s, served.end_s),
        ))

    def _answer(self, answer: Callable[[ClipAnswer], None], value: ClipAnswer) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(answer, value)
            except RuntimeError:
                pass

    # ---- meta.json -----------------------------------------------------------------------

    def _tracks(self) -> list[dict[str, Any]]:
        """The output's tracks, with the video's size once the encoder is made."""
        encoder = self._encode.encoder if self._encode is not None else None
        return [{"name": t.name, "kind": t.kind,
                 **({"width": encoder.width, "height": encoder.height}
                    if t.name == self._video and encoder is not None else {}),
                 **({"sample_rate": AUDIO_CLOCK_RATE, "channels": 2 if t.channels == 2 else 1}
                    if t.kind == "audio" else {})}
                for t in self._outputs]

    def _encoded_tracks(self) -> list[dict[str, Any]] | None:
        """The tracks for a recording's meta.json; None while there is no encoder (it
        keeps the tracks it has)."""
        if self._encode is None or self._encode.encoder is None:
            return None
        return self._tracks()

    def _meta(self, output: Output, oid: str) -> dict[str, Any]:
        fps = self._encode.fps if self._encode is not None else None
        return {
            "kind": output.kind,
            "id": oid,
            "model": self.model,
            "session_id": self.session_id,
            "started_at": round(self._wall_clock(), 3),
            "fps": round(fps, 3) if fps else None,
            "video_track": self._video,
            "tracks": self._tracks(),
            "recorded_tracks": [self._video] + [t.name for t in self._audio],
            "video": {"codec": "h264", "time_base": f"1/{VIDEO_CLOCK_RATE}"},
            "audio": {"codec": "aac", "time_base": f"1/{AUDIO_CLOCK_RATE}"},
            "repeats": "every presented slot is a frame, repeated pictures included",
        }


def _no_arguments(data: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise _Refused("the request's data must be an object", "type")
    extra = [key for key in data if key not in allowed]
    if extra:
        raise _Refused(f"unknown field {describe_value(extra[0])}"
                       + (f" (allowed: {', '.join(allowed)})" if allowed else " (it takes none)"),
                       "unknown_field", str(extra[0])[:64])
