"""ICE configuration: the servers from settings, and loopback-only host candidates.

aioice never offers 127.0.0.1, so a browser or client on the same machine can only
reach us through a real interface address. For local development and tests we
gather host candidates on 127.0.0.1 alone instead, so no traffic leaves the machine's
loopback. This is a process-wide choice (aioice gathers through a module function).
"""

from __future__ import annotations

import ipaddress
import threading
from typing import Any, Callable

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from reactor_serve.webrtc.settings import IceServer

__all__ = [
    "client_ice_servers",
    "is_loopback_host",
    "rtc_configuration",
    "use_loopback_candidates",
]

_lock = threading.Lock()
_original: Callable[..., list[str]] | None = None


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def use_loopback_candidates(enabled: bool) -> None:
    """Gather host candidates on 127.0.0.1 only (True), or as aioice normally does."""
    global _original
    with _lock:
        if enabled and _original is None:
            _original = aioice.ice.get_host_addresses

            def loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
                return ["127.0.0.1"] if use_ipv4 else []

            aioice.ice.get_host_addresses = loopback_only
        elif not enabled and _original is not None:
            aioice.ice.get_host_addresses = _original
            _original = None


def rtc_configuration(servers: list[IceServer]) -> RTCConfiguration:
    """Always explicit: with no configuration aiortc falls back to a public STUN server,
    which on a closed network only costs time."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
            for s in servers
        ]
    )


def client_ice_servers(servers: list[IceServer]) -> list[dict[str, Any]]:
    """The `ice_servers` list of PROTOCOL.md for clients."""
    out: list[dict[str, Any]] = []
    for server in servers:
        entry: dict[str, Any] = {"uris": list(server.urls)}
        if server.username is not None or server.credential is not None:
            entry["credentials"] = {
                "username": server.username or "",
                "password": server.credential or "",
            }
        out.append(entry)
    return out
