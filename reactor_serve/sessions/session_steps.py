"""The steps of one stepped session, as a wire v1 client asks for them (`request_step`).

A step carries the model's state (each field through its setter), commands, and
input frames. Here they are checked whole (a bad frame refuses the step before
anything applies), the frames written to the input tracks, and the step run by the
session's host (runtime/stepping.py), which answers once the unit's frames are in the
output buffer. Those frames, taken from the buffer while the step runs (a unit may make
more frames than the buffer holds) and after, answer as `step_result`: raw RGB video
and int16 audio per output track, as the official SDK reads them. Each step that ran is
then kept (`StepStore`, when the session has one). Media loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from reactor_serve.interface.tracks import InputFrame, TrackDecl
from reactor_serve.protocol.channel_codec import BadCommand, ProtocolError
from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.protocol.wire_v1 import codec as wire_v1
from reactor_serve.protocol.wire_v1 import platform_pb2, step_pb2
from reactor_serve.runtime.pacing.frames import MAX_FRAME_METADATA_BYTES
from reactor_serve.runtime.pacing.output_buffer import FrameItem
from reactor_serve.runtime.stepping import StepFailure, StepOutcome

__all__ = ["MAX_FRAME_SIDE", "SessionSteps", "StepFrames", "check_steppable"]

log = logging.getLogger(__name__)

# Bounds on one input frame a step carries (the message bound holds the total).
MAX_FRAME_SIDE = 4096
MAX_AUDIO_CHANNELS = 8
# How often the output buffer is emptied while a step runs.
_COLLECT_EVERY_S = 0.005


def check_steppable(spec: Any, generation: str) -> None:
    """Refuse (OfferRejected, at session start) a stepped session of a model whose
    steps could return nothing: one with no output track."""
    if generation == "stepped" and not spec.outputs:
        raise OfferRejected(f'generation: model {spec.name} cannot step: it has no output '
                            "track for a step to return frames on")


class _Refused(Exception):
    """A step request refused whole, before anything it carried applied."""

    def __init__(self, message: str, entry: str | None = None) -> None:
        super().__init__(message)
        self.entry = entry


@dataclass(frozen=True)
class StepFrames:
    """What one step made: per output track, its frames (RGB video, int16 audio)."""

    step: int
    video: dict[str, list[np.ndarray]]
    audio: dict[str, list[np.ndarray]]
    elapsed_s: float
    fps: float
    # Per video track, what the model attached to each of its frames (TrackPayload).
    metadata: dict[str, list[bytes | None]] = field(default_factory=dict)


class SessionSteps:
    """Runs `request_step`s of one stepped session, one at a time.

    `session()` is the runtime session (None until open); `outputs` and `inputs` the
    model's tracks; `output_buffer` where its frames arrive; `send_frame(label, bytes)`
    sends on a channel; `limit()` is the most one message to the client may weigh;
    `resolve(name, args)` turns upload references into files; `kept(frames)` is told
    of every step that produced."""

    def __init__(
        self,
        *,
        session: Callable[[], Any],
        outputs: tuple[TrackDecl, ...],
        inputs: tuple[TrackDecl, ...],
        output_buffer: Any,
        fps: float,
        send_frame: Callable[[str, bytes], None],
        limit: Callable[[], int],
        resolve: Callable[[str, dict[str, Any]], dict[str, Any]],
        kept: Callable[[StepFrames], None] | None = None,
    ) -> None:
        self._session = session
        self._outputs = outputs
        self._inputs = {t.name: t for t in inputs}
        self._buffer = output_buffer
        self._fps = fps
        self._send = send_frame
        self._limit = limit
        self._resolve = resolve
        self._kept = kept
        self._running = False
        self.steps = 0

    def request(self, request_id: str, request: step_pb2.RequestStep) -> None:
        """A `request_step` (on the media loop): answered, whatever happens."""
        if self._running:
            self._answer_failure(request_id, StepOutcome(
                StepFailure.NOT_READY, f"step {self.steps + 1} is still running: ask after its result"))
            return
        self._running = True
        task = asyncio.get_running_loop().create_task(self._run(request_id, request))
        task.add_done_callback(lambda _: setattr(self, "_running", False))

    async def _run(self, request_id: str, request: step_pb2.RequestStep) -> None:
        try:
            session = self._session()
            if session is None or session.stopping:
                raise _Ended("the session is not open")
            try:
                state, commands = wire_v1.step_arguments(request)
                commands = [(name, self._resolve(name, args)) for name, args in commands]
                state = {key: self._resolve(f"set_{key}", {key: value}).get(key, value)
                         for key, value in state.items()}
                frames = self._input_frames(request.media_input)
            except (BadCommand, ProtocolError) as exc:
                raise _Refused(str(exc)) from None
            # Each track's frames land together: a read the model already awaits takes
            # the step's latest frame, not whichever arrived first.
            for track, arrived in frames.items():
                session.push_inputs(track, arrived)
            # Frames no step asked for are not this one's (there are none: nothing streams).
            for _ in self._buffer.drain():
                pass
            collected: list[FrameItem] = []
            collecting = asyncio.get_running_loop().create_task(self._collect(collected))
            started = time.perf_counter()
            try:
                outcome = await session.host.step(session, state, commands)
            finally:
                collecting.cancel()
                await asyncio.gather(collecting, return_exceptions=True)
            collected.extend(self._buffer.drain())
            if outcome.failure is not None:
                self._answer_failure(request_id, outcome)
                return
            self.steps += 1
            made = self._frames(collected, outcome.elapsed_s or time.perf_counter() - started)
            self._answer(request_id, made)
        except _Refused as exc:
            self._answer_failure(request_id, StepOutcome(StepFailure.REFUSED, str(exc), exc.entry))
        except _Ended as exc:
            self._answer_failure(request_id, StepOutcome(StepFailure.SESSION_ENDED, str(exc)))
        except Exception as exc:  # never out of a data-channel task
            log.exception("a step failed")
            self._answer_failure(request_id, StepOutcome(StepFailure.FAILED, f"{type(exc).__name__}: {exc}"))

    async def _collect(self, into: list[FrameItem]) -> None:
        while True:
            into.extend(self._buffer.drain())
            await asyncio.sleep(_COLLECT_EVERY_S)

    # ---- input -------------------------------------------------------------------------

    def _input_frames(self, media: Any) -> dict[str, list[np.ndarray]]:
        """Each input track's frames in the step, oldest first."""
        frames: dict[str, list[np.ndarray]] = {}
        for group in media:
            track = self._inputs.get(group.track)
            if track is None:
                known = ", ".join(self._inputs) or "none"
                raise _Refused(f"media_input: the model has no input track {group.track[:64]!r} "
                               f"(input tracks: {known})", f"media_input.{group.track[:64]}")
            decoder = None
            for index, frame in enumerate(group.frames):
                where = f"media_input.{track.name}[{index}]"
                if frame.encoding == step_pb2.FRAME_ENCODING_H264 and track.kind == "video":
                    if decoder is None:
                        decoder = _H264(where)
                    pictures = decoder.decode(frame.data, where)
                elif frame.encoding == step_pb2.FRAME_ENCODING_RAW:
                    pictures = [_raw(frame, track.kind, where)]
                else:
                    raise _Refused(f"{where}: encoding {frame.encoding} is not one this server "
                                   f"reads for a {track.kind} track (RAW, or H264 for video)", where)
                metadata, captured = _tags(frame, track.kind, where)
                frames.setdefault(track.name, []).extend(
                    InputFrame.tag(p, metadata, captured) for p in pictures)
        return frames

    # ---- output ------------------------------------------------------------------------

    def _frames(self, items: list[FrameItem], elapsed_s: float) -> StepFrames:
        video: dict[str, list[np.ndarray]] = {}
        audio: dict[str, list[np.ndarray]] = {}
        metadata: dict[str, list[bytes | None]] = {}
        for item in items:
            for name, frame in item.video.items():
                video.setdefault(name, []).append(np.ascontiguousarray(frame, dtype=np.uint8))
                metadata.setdefault(name, []).append(item.metadata.get(name))
            for name, chunk in item.audio.items():
                audio.setdefault(name, []).append(np.ascontiguousarray(chunk, dtype=np.int16))
        return StepFrames(self.steps, video, audio, elapsed_s, self._fps, metadata)

    def _answer(self, request_id: str, made: StepFrames) -> None:
        tracks = []
        for track in self._outputs:
            if track.kind == "video":
                frames = made.video.get(track.name, [])
                kind, rate, dtype = platform_pb2.TRACK_KIND_VIDEO, made.fps, "uint8"
            else:
                frames = made.audio.get(track.name, [])
                kind, rate, dtype = platform_pb2.TRACK_KIND_AUDIO, 48_000.0, "int16"
            if not frames:
                continue
            attached = made.metadata.get(track.name, [])
            encoded_frames = []
            for index, f in enumerate(frames):
                frame = step_pb2.Frame(encoding=step_pb2.FRAME_ENCODING_RAW, dtype=dtype,
                                       shape=list(f.shape), data=f.tobytes())
                if index < len(attached) and attached[index] is not None:
                    frame.metadata = attached[index]
                encoded_frames.append(frame)
            tracks.append(step_pb2.TrackFrames(track=track.name, kind=kind, rate=rate,
                                               frames=encoded_frames))
        encoded = wire_v1.step_result(request_id, made.step, tracks, made.elapsed_s)
        if len(encoded) > self._limit():
            self._answer_failure(request_id, StepOutcome(
                StepFailure.RESULT_TOO_LARGE, f"step {made.step} made {len(encoded)} bytes, past the "
                f"{self._limit()} one message may carry to this client"), step=made.step)
        else:
            self._send(wire_v1.DATA, encoded)
        if self._kept is not None:
            try:
                self._kept(made)
            except Exception:
                log.exception("keeping step %d failed", made.step)

    def _answer_failure(self, request_id: str, outcome: StepOutcome, step: int = 0) -> None:
        assert outcome.failure is not None
        self._send(wire_v1.DATA, wire_v1.step_failed(
            request_id, outcome.failure, outcome.message, outcome.entry, step))


class _Ended(Exception):
    pass


def _tags(frame: step_pb2.Frame, kind: str, where: str) -> tuple[bytes | None, int | None]:
    """What the client attached to a step's input frame, checked: the model reads them
    on the frame (`InputFrame`)."""
    metadata = frame.metadata if frame.HasField("metadata") else None
    captured = frame.capture_time_us if frame.HasField("capture_time_us") else None
    if kind != "video" and (metadata or captured is not None):
        raise _Refused(f"{where}: an audio frame carries no metadata", where)
    if metadata is not None and len(metadata) > MAX_FRAME_METADATA_BYTES:
        raise _Refused(f"{where}.metadata: {len(metadata)} bytes, past the "
                       f"{MAX_FRAME_METADATA_BYTES} one frame may carry", f"{where}.metadata")
    if captured is not None and captured < 0:
        raise _Refused(f"{where}.capture_time_us: {captured} is before 1970", f"{where}.capture_time_us")
    return metadata or None, captured


def _raw(frame: step_pb2.Frame, kind: str, where: str) -> np.ndarray:
    shape = tuple(frame.shape)
    if kind == "video":
        if (frame.dtype or "uint8") != "uint8" or len(shape) != 3 or shape[2] != 3 or not (
            0 < shape[0] <= MAX_FRAME_SIDE and 0 < shape[1] <= MAX_FRAME_SIDE
        ):
            raise _Refused(f"{where}: a raw video frame is uint8 (height, width, 3) with sides "
                           f"up to {MAX_FRAME_SIDE}, got {frame.dtype or '?'} {list(shape)}", where)
        dtype = np.uint8
    else:
        if (frame.dtype or "int16") != "int16" or len(shape) != 2 or not (
            0 < shape[0] <= MAX_AUDIO_CHANNELS and 0 < shape[1] <= 48_000 * 10
        ):
            raise _Refused(f"{where}: a raw audio frame is int16 (channels, samples), got "
                           f"{frame.dtype or '?'} {list(shape)}", where)
        dtype = np.int16
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(frame.data) != expected:
        raise _Refused(f"{where}: {len(frame.data)} bytes for shape {list(shape)} "
                       f"(expected {expected})", where)
    return np.frombuffer(frame.data, dtype=dtype).reshape(shape)


class _H264:
    """Decodes a track's H.264 frames of one step, in order, as one stream."""

    def __init__(self, where: str) -> None:
        import av  # only steps that carry encoded frames need it

        self._context = av.CodecContext.create("h264", "r")

    def decode(self, data: bytes, where: str) -> list[np.ndarray]:
        import av

        try:
            pictures = self._context.decode(av.Packet(data))
        except (av.error.FFmpegError, ValueError) as exc:
            raise _Refused(f"{where}: not an H.264 access unit this stream can decode: {exc}",
                           where) from None
        out = []
        for picture in pictures:
            if picture.width > MAX_FRAME_SIDE or picture.height > MAX_FRAME_SIDE:
                raise _Refused(f"{where}: {picture.width}x{picture.height} is past "
                               f"{MAX_FRAME_SIDE} a side", where)
            out.append(picture.to_ndarray(format="rgb24"))
        return out
