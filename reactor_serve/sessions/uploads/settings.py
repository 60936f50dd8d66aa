"""Per-model upload bounds, read from `config.yml` (key `uploads`).

    uploads:
      max_file_bytes: 33554432      # one file (32 MiB)
      max_session_bytes: 134217728  # all of one session's files together (128 MiB)
      max_files: 64                 # files one session may reserve

A session's files are held in the memory of the process that runs it until the
session ends, so these bound what one client can make a replica hold. `max_files: 0`
turns uploads off for the model.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reactor_serve.rtc.settings import WebRTCSettingsError
from reactor_serve.runtime.field_errors import validated_section

__all__ = ["MAX_FILE_BYTES_CEILING", "UploadSettings", "UploadSettingsError"]

# The most any model may allow for one file: a server that serves several models (the
# Serve ingress) bounds an upload's body by it before the model's own bound applies.
MAX_FILE_BYTES_CEILING = 1024**3


class UploadSettingsError(WebRTCSettingsError):
    """Bad upload settings; the message names the field (a WebRTCSettingsError, so that
    `reactor run` and the Serve app builder report it as they report those)."""


class UploadSettings(BaseModel):
    """How much one session of a model may upload."""

    model_config = ConfigDict(extra="forbid")

    max_file_bytes: int = Field(default=32 * 1024 * 1024, ge=1, le=MAX_FILE_BYTES_CEILING)
    max_session_bytes: int = Field(default=128 * 1024 * 1024, ge=1, le=16 * 1024**3)
    max_files: int = Field(default=64, ge=0, le=10_000)

    @model_validator(mode="after")
    def _file_fits_session(self) -> UploadSettings:
        if self.max_file_bytes > self.max_session_bytes:
            raise ValueError(
                f"max_file_bytes ({self.max_file_bytes}) is more than max_session_bytes "
                f"({self.max_session_bytes}): no session could hold such a file"
            )
        return self

    @classmethod
    def from_config(cls, config: Any, source: str = "config") -> UploadSettings:
        """The `uploads` section of a model config; errors name the field."""
        return validated_section(cls, config, "uploads", UploadSettingsError, source)
