"""`OutputSplitter`: turns what a model emits into per-slot `FrameItem`s.

An emit is an `Output` dataclass (a value per track), or, for a model with one video
track, a raw frame or batch. A batch of N frames becomes N items that share the
batch's memory; audio emitted with it is split across those N items, after
resampling to 48 kHz when the track declares another rate. A video track's value may
be a `TrackPayload`: its metadata goes to each item as bytes, beside the frame.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from reactor_serve.interface.tracks import Output, TrackDecl, TrackPayload
from reactor_serve.runtime.pacing.frames import (
    FrameError,
    audio_chunk,
    black_frame,
    frame_metadata,
    video_batch,
)
from reactor_serve.runtime.pacing.output_buffer import FrameItem
from reactor_serve.runtime.pacing.resample import AudioResampler

__all__ = ["OutputSplitter"]


class OutputSplitter:
    """Validates and splits emits for one model's declared output tracks."""

    def __init__(self, tracks: Sequence[TrackDecl], on_device: bool = False) -> None:
        # With `on_device`, torch video stays a tensor on its device (see video_batch).
        self.on_device = on_device
        self.tracks = {t.name: t for t in tracks}
        self.video_tracks = [t.name for t in tracks if t.kind == "video"]
        self._resamplers = {
            t.name: AudioResampler(t.sample_rate, 48000)
            for t in tracks
            if t.kind == "audio" and t.sample_rate != 48000
        }
        self._last_size: dict[str, tuple[int, int]] = {}

    def reset(self) -> None:
        """A new session: resampler history belongs to the previous stream."""
        for resampler in self._resamplers.values():
            resampler.reset()

    def black(self, default_size: tuple[int, int] = (480, 640)) -> dict[str, np.ndarray]:
        """One black frame per video track, at each track's last size."""
        return {
            name: black_frame(*self._last_size.get(name, default_size))
            for name in self.video_tracks
        }

    def split(self, output: Any) -> list[FrameItem]:
        """FrameItems for one emit (unstamped: the buffer stamps time and sequence). Raises FrameError naming the track and the problem."""
        values = self._track_values(output)
        video: dict[str, np.ndarray] = {}
        audio: dict[str, np.ndarray] = {}
        metadata: dict[str, Any] = {}
        for name, value in values.items():
            if isinstance(value, TrackPayload):
                if self.tracks[name].kind != "video":
                    raise FrameError(f"track {name!r} is audio, which carries no frame metadata")
                if value.metadata is not None:
                    metadata[name] = value.metadata
                value = value.data
            if value is None:
                continue
            if self.tracks[name].kind == "video":
                video[name] = video_batch(value, name, self.on_device)
            else:
                audio[name] = audio_chunk(value, name)
        counts = {name: batch.shape[0] for name, batch in video.items()}
        if len(set(counts.values())) > 1:
            raise FrameError(
                "every video track of one emit must carry the same number of frames, got "
                + ", ".join(f"{k}: {v}" for k, v in counts.items())
            )
        if not video and not audio:
            return []
        n = next(iter(counts.values())) if counts else 1
        per_frame = {
            name: frame_metadata(value, name, n)
            for name, value in metadata.items()
            if name in video
        }
        for name, batch in video.items():
            self._last_size[name] = (int(batch.shape[1]), int(batch.shape[2]))
        for name, chunk in audio.items():
            resampler = self._resamplers.get(name)
            if resampler is not None:
                audio[name] = resampler.process(chunk)
        items = []
        for i in range(n):
            items.append(
                FrameItem(
                    video={name: batch[i] for name, batch in video.items()},
                    audio={name: _part(chunk, i, n) for name, chunk in audio.items()},
                    metadata={
                        name: entries[i]
                        for name, entries in per_frame.items()
                        if entries[i] is not None
                    },
                )
            )
        return items

    def _track_values(self, output: Any) -> dict[str, Any]:
        if isinstance(output, Output):
            if not dataclasses.is_dataclass(output):
                raise FrameError(f"{type(output).__name__} must be decorated with @dataclass")
            values = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
            unknown = [name for name in values if name not in self.tracks]
            if unknown:
                raise FrameError(
                    f"{type(output).__name__} has track(s) {', '.join(map(repr, unknown))} "
                    f"that the model does not declare (declared: {', '.join(self.tracks)})"
                )
            return values
        if isinstance(output, dict):
            raise FrameError(
                "emit an Output dataclass instance (or a raw frame for a single-video-track "
                "model), not a dict"
            )
        if len(self.video_tracks) != 1:
            raise FrameError(
                f"a raw frame can only be emitted by a model with exactly one video track; "
                f"this model has {len(self.video_tracks)} ({', '.join(self.video_tracks) or 'none'}): "
                f"emit an Output instance instead"
            )
        return {self.video_tracks[0]: output}


def _part(chunk: np.ndarray, i: int, n: int) -> np.ndarray:
    samples = chunk.shape[1]
    return chunk[:, (i * samples) // n : ((i + 1) * samples) // n]
