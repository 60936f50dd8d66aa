"""Media tracks: the `Video` and `Audio` markers and the `Input` / `Output` bases.

A model declares its tracks as dataclass fields annotated with `Video` or `Audio`
(or a subclass of them). The field name is the track name clients see.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "Audio",
    "FrameMetadata",
    "Input",
    "InputFrame",
    "Output",
    "TrackDecl",
    "TrackPayload",
    "Video",
    "declared_tracks",
]


class Video:
    """A video track. Frames are `(H, W, 3)` uint8 RGB; a batch is `(N, H, W, 3)`."""

    kind: Literal["video"] = "video"


class Audio:
    """An audio track. Samples are int16 `(channels, samples)`.

    Subclass it and set `sample_rate` when the model produces audio at another rate
    than 48 kHz; the runtime resamples to 48 kHz for the wire.
    """

    kind: Literal["audio"] = "audio"
    sample_rate: int = 48000
    channels: int = 1


@dataclass
class Input:
    """Base of a model's input tracks. Each field becomes an input buffer."""


@dataclass
class Output:
    """Base of a model's output tracks. Each field carries one track's frames."""


FrameMetadata = typing.Union[dict[str, Any], bytes]
"""One frame's metadata: a JSON-serialisable mapping (sent as compact UTF-8 JSON), or
bytes the model encoded itself (sent as they are)."""


@dataclass(frozen=True, eq=False)
class TrackPayload:
    """A video track's frames together with metadata that travels with each frame.

    Give one in place of the bare frame (or batch) in an `Output`::

        await self.emit(MyOutput(main_video=TrackPayload(frame, metadata={"seed": seed})))

    `metadata` is one value for one frame, or a list with one value per frame of a
    batch (`None` entries carry nothing). A client that negotiated per-frame metadata
    (the official SDKs) receives it with that very frame; a stepped session's result
    carries it beside the frame. Audio tracks carry no frame metadata.

    Compared by identity: comparing the arrays inside would raise, not answer.
    """

    data: Any
    metadata: FrameMetadata | list[FrameMetadata | None] | None = dataclasses.field(
        default=None, kw_only=True
    )


class InputFrame(np.ndarray):
    """A client's video frame that came with metadata: the same `(H, W, 3)` uint8 RGB
    array an input track's `read()` hands out, plus what the client attached to it.

    `metadata` is the sender's bytes (None: none); `capture_time_us` when the sender
    says the frame was captured, in microseconds of the sender's clock (None: not
    stamped). A frame that carried neither is a plain array, so read them as
    `getattr(frame, "metadata", None)`. Views and results of arithmetic on the frame
    keep the two values; `np.asarray(frame)` drops them.
    """

    metadata: bytes | None
    capture_time_us: int | None

    @classmethod
    def tag(cls, frame: np.ndarray, metadata: bytes | None, capture_time_us: int | None) -> np.ndarray:
        """`frame` as an `InputFrame` carrying the two values; `frame` itself when both
        are None."""
        if metadata is None and capture_time_us is None:
            return frame
        tagged = frame.view(cls)
        tagged.metadata, tagged.capture_time_us = metadata, capture_time_us
        return tagged

    def __array_finalize__(self, obj: Any) -> None:
        self.metadata = getattr(obj, "metadata", None)
        self.capture_time_us = getattr(obj, "capture_time_us", None)


@dataclass(frozen=True)
class TrackDecl:
    """One declared track: its name, kind and the marker class it was declared with."""

    name: str
    kind: Literal["video", "audio"]
    marker: type

    @property
    def sample_rate(self) -> int:
        return int(getattr(self.marker, "sample_rate", 48000))

    @property
    def channels(self) -> int:
        return int(getattr(self.marker, "channels", 1))


def declared_tracks(cls: type) -> list[TrackDecl]:
    """The tracks an `Input` or `Output` dataclass declares, in field order.

    Raises TypeError naming the field when a field is not annotated with a track type.
    """
    hints = _resolved_hints(cls)
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else []
    names = [f.name for f in fields] or [n for n in hints if not n.startswith("_")]
    tracks: list[TrackDecl] = []
    for name in names:
        marker = hints.get(name)
        if isinstance(marker, type) and issubclass(marker, Video):
            tracks.append(TrackDecl(name, "video", marker))
        elif isinstance(marker, type) and issubclass(marker, Audio):
            tracks.append(TrackDecl(name, "audio", marker))
        else:
            raise TypeError(
                f"{cls.__qualname__}.{name}: a track field must be annotated with Video or "
                f"Audio (or a subclass), got {marker!r}"
            )
    return tracks


def _resolved_hints(cls: type) -> dict[str, Any]:
    # Model files may use `from __future__ import annotations`, so annotations can be
    # strings; resolve them in the defining module's namespace.
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module else {}
    globalns.setdefault("Video", Video)
    globalns.setdefault("Audio", Audio)
    try:
        return typing.get_type_hints(cls, globalns=globalns)
    except Exception:
        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            hints.update(getattr(klass, "__annotations__", {}))
        return {
            k: (globalns.get(v, v) if isinstance(v, str) else v) for k, v in hints.items()
        }
