"""The clips of one session that its client fetches over HTTP, as wire v1 asks for them.

A v1 client's `request_clip` / `request_recording` is answered with markers and a
playlist URL (`/clips?session_id=&start=&end=`); the client then fetches the playlist
and the segments it names (`clips/chunks/<session id>/<name>`), relative to it so that
a route prefix (`/models/<name>` on Serve) carries over. The files are the recorder's
own fragmented MP4s (a clip cut from the ring, or the recording in progress), served
as byte ranges (hls.py): nothing is copied or encoded again.

Only the session's client learns its id, which is what every route here takes; the
clips go when the session ends (410 after). Thread-safe: clips are added on the encode
worker and read by the HTTP routes.
"""

from __future__ import annotations

import math
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reactor_serve.protocol.clip_urls import SEGMENT_NAME, marker, segment_uri
from reactor_serve.protocol.errors import ClipGone, UnknownClip
from reactor_serve.sessions.recording.hls import Mp4Fragments, media_playlist

__all__ = ["ServedClip", "ServedClips"]

@dataclass
class ServedClip:
    """One fragmented MP4 (`path`) whose video starts at `file_start_s` of the
    session, served as the clip [`start_s`, `end_s`]. `written_s()`: how many seconds
    of its video are on disk in whole fragments (infinite once the file is complete;
    a recording in progress writes a fragment when the next keyframe starts one)."""

    clip_id: str
    path: Path
    file_start_s: float
    start_s: float
    end_s: float
    written_s: Callable[[], float]
    retry_after_s: float = 1.0
    # A staging directory of a URL destination, removed with the session's clips.
    staging: Path | None = None
    _index: Mp4Fragments | None = field(default=None, repr=False)

    def segments(self) -> tuple[Mp4Fragments, list[tuple[int, float]]] | None:
        """The file's index and (fragment number, duration) of the fragments making up
        the clip; None while its end is not written yet."""
        end = self.end_s - self.file_start_s
        written = self.written_s()
        if written <= end + 1e-6:
            return None
        index = self._index if self._index is not None else Mp4Fragments.read(self.path)
        if index is None:
            return None
        if math.isinf(written):
            self._index = index  # the file changes no more
        wanted = [n for n, f in enumerate(index.fragments) if n == 0 or f.start_s <= end + 1e-6]
        if not wanted:
            return None
        starts = [index.fragments[n].start_s for n in wanted]
        following = [index.fragments[n + 1].start_s if n + 1 < len(index.fragments)
                     else max(end, starts[-1]) for n in wanted]
        return index, [(n, following[i] - starts[i]) for i, n in enumerate(wanted)]


class ServedClips:
    """The served clips of session `session_id`."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._lock = threading.Lock()
        self._clips: dict[str, ServedClip] = {}
        self._by_markers: dict[tuple[str, str], str] = {}
        self._closed = False

    def add(self, clip: ServedClip) -> None:
        with self._lock:
            if self._closed:
                _remove(clip)
                return
            self._clips[clip.clip_id] = clip
            self._by_markers[(marker(clip.start_s), marker(clip.end_s))] = clip.clip_id

    def playlist(self, start: float, end: float) -> str | float:
        """The playlist of the clip with these markers, or the seconds to wait while
        its end is not written yet. Raises UnknownClip, ClipGone."""
        clip = self._find(start, end)
        found = clip.segments()
        if found is None:
            return clip.retry_after_s
        _, segments = found
        return media_playlist(
            segment_uri(self.session_id, clip.clip_id, None),
            [(segment_uri(self.session_id, clip.clip_id, n), d) for n, d in segments],
        )

    def chunk(self, name: str) -> bytes:
        """The init segment or a media segment a playlist named. Raises UnknownClip,
        ClipGone."""
        match = SEGMENT_NAME.fullmatch(name)
        if match is None:
            raise UnknownClip(f"no clip segment {name[:80]!r} in this session")
        with self._lock:
            self._check_open()
            clip = self._clips.get(match["clip"])
        if clip is None:
            raise UnknownClip(f"no clip segment {name!r} in this session")
        found = clip.segments()
        if found is None:
            raise UnknownClip(f"clip segment {name!r} is not written yet")
        index, segments = found
        if match["n"] is None:
            offset, size = 0, index.init_size
        else:
            number = int(match["n"])
            if number not in {n for n, _ in segments}:
                raise UnknownClip(f"the clip has no segment {number}")
            fragment = index.fragments[number]
            offset, size = fragment.offset, fragment.size
        try:
            with open(clip.path, "rb") as file:
                file.seek(offset)
                return file.read(size)
        except OSError:
            raise ClipGone("the clip's files are no longer here") from None

    def close(self) -> None:
        """The session ended: its clips are gone (their staging copies removed)."""
        with self._lock:
            self._closed = True
            clips, self._clips = list(self._clips.values()), {}
            self._by_markers.clear()
        for clip in clips:
            _remove(clip)

    def _find(self, start: float, end: float) -> ServedClip:
        if not (math.isfinite(start) and math.isfinite(end)):
            raise UnknownClip("the clip markers must be finite numbers")
        with self._lock:
            self._check_open()
            clip_id = self._by_markers.get((marker(start), marker(end)))
            clip = self._clips.get(clip_id) if clip_id is not None else None
        if clip is None:
            raise UnknownClip(f"this session has no clip from {marker(start)} to {marker(end)} s")
        return clip

    def _check_open(self) -> None:
        if self._closed:
            raise ClipGone(f"session {self.session_id} has ended: its clips are gone")


def _remove(clip: ServedClip) -> None:
    if clip.staging is not None:
        shutil.rmtree(clip.staging, ignore_errors=True)
