"""The media side of a recording: one H.264 + AAC encode of a session's output, and
fragmented MP4 files made of its packets (sessions/recording/recorder.py drives them).

`RecordingEncoder` owns the codec contexts. They belong to a template container written
to memory, whose header fills in the codec parameters (size, avcC/ASC extradata) that
every file made with `add_stream_from_template` needs, so one encode feeds any number
of files: the recording in progress and the clips cut from the ring of recent packets.
Packets are kept as bytes (`EncodedPacket`): muxing consumes an av.Packet.

`OutputEncode` decides when there is an encoder at all and when a keyframe is forced:
files start with the model's own picture and size, a recording starts on a keyframe,
and a clip starts at most one keyframe interval before what was asked.
"""

from __future__ import annotations

import fractions
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import av
import numpy as np

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.runtime.pacing.emission_clock import (
    AUDIO_CLOCK_RATE,
    VIDEO_CLOCK_RATE,
    PresentedFrame,
)
from reactor_serve.sessions.recording.settings import RecordingSettings

__all__ = ["MOVFLAGS", "EncodedPacket", "Mp4Writer", "OutputEncode", "RecordingEncoder"]

_VIDEO_TB = fractions.Fraction(1, VIDEO_CLOCK_RATE)
_AUDIO_TB = fractions.Fraction(1, AUDIO_CLOCK_RATE)
# Fragmented, so a file cut short by a crash still plays up to its last fragment.
MOVFLAGS = "frag_keyframe+empty_moov+default_base_moof"


@dataclass
class EncodedPacket:
    """One encoded packet, kept as bytes: muxing consumes an av.Packet, and the same
    packet goes to a recording and to the clip ring."""

    stream: int  # 0: video; 1 + i: audio track i
    data: bytes
    pts: int  # in the stream's clock (90 kHz video, 48 kHz audio), session time
    dts: int
    keyframe: bool


class RecordingEncoder:
    """One H.264 + AAC encode of a session's output (worker thread only).

    The codec contexts belong to a template container written to memory: its header
    fills in the codec parameters (size, avcC/ASC extradata) that every file made
    from it with `add_stream_from_template` needs."""

    def __init__(self, settings: RecordingSettings, width: int, height: int, fps: float,
                 audio: list[TrackDecl]) -> None:
        self.width, self.height = width, height
        self._template = av.open(io.BytesIO(), "w", format="mp4")
        video = self._template.add_stream("libx264", rate=max(1, round(fps)))
        context = video.codec_context
        context.width, context.height, context.pix_fmt = width, height, "yuv420p"
        context.time_base = _VIDEO_TB
        # zerolatency: one packet out per frame in (no lookahead, no B-frames), so a
        # forced keyframe lands where asked and a clip ends where the session is.
        context.options = {"preset": settings.preset, "tune": "zerolatency", "crf": str(settings.crf)}
        context.gop_size = 100_000  # keyframes when forced: every keyframe_interval_s
        context.thread_count = 1 if width * height <= 1280 * 720 else 2
        self.streams: list[Any] = [video]
        for track in audio:
            stream = self._template.add_stream(
                "aac", rate=AUDIO_CLOCK_RATE, layout="stereo" if track.channels == 2 else "mono"
            )
            stream.codec_context.time_base = _AUDIO_TB
            self.streams.append(stream)
        self._template.start_encoding()
        self.audio_names = [t.name for t in audio]
        self.audio_channels = [2 if t.channels == 2 else 1 for t in audio]
        # Next expected sample of each audio track (its encoder wants a gapless stream).
        self._audio_next: list[int | None] = [None] * len(audio)
        self.cpu_s = 0.0

    def video(self, image: np.ndarray, pts: int, keyframe: bool) -> list[EncodedPacket]:
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        # One swscale pass: RGB to the encoder's YUV 4:2:0 and size (a model that
        # changes its frame size mid-session is scaled to the first one).
        frame = frame.reformat(width=self.width, height=self.height, format="yuv420p")
        frame.pts, frame.time_base = pts, _VIDEO_TB
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        return self._collect(0, self.streams[0].codec_context.encode(frame))

    def audio(self, index: int, chunk: np.ndarray, audio_pts: int) -> list[EncodedPacket]:
        channels = self.audio_channels[index]
        if chunk.shape[0] != channels:
            chunk = (
                np.repeat(chunk[:1], 2, axis=0) if channels == 2
                else chunk.mean(axis=0, keepdims=True).astype(np.int16)
            )
        out: list[EncodedPacket] = []
        expected = self._audio_next[index]
        if expected is None:
            expected = audio_pts
        gap = audio_pts - expected
        if gap > AUDIO_CLOCK_RATE // 100:
            # Slots without audio (the model made none, or slots were dropped): the
            # client heard silence there, so the file has silence, in sync.
            silence = np.zeros((channels, min(gap, AUDIO_CLOCK_RATE)), dtype=np.int16)
            out += self._audio_frame(index, silence, expected)
            expected += silence.shape[1]
        out += self._audio_frame(index, np.ascontiguousarray(chunk, dtype=np.int16), expected)
        self._audio_next[index] = expected + chunk.shape[1]
        return out

    def _audio_frame(self, index: int, samples: np.ndarray, pts: int) -> list[EncodedPacket]:
        frame = av.AudioFrame.from_ndarray(
            samples.T.reshape(1, -1).copy(),  # packed s16: interleaved channels
            format="s16", layout="stereo" if samples.shape[0] == 2 else "mono",
        )
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_CLOCK_RATE, pts, _AUDIO_TB
        return self._collect(1 + index, self.streams[1 + index].codec_context.encode(frame))

    def _collect(self, stream: int, packets: Any) -> list[EncodedPacket]:
        out = []
        for packet in packets:
            if packet.pts is None or packet.size == 0:
                continue
            out.append(EncodedPacket(stream, bytes(packet), int(packet.pts),
                                int(packet.dts if packet.dts is not None else packet.pts),
                                bool(packet.is_keyframe)))
        return out

    def close(self) -> None:
        try:
            self._template.close()
        except Exception:
            pass


class Mp4Writer:
    """One fragmented MP4 made of an `RecordingEncoder`'s packets, timed from `base_pts` (the
    90 kHz pts of its first frame, a keyframe)."""

    def __init__(self, path: Path, encoder: RecordingEncoder, base_pts: int) -> None:
        self.path = path
        self._container = av.open(
            str(path), "w", format="mp4",
            options={"movflags": MOVFLAGS, "avoid_negative_ts": "make_non_negative", "flush_packets": "1"},
        )
        self._streams = [self._container.add_stream_from_template(s) for s in encoder.streams]
        self.base_pts = base_pts
        self._audio_base = round(base_pts * AUDIO_CLOCK_RATE / VIDEO_CLOCK_RATE)
        self.frames = 0
        self.bytes = 0
        self.last_pts = base_pts
        self.closed = False
        # The newest keyframe muxed: every fragment before it is on disk (a fragment
        # is written whole when the keyframe after it starts the next).
        self._keyframe_pts = base_pts

    @property
    def seconds(self) -> float:
        return (self.last_pts - self.base_pts) / VIDEO_CLOCK_RATE

    def written_s(self) -> float:
        """Seconds of video on disk in whole fragments (infinite once closed). Safe to
        call from any thread."""
        if self.closed:
            return math.inf
        return (self._keyframe_pts - self.base_pts) / VIDEO_CLOCK_RATE

    def write(self, item: EncodedPacket) -> None:
        base = self.base_pts if item.stream == 0 else self._audio_base
        pts, dts = item.pts - base, item.dts - base
        if item.stream != 0 and pts < 0:
            return  # audio from before the first frame
        packet = av.Packet(item.data)
        packet.pts, packet.dts = pts, dts
        packet.time_base = _VIDEO_TB if item.stream == 0 else _AUDIO_TB
        packet.is_keyframe = item.keyframe
        packet.stream = self._streams[item.stream]
        self._container.mux(packet)
        self.bytes += len(item.data)
        if item.stream == 0:
            self.frames += 1
            self.last_pts = item.pts
            if item.keyframe:
                self._keyframe_pts = item.pts

    def close(self) -> None:
        self._container.close()
        self.closed = True


class OutputEncode:
    """The one encode of a session's output (encode worker only).

    The encoder is made at the model's first own picture, at its size: the black
    placeholder shown before it is not recorded. A keyframe is forced at the first
    frame, every `keyframe_interval_s`, and when asked (`want_keyframe`). When encoding
    fails the encoder is dropped and made again at the next frame."""

    def __init__(
        self,
        settings: RecordingSettings,
        video: str,
        audio: list[TrackDecl],
        *,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.settings = settings
        self.video = video
        self.audio = audio
        self.encoder: RecordingEncoder | None = None
        self.fps: float | None = None  # the presented rate the encoder was made at
        self._cpu_clock = cpu_clock
        self._want_keyframe = False
        self._last_keyframe_pts: int | None = None

    def want_keyframe(self) -> None:
        """Force a keyframe at the next frame (a recording starts on one)."""
        self._want_keyframe = True

    def encode(self, presented: PresentedFrame) -> list[EncodedPacket]:
        """The packets of one presented slot (none before the model's first picture).
        Raises what the encoder raised, after dropping it."""
        image = presented.video.get(self.video)
        if image is None:
            return []
        if self.encoder is None and not presented.is_new:
            return []
        started = self._cpu_clock()
        try:
            if self.encoder is None:
                height, width = image.shape[:2]
                self.encoder = RecordingEncoder(self.settings, max(2, width - width % 2),
                                                max(2, height - height % 2), presented.fps, self.audio)
                self._want_keyframe = True
                self.fps = presented.fps
            encoder = self.encoder
            interval = self.settings.keyframe_interval_s * VIDEO_CLOCK_RATE
            keyframe = (
                self._want_keyframe or self._last_keyframe_pts is None
                or presented.pts - self._last_keyframe_pts >= interval
            )
            packets = encoder.video(image, presented.pts, keyframe)
            for index, track in enumerate(self.audio):
                chunk = presented.audio.get(track.name)
                if chunk is not None and chunk.shape[1]:
                    packets += encoder.audio(index, chunk, presented.audio_pts)
        except Exception:
            self.close()
            raise
        finally:
            if self.encoder is not None:
                self.encoder.cpu_s += self._cpu_clock() - started
        for packet in packets:
            if packet.stream == 0 and packet.keyframe:
                self._want_keyframe = False
                self._last_keyframe_pts = packet.pts
        return packets

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        self.encoder = None
