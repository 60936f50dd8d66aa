"""Per-model transport settings, read from `config.yml` (key `webrtc`) or the manifest.

    webrtc:
      codec: vp8                # vp8 | h264: preferred video codec when the offer has both
      bitrate_kbps: 2000        # starting video bitrate
      max_bitrate_kbps: 6000    # the most the browser's estimate may raise it to
      min_bitrate_kbps: 300
      reconnect_grace_s: 30     # how long a session whose client vanished waits for it
      ice_servers:
        - urls: ["turn:turn.example.com:3478"]
          username: user
          credential: secret
"""

from __future__ import annotations

from typing import Any, Literal

from reactor_serve.runtime.field_errors import field_problems
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["IceServer", "WebRTCSettings", "WebRTCSettingsError"]


class WebRTCSettingsError(ValueError):
    """Bad transport settings; the message names the field."""


class IceServer(BaseModel):
    """A STUN or TURN server, as in the browser's RTCIceServer."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] = Field(min_length=1)
    username: str | None = None
    credential: str | None = None

    @field_validator("urls", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("urls")
    @classmethod
    def _scheme(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.split(":", 1)[0] in ("stun", "stuns", "turn", "turns"):
                raise ValueError(f"{url!r} is not a stun:, stuns:, turn: or turns: URL")
        return urls


class WebRTCSettings(BaseModel):
    """How one model's sessions are sent."""

    model_config = ConfigDict(extra="forbid")

    codec: Literal["vp8", "h264"] = "vp8"
    bitrate_kbps: int = Field(default=1500, ge=50, le=100_000)
    min_bitrate_kbps: int = Field(default=250, ge=50, le=100_000)
    max_bitrate_kbps: int = Field(default=6000, ge=50, le=100_000)
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Gather host candidates on 127.0.0.1 only: for a browser or client on the same
    # machine, as with `reactor run` on a laptop and in tests (see webrtc/ice.py).
    loopback_candidates: bool = False
    # A session with no inbound data-channel frame for this long is ended (client gone).
    idle_timeout_s: float = Field(default=20.0, gt=0)
    # A session whose transport is lost without `stop_session` (peer connection closed
    # or failed, or the watchdog above) is orphaned for this long: the model keeps its
    # state and a new offer resumes it (the JS SDK's reconnect). 0 ends it at once.
    reconnect_grace_s: float = Field(default=30.0, ge=0)
    stats_interval_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> WebRTCSettings:
        if not self.min_bitrate_kbps <= self.bitrate_kbps <= self.max_bitrate_kbps:
            raise ValueError(
                "bitrates must satisfy min_bitrate_kbps <= bitrate_kbps <= max_bitrate_kbps"
            )
        return self

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str = "config") -> WebRTCSettings:
        """The `webrtc` section of a model config; errors name the field."""
        section = config.get("webrtc", {}) or {}
        if not isinstance(section, dict):
            raise WebRTCSettingsError(f"{source}: field 'webrtc' must be a mapping")
        try:
            return cls.model_validate(section)
        except ValidationError as exc:
            problems = "; ".join(field_problems(exc, prefix="webrtc"))
            raise WebRTCSettingsError(f"{source}: {problems}") from None
