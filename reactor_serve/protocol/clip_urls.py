"""The URLs of a session's clips, as wire v1 clients fetch them (docs/protocol.md "Clips").

`clip_ready` names a playlist, path-only, which the client resolves against its API
URL; the playlist names its segments relative to itself, so that a route prefix
(`/models/<name>` on Serve) carries over to them.
"""

from __future__ import annotations

import re

__all__ = ["SEGMENT_NAME", "marker", "playlist_path", "segment_uri"]

# A segment's name: its clip's id, then the init segment or a fragment's number.
SEGMENT_NAME = re.compile(r"(?P<clip>[a-z][0-9]{1,9})-(?:init\.mp4|(?P<n>[0-9]{5})\.m4s)")


def marker(seconds: float) -> str:
    """A marker (session seconds) as the playlist URL writes it: to the millisecond."""
    return f"{seconds:.3f}"


def playlist_path(session_id: str, start_s: float, end_s: float) -> str:
    """The playlist URL of a clip, path-only."""
    return f"/clips?session_id={session_id}&start={marker(start_s)}&end={marker(end_s)}"


def segment_uri(session_id: str, clip_id: str, number: int | None) -> str:
    """A segment's URI in its playlist: the init segment (`number` None) or fragment
    `number`, relative to the playlist's own URL."""
    name = "init.mp4" if number is None else f"{number:05d}.m4s"
    return f"clips/chunks/{session_id}/{clip_id}-{name}"
