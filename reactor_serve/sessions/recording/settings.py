"""Per-model recording settings, read from `config.yml` (key `recording`).

    recording:
      enabled: true               # the model opts in: its sessions may be recorded
      destination: ./recordings   # a local directory, or any fsspec URL (s3://bucket/prefix)
      record_by_default: false    # record every session from its start, unasked
      max_seconds: 600            # a recording stops (reason "limit") past this long...
      max_bytes: 2000000000       # ...or this many bytes of video and audio
      clip_seconds: 30            # seconds kept in memory for `saveClip` (0: no clips)
      keyframe_interval_s: 1      # a clip starts at most this long before what was asked
      preset: ultrafast           # libx264 preset (ultrafast .. medium)
      crf: 23                     # libx264 quality (lower: better and bigger)

A serve_config.yaml model entry may override any of these (its `recording:` keys win).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reactor_serve.rtc.settings import WebRTCSettingsError
from reactor_serve.runtime.field_errors import validated_section

__all__ = ["RecordingSettings", "RecordingSettingsError"]


class RecordingSettingsError(WebRTCSettingsError):
    """Bad recording settings; the message names the field (a WebRTCSettingsError, so
    that `reactor run` and the Serve app builder report it as they report those)."""


class RecordingSettings(BaseModel):
    """Whether and how one model's sessions are recorded."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    destination: str = Field(default="./recordings", min_length=1)
    record_by_default: bool = False
    max_seconds: float = Field(default=600.0, gt=0, le=7 * 86400)
    max_bytes: int = Field(default=2_000_000_000, ge=100_000)
    clip_seconds: float = Field(default=30.0, ge=0, le=600)
    keyframe_interval_s: float = Field(default=1.0, gt=0, le=10)
    # ultrafast by default: the clip encode runs for the whole of every opted-in session.
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"] = "ultrafast"
    crf: int = Field(default=23, ge=0, le=51)
    # Presented frames waiting for the encoder thread; past it frames are dropped
    # (counted, noted in the recording's meta.json) rather than stalling the media loop.
    queue_frames: int = Field(default=120, ge=2, le=10_000)

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must be a directory or an fsspec URL, got an empty string")
        if "://" in value:
            scheme = value.split("://", 1)[0]
            if not scheme or not scheme.replace("+", "").replace("-", "").isalnum():
                raise ValueError(f"{value!r} is not a URL with a scheme like s3:// or memory://")
        return value

    @classmethod
    def from_config(cls, config: Any, source: str = "config") -> RecordingSettings:
        """The `recording` section of a model config; errors name the field."""
        return validated_section(cls, config, "recording", RecordingSettingsError, source)
