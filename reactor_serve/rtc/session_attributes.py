"""Session-level SDP attributes: the `a=` lines before an SDP's first media section.

The official clients declare their transport extensions there (data-channel
chunking, per-frame metadata), and an answer mirrors each one it takes up.
"""

from __future__ import annotations

__all__ = ["session_attribute", "with_session_attribute"]


def session_attribute(sdp: str, name: str) -> str | None:
    """The value of the first session-level `a=<name>:<value>` line of `sdp` (stripped),
    or None when there is none before the first `m=` line."""
    prefix = f"a={name}:"
    for line in sdp.splitlines():
        if line.startswith("m="):
            return None
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return None


def with_session_attribute(sdp: str, name: str, value: str) -> str:
    """`sdp` with `a=<name>:<value>` added at the end of its session section."""
    line = f"a={name}:{value}\r\n"
    at = sdp.find("\r\nm=")
    if at < 0:
        return sdp + ("" if sdp.endswith("\r\n") else "\r\n") + line
    return sdp[: at + 2] + line + sdp[at + 2:]
