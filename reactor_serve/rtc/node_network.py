"""A node's own media network settings, from its environment.

Every node of a cluster has its own public address (and maybe its own opened port
range), which no per-model config can know. KubeRay pods and cluster-launcher nodes
set these environment variables; where set, they override the model's `webrtc`
settings of the same meaning for every session this process serves:

    REACTOR_ANNOUNCED_ADDRESS=203.0.113.7      -> announced_address
    REACTOR_UDP_PORT_RANGE=50000-50199         -> udp_port_range
    REACTOR_ICE_TRANSPORT_POLICY=relay         -> ice_transport_policy (all | relay)

They are read once where a process starts serving sessions (`reactor run`, a Serve
model replica), so a malformed value fails that start with an error naming the
variable, instead of failing each session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from reactor_serve.rtc.ice_servers import require_turn_secrets
from reactor_serve.rtc.settings import WebRTCSettings, WebRTCSettingsError
from reactor_serve.runtime.field_errors import field_problems

__all__ = ["NODE_ENVIRONMENT", "with_node_network"]

# Environment variable -> the WebRTCSettings field it overrides.
NODE_ENVIRONMENT: dict[str, str] = {
    "REACTOR_ANNOUNCED_ADDRESS": "announced_address",
    "REACTOR_UDP_PORT_RANGE": "udp_port_range",
    "REACTOR_ICE_TRANSPORT_POLICY": "ice_transport_policy",
}


def with_node_network(
    settings: WebRTCSettings, environ: Mapping[str, str] | None = None
) -> WebRTCSettings:
    """`settings` with this node's environment variables applied, checked: raises
    WebRTCSettingsError naming the variable (or the field) that is wrong, and when a
    TURN secret's environment variable cannot be read in this process."""
    env = os.environ if environ is None else environ
    overrides = {
        field: env[name].strip()
        for name, field in NODE_ENVIRONMENT.items()
        if env.get(name, "").strip()
    }
    if overrides:
        try:
            settings = WebRTCSettings.model_validate({**settings.model_dump(), **overrides})
        except ValidationError as exc:
            by_field = {field: name for name, field in NODE_ENVIRONMENT.items()}
            problems = []
            for error, line in zip(exc.errors(), field_problems(exc, prefix="webrtc")):
                field = str(error["loc"][0]) if error["loc"] else ""
                name = by_field.get(field)
                problems.append(
                    f"environment variable {name}={env[name].strip()!r}: {line}"
                    if name in env else line
                )
            raise WebRTCSettingsError("; ".join(problems)) from None
    require_turn_secrets(settings.ice_servers)
    return settings
