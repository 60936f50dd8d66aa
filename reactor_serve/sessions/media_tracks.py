"""Media tracks of one session: paced output senders and input receivers.

`OutputFanout` runs the session's `EmissionClock` on the media loop and hands each
presented slot to the output tracks: every video track sends the slot's frame with
the slot's pts (90 kHz), every audio track queues the slot's samples and sends 20 ms
Opus frames on the same clock. Tracks belong to one peer connection; a reconnect
makes new ones on the same fanout, so the model's output is never interrupted.
While a session is orphaned the fanout is paused: nothing is presented, so the
bounded output buffer fills and the model's `emit` waits (backpressure); `resume`
drops what queued up meanwhile and presents fresh frames.
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import logging
import time
from typing import Any, Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.runtime.input_latency import AnswerSink, FrameAnswer, report_answers
from reactor_serve.runtime.pacing.emission_clock import (
    AUDIO_CLOCK_RATE,
    VIDEO_CLOCK_RATE,
    EmissionClock,
    PresentedFrame,
)
from reactor_serve.runtime.session import Session
from reactor_serve.sessions.stamped_video import StampedVideoTrack

__all__ = ["OutputFanout", "PacedAudioTrack", "PacedVideoTrack", "receive_input"]

log = logging.getLogger(__name__)

VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_RATE)
AUDIO_TIME_BASE = fractions.Fraction(1, AUDIO_CLOCK_RATE)
AUDIO_FRAME_SAMPLES = AUDIO_CLOCK_RATE // 50  # 20 ms, Opus's usual frame


class PacedVideoTrack(MediaStreamTrack):
    """Sends one output video track: the latest presented frame, stamped with its slot.

    A frame that answers commands (runtime/input_latency.py) is reported to
    `on_answer` when the encoder takes it, with its pts counted from the first frame
    this track sent: aiortc adds a random origin to RTP timestamps, so that offset is
    what a client can match against its own frames."""

    kind = "video"

    def __init__(self, name: str, on_answer: AnswerSink | None = None) -> None:
        super().__init__()
        self.name = name
        self.on_answer = on_answer
        self._latest: tuple[np.ndarray, int] | None = None
        # (answers, emitted_at, presented_at) of the frame waiting for the encoder.
        self._answers: tuple[tuple[FrameAnswer, ...], float, float] | None = None
        self._first_pts: int | None = None
        self._fresh = asyncio.Event()
        # Frames presented while the encoder was still busy with an earlier one.
        self.superseded = 0
        # The client paused this track (`pause_track`): frames are not sent until
        # `resume_track`; the encoder then takes the next one presented.
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def offer(
        self, image: np.ndarray, pts: int, presented: PresentedFrame | None = None
    ) -> None:
        if self.paused:
            return
        if self._fresh.is_set():
            self.superseded += 1
        self._latest = (image, pts)
        if presented is not None and presented.answers:
            # A superseded frame's answers pass to this one, which is shown instead.
            earlier = self._answers[0] if self._answers is not None else ()
            self._answers = (
                (*earlier, *presented.answers),
                presented.emitted_at if presented.emitted_at is not None else presented.slot,
                presented.slot,
            )
        self._fresh.set()

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._fresh.wait()
        self._fresh.clear()
        if self.readyState != "live" or self._latest is None:
            raise MediaStreamError
        image, pts = self._latest
        frame = VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = pts
        frame.time_base = VIDEO_TIME_BASE
        if self._first_pts is None:
            self._first_pts = pts
        answers, self._answers = self._answers, None
        if answers is not None and self.on_answer is not None:
            report_answers(self.on_answer, answers[0], self.name, pts - self._first_pts,
                           answers[1], answers[2], time.monotonic())
        return frame

    def stop(self) -> None:
        super().stop()
        self._fresh.set()  # wake a pending recv() so it can raise


class PacedAudioTrack(MediaStreamTrack):
    """Sends one output audio track as 20 ms frames at 48 kHz, on the session's clock.

    The model's audio arrives in slot-sized chunks; it is queued and cut into the
    fixed frames Opus wants. Gaps become silence; a queue longer than `MAX_QUEUE_S`
    (the model producing faster than real time) loses its oldest samples rather than
    drifting out of sync with the video.
    """

    kind = "audio"
    MAX_QUEUE_S = 0.25

    def __init__(self, name: str, channels: int = 1) -> None:
        super().__init__()
        self.name = name
        self.channels = 2 if channels == 2 else 1
        self._queue: collections.deque[np.ndarray] = collections.deque()
        self._queued = 0
        self._start: float | None = None
        self._pts = 0
        self.dropped_samples = 0
        # Cleared while the client has the track paused (`pause_track`): nothing is
        # sent, not even silence, and the audio made meanwhile is dropped.
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def paused(self) -> bool:
        return not self._flowing.is_set()

    def pause(self) -> None:
        self._flowing.clear()
        self._queue.clear()
        self._queued = 0

    def resume(self) -> None:
        self._flowing.set()

    def offer(self, chunk: np.ndarray) -> None:
        if self.paused:
            return
        if chunk.shape[0] != self.channels:
            chunk = (
                np.repeat(chunk, 2, axis=0)
                if self.channels == 2
                else chunk.mean(axis=0, keepdims=True).astype(np.int16)
            )
        self._queue.append(chunk)
        self._queued += chunk.shape[1]
        limit = int(self.MAX_QUEUE_S * AUDIO_CLOCK_RATE)
        while self._queued > limit and len(self._queue) > 1:
            old = self._queue.popleft()
            self._queued -= old.shape[1]
            self.dropped_samples += old.shape[1]

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.paused:
            await self._flowing.wait()
            if self.readyState != "live":
                raise MediaStreamError
            # Paced afresh from now: the pause is no debt to catch up on.
            self._start = time.monotonic() - self._pts / AUDIO_CLOCK_RATE
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            wait = self._start + self._pts / AUDIO_CLOCK_RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
        samples = self._take(AUDIO_FRAME_SAMPLES)
        frame = AudioFrame.from_ndarray(
            samples.T.reshape(1, -1).copy(),  # packed s16: interleaved channels
            format="s16",
            layout="stereo" if self.channels == 2 else "mono",
        )
        frame.sample_rate = AUDIO_CLOCK_RATE
        frame.pts = self._pts
        frame.time_base = AUDIO_TIME_BASE
        self._pts += AUDIO_FRAME_SAMPLES
        return frame

    def stop(self) -> None:
        super().stop()
        self._flowing.set()  # wake a paused recv() so it can raise

    def _take(self, count: int) -> np.ndarray:
        out = np.zeros((self.channels, count), dtype=np.int16)
        filled = 0
        while filled < count and self._queue:
            chunk = self._queue[0]
            n = min(count - filled, chunk.shape[1])
            out[:, filled : filled + n] = chunk[:, :n]
            filled += n
            if n == chunk.shape[1]:
                self._queue.popleft()
            else:
                self._queue[0] = chunk[:, n:]
            self._queued -= n
        return out


class OutputFanout:
    """Drives one session's emission clock and feeds the output tracks subscribed to it."""

    def __init__(
        self,
        clock: EmissionClock,
        outputs: tuple[TrackDecl, ...],
        on_error: Callable[[BaseException], None] | None = None,
        on_answer: AnswerSink | None = None,
    ) -> None:
        self.clock = clock
        self.outputs = {t.name: t for t in outputs}
        # Which frame answered which command is reported on the first video output,
        # by the newest track of it (the client's current connection).
        self.on_answer = on_answer
        self._answering = next((t.name for t in outputs if t.kind == "video"), None)
        # Told when presenting fails: the session must end with an error rather than
        # leave the client looking at a frozen picture.
        self.on_error = on_error
        self._video: dict[str, list[PacedVideoTrack | StampedVideoTrack]] = (
            collections.defaultdict(list)
        )
        self._audio: dict[str, list[PacedAudioTrack]] = collections.defaultdict(list)
        self._observers: list[Callable[[PresentedFrame], None]] = []
        self._task: asyncio.Task[None] | None = None
        # Paused runs, cancelled but maybe not finished: referenced until done.
        self._retired: set[asyncio.Task[None]] = set()
        self._stopped = False

    def track(self, name: str, *, stamped: bool = False) -> MediaStreamTrack:
        """A new sender track for output `name`, fed from the next slot on. `stamped`:
        a video track carrying each frame's metadata (a `StampedVideoTrack`, which
        encodes once its `start` names the codec)."""
        decl = self.outputs[name]
        if decl.kind == "video":
            answer_to = self.on_answer if name == self._answering else None
            video = StampedVideoTrack(name, answer_to) if stamped else PacedVideoTrack(name, answer_to)
            self._video[name].append(video)
            return video
        audio = PacedAudioTrack(name, decl.channels)
        self._audio[name].append(audio)
        return audio

    def observe(self, observer: Callable[[PresentedFrame], None]) -> Callable[[], None]:
        """Call `observer` with every presented slot, after the tracks got it; returns
        the function that stops it. Observers run on the media loop, so they must hand
        anything slow (encoding, writing) to a thread; one that raises is logged and
        removed, and the session goes on."""
        self._observers.append(observer)

        def stop() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return stop

    def release(self, track: MediaStreamTrack) -> None:
        for tracks in (*self._video.values(), *self._audio.values()):
            if track in tracks:
                tracks.remove(track)  # type: ignore[arg-type]
        track.stop()

    @property
    def paused(self) -> bool:
        return self._task is None

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._guarded_run())

    def pause(self) -> None:
        """Stop presenting (the session is orphaned); the model's emits then wait."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def resume(self) -> None:
        """Present again, starting from fresh frames: the backlog made while paused
        is dropped, with no black frame (the clock holds the last one meanwhile)."""
        if self._task is None and not self._stopped:
            self.clock.buffer.discard_backlog()
            self.start()

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for tracks in (*self._video.values(), *self._audio.values()):
            for track in list(tracks):
                track.stop()

    async def _guarded_run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("the output fanout failed")
            if self._task is asyncio.current_task():
                self._task = None
            if self.on_error is not None:
                self.on_error(exc)

    async def _run(self) -> None:
        while True:
            presented = await self.clock.next_frame()
            for name, tracks in self._video.items():
                image = presented.video.get(name)
                if image is not None:
                    for video in tracks:
                        answering = presented if video is tracks[-1] else None
                        if isinstance(video, StampedVideoTrack):
                            video.offer(image, presented.pts, answering, presented.metadata.get(name))
                        else:
                            video.offer(image, presented.pts, answering)
            for name, tracks in self._audio.items():
                chunk = presented.audio.get(name)
                if chunk is not None and chunk.shape[1]:
                    for audio in tracks:
                        audio.offer(chunk)
            for observer in list(self._observers):
                try:
                    observer(presented)
                except Exception:
                    log.exception("an output observer failed; it is removed")
                    if observer in self._observers:
                        self._observers.remove(observer)

    def superseded(self) -> int:
        return sum(t.superseded for tracks in self._video.values() for t in tracks)


async def receive_input(track: MediaStreamTrack, name: str, session: Session) -> None:
    """Feed a client's track into the model's input buffer `name` until it ends.

    Decoded frames are converted to RGB off the media loop; the input buffer keeps only
    the latest frames, so memory stays bounded however fast the client sends.
    """
    loop = asyncio.get_running_loop()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if session.stopping:
            return
        try:
            if isinstance(frame, VideoFrame):
                array: Any = await loop.run_in_executor(None, _to_rgb, frame)
            else:
                array = _to_int16(frame)
            session.push_input(name, array)
        except Exception:
            log.exception("input track %r: could not deliver a frame", name)


def _to_rgb(frame: VideoFrame) -> np.ndarray:
    return frame.to_ndarray(format="rgb24")


def _to_int16(frame: AudioFrame) -> np.ndarray:
    channels = len(frame.layout.channels)
    data = frame.to_ndarray()
    if frame.format.name != "s16":
        data = frame.reformat(format="s16").to_ndarray()
    return data.reshape(-1, channels).T.copy() if data.shape[0] == 1 else data
