"""ICE servers for one session: minted TURN credentials, the peer connection's
configuration, and the list clients get from `GET .../ice_servers`.

Which host candidates a peer connection offers (loopback only, a port range, an
announced address) is a per-connection policy of its own: rtc/host_candidates.py.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from reactor_serve.rtc.settings import IceServer, WebRTCSettingsError
from reactor_serve.rtc.turn_credentials import mint_turn_credentials, session_tag

__all__ = [
    "client_ice_servers",
    "require_turn_secrets",
    "rtc_configuration",
    "session_ice_servers",
]


def _secret(server: IceServer) -> str:
    if server.secret is not None:
        return server.secret
    assert server.secret_env is not None
    value = os.environ.get(server.secret_env, "")
    if not value:
        raise WebRTCSettingsError(
            f"ICE server {server.urls[0]}: field 'secret_env' names the environment "
            f"variable {server.secret_env}, which is "
            + ("empty" if server.secret_env in os.environ else "not set")
            + " in this process"
        )
    return value


def require_turn_secrets(servers: list[IceServer]) -> None:
    """Raise WebRTCSettingsError unless every minting server's secret can be read here:
    called where a process starts, so a missing secret fails it once and loudly, not
    each session."""
    for server in servers:
        if server.mints_credentials:
            _secret(server)


def session_ice_servers(servers: list[IceServer], session_id: str) -> list[IceServer]:
    """`servers` as session `session_id` uses them: a server configured with a secret
    gets credentials minted now (rtc/turn_credentials.py), the others as they are."""
    out: list[IceServer] = []
    for server in servers:
        if not server.mints_credentials:
            out.append(server)
            continue
        secret = _secret(server)
        minted = mint_turn_credentials(
            secret, server.credential_ttl_s, session_tag(secret, session_id)
        )
        out.append(IceServer(urls=server.urls, username=minted.username,
                             credential=minted.credential))
    return out


def rtc_configuration(
    servers: list[IceServer], transport_policy: Literal["all", "relay"] = "all"
) -> RTCConfiguration:
    """The configuration of one session's peer connection; `servers` as
    `session_ice_servers` gives them.

    Always explicit: with no configuration aiortc falls back to a public STUN server,
    which on a closed network only costs time."""
    _require_minted(servers)
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
            for s in servers
        ],
        iceTransportPolicy=(
            RTCIceTransportPolicy.RELAY if transport_policy == "relay" else RTCIceTransportPolicy.ALL
        ),
    )


def client_ice_servers(servers: list[IceServer]) -> list[dict[str, Any]]:
    """The `ice_servers` list of docs/protocol.md for clients; `servers` as
    `session_ice_servers` gives them."""
    _require_minted(servers)
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


def _require_minted(servers: list[IceServer]) -> None:
    # A secret must never reach a client or a peer connection as a credential.
    if any(server.mints_credentials for server in servers):
        raise ValueError("mint the session's TURN credentials first (session_ice_servers)")
