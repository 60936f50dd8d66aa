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
        - urls: ["turn:turn.example.com:3478"]   # or: short-lived credentials per session,
          secret_env: TURN_SECRET                # minted from coturn's static-auth-secret
          credential_ttl_s: 7200
      # Where this node is reachable (see rtc/host_candidates.py); per node, the
      # environment variables of rtc/node_network.py override these.
      announced_address: 203.0.113.7   # host candidates advertised with this address
      udp_port_range: 50000-50199      # host candidates bind only these UDP ports
      ice_transport_policy: all        # all | relay (relay candidates only)
      max_viewers: 4                   # watch-only viewers per session (0: none)
      viewer_keyframe_interval_s: 2    # viewers' keyframe period (their recovery time)
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reactor_serve.runtime.field_errors import validated_section

__all__ = ["IceServer", "WebRTCSettings", "WebRTCSettingsError"]


class WebRTCSettingsError(ValueError):
    """Bad transport settings; the message names the field."""


class IceServer(BaseModel):
    """A STUN or TURN server, as in the browser's RTCIceServer."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] = Field(min_length=1)
    # Static credentials, handed to every client as they are...
    username: str | None = None
    credential: str | None = None
    # ...or the TURN REST scheme (coturn's `use-auth-secret` + `static-auth-secret`):
    # a fresh username and credential minted per session from this shared secret
    # (rtc/turn_credentials.py), or from the environment variable `secret_env`
    # names, read where credentials are minted (a Kubernetes secret mounted as env).
    secret: str | None = Field(default=None, min_length=1, repr=False)
    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # How long a minted credential is valid. The TURN server checks it whenever an
    # allocation is made (coturn keeps refreshing a live one past it), and a client
    # that reconnects late in its session allocates again with the credentials it got
    # at the start: so it must outlast the longest session (Serve's default
    # max_session_s is 3600) plus its wait for a slot. Two hours covers that with
    # room, and a credential copied out of a page is dead soon after its session.
    credential_ttl_s: int = Field(default=7200, ge=60, le=7 * 86400)

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

    @model_validator(mode="after")
    def _one_kind_of_credentials(self) -> IceServer:
        minted = [name for name in ("secret", "secret_env") if getattr(self, name) is not None]
        static = [name for name in ("username", "credential") if getattr(self, name) is not None]
        if len(minted) > 1:
            raise ValueError("set 'secret' or 'secret_env', not both")
        if minted and static:
            raise ValueError(
                f"'{minted[0]}' mints credentials per session: remove "
                + " and ".join(f"'{name}'" for name in static)
            )
        if minted and not self.is_turn:
            raise ValueError(f"'{minted[0]}' is for TURN servers: 'urls' has no turn: or turns: URL")
        return self

    @property
    def mints_credentials(self) -> bool:
        """Whether this server's credentials are minted per session (TURN REST)."""
        return self.secret is not None or self.secret_env is not None

    @property
    def is_turn(self) -> bool:
        return any(url.startswith(("turn:", "turns:")) for url in self.urls)


class WebRTCSettings(BaseModel):
    """How one model's sessions are sent."""

    model_config = ConfigDict(extra="forbid")

    codec: Literal["vp8", "h264"] = "vp8"
    bitrate_kbps: int = Field(default=1500, ge=50, le=100_000)
    min_bitrate_kbps: int = Field(default=250, ge=50, le=100_000)
    max_bitrate_kbps: int = Field(default=6000, ge=50, le=100_000)
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Gather host candidates on 127.0.0.1 only: for a browser or client on the same
    # machine, as with `reactor run` on a laptop and in tests (see rtc/ice_servers.py).
    loopback_candidates: bool = False
    # 1:1 NAT: host candidates keep their socket but are advertised with this address
    # (the node's public IP), same port. See rtc/host_candidates.py.
    announced_address: str | None = None
    # Host candidates bind only UDP ports in [min, max] (open that range in the
    # firewall): `[50000, 50199]` or "50000-50199".
    udp_port_range: tuple[int, int] | None = None
    # "relay": only TURN relay candidates are offered (media always through TURN).
    ice_transport_policy: Literal["all", "relay"] = "all"
    # A session with no inbound data-channel frame for this long is ended (client gone).
    idle_timeout_s: float = Field(default=20.0, gt=0)
    # How long an answered connection may take to come up (ICE and DTLS connected)
    # before its transport counts as lost; its silence counts from then. As long as
    # our clients wait for their channel: a busy client or server may take a while.
    connect_timeout_s: float = Field(default=60.0, gt=0)
    # A session whose transport is lost without `stop_session` (peer connection closed
    # or failed, or the watchdog above) is orphaned for this long: the model keeps its
    # state and a new offer resumes it (the JS SDK's reconnect). 0 ends it at once.
    reconnect_grace_s: float = Field(default=30.0, ge=0)
    stats_interval_s: float = Field(default=1.0, gt=0)
    # Viewers (watch-only links, sessions/viewers/room.py): at most this many per session
    # (0: no viewer links), and how often their shared encoder makes a keyframe, which
    # is how long a viewer that lost packets waits to see a whole picture again.
    max_viewers: int = Field(default=4, ge=0, le=64)
    viewer_keyframe_interval_s: float = Field(default=2.0, gt=0, le=60)

    @field_validator("announced_address")
    @classmethod
    def _ip_address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            address = ipaddress.ip_address(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None
        if address.is_unspecified or address.is_multicast:
            raise ValueError(f"{value!r} cannot be announced: it is not a unicast address")
        return str(address)

    @field_validator("udp_port_range", mode="before")
    @classmethod
    def _port_range_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", value)
            if match is None:
                raise ValueError(f"{value!r} is not a port range like \"50000-50199\"")
            return (int(match[1]), int(match[2]))
        return value

    @field_validator("udp_port_range")
    @classmethod
    def _port_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is None:
            return None
        low, high = value
        if not (1024 <= low <= 65535 and 1024 <= high <= 65535):
            raise ValueError(f"ports must be within 1024..65535, got {low}-{high}")
        if low > high:
            raise ValueError(f"the first port must not exceed the last, got {low}-{high}")
        return value

    @field_validator("ice_transport_policy")
    @classmethod
    def _relay_needs_turn(cls, value: str, info: ValidationInfo) -> str:
        servers = info.data.get("ice_servers")
        # `ice_servers` is validated first; when it failed, its own error says why.
        if value == "relay" and servers is not None and not any(s.is_turn for s in servers):
            raise ValueError(
                "relay offers relay candidates only: 'ice_servers' needs a turn: or turns: server"
            )
        return value

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
        return validated_section(cls, config, "webrtc", WebRTCSettingsError, source)
