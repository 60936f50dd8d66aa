"""A fragmented MP4 as an HLS (version 7, fMP4) media playlist, without copying it.

The recorder writes every recording and clip as one fragmented MP4 (encoding.py:
`ftyp` + an empty `moov`, then a `moof` + `mdat` pair per keyframe interval). That
file already is an HLS fMP4 stream: its head up to the first `moof` is the init
segment (`#EXT-X-MAP`), and each `moof` + `mdat` pair is a media segment. So a
playlist is an index of byte ranges into the file, and a client that fetches the init
segment and then every segment, in order, and concatenates them (as the official SDK's
`download()` does) gets back exactly the MP4 we wrote.

`Mp4Fragments.read` indexes a file that may still be growing (a recording in
progress): only whole boxes count, so a fragment the muxer is still writing is not
listed until it is complete. Segment start times come from each fragment's `tfdt`
(the video track's decode time) over the `mdhd` timescale.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Fragment", "Mp4Fragments", "media_playlist"]

# Bounds on what is read of a box we look into: a `moov` or `moof` written by the
# recorder is a few KiB; anything past these is not one of ours.
_MAX_MOOV_BYTES = 1 << 20
_MAX_MOOF_BYTES = 4 << 20
_VIDEO_TRACK_ID = 1  # the recorder's first stream is its video (encoding.py)


@dataclass(frozen=True)
class Fragment:
    """One media segment: `size` bytes at `offset`, starting `start_s` seconds into
    the file's video."""

    offset: int
    size: int
    start_s: float


@dataclass(frozen=True)
class Mp4Fragments:
    """The init segment's size and the complete fragments of one fragmented MP4."""

    init_size: int
    fragments: tuple[Fragment, ...]
    # Bytes of whole boxes: a reader of a growing file stops here.
    complete_size: int

    @classmethod
    def read(cls, path: Path) -> Mp4Fragments | None:
        """The index of `path`, or None while it has no complete init segment (or is
        not a fragmented MP4)."""
        try:
            with open(path, "rb") as file:
                return cls._read(file, path.stat().st_size)
        except (OSError, ValueError, struct.error):
            return None

    @classmethod
    def _read(cls, file, size: int) -> Mp4Fragments | None:  # type: ignore[no-untyped-def]
        offset = 0
        init_size: int | None = None
        timescale: int | None = None
        fragments: list[Fragment] = []
        moof: tuple[int, int | None] | None = None  # offset and decode time of the open fragment
        complete = 0
        while offset + 8 <= size:
            file.seek(offset)
            box_size, kind = struct.unpack(">I4s", file.read(8))
            header = 8
            if box_size == 1:
                box_size = struct.unpack(">Q", file.read(8))[0]
                header = 16
            if box_size < header or offset + box_size > size:
                break  # being written (size 0 means "to the end": also unfinished)
            if kind == b"moov":
                if box_size > _MAX_MOOV_BYTES:
                    return None
                timescale = _timescale(file.read(box_size - header))
            elif kind == b"moof":
                if box_size > _MAX_MOOF_BYTES:
                    return None
                if init_size is None:
                    init_size = offset
                moof = (offset, _decode_time(file.read(box_size - header)))
            elif kind == b"mdat" and moof is not None:
                start, decoded = moof
                seconds = decoded / timescale if decoded is not None and timescale else 0.0
                fragments.append(Fragment(start, offset + box_size - start, seconds))
                moof = None
            offset += box_size
            if moof is None:
                complete = offset
        if init_size is None:
            if timescale is None:
                return None
            init_size = complete  # no fragment yet: all there is, is the head
        return cls(init_size, tuple(fragments), complete)


def _boxes(data: bytes):  # type: ignore[no-untyped-def]
    """(type, payload) of the boxes directly inside `data`."""
    offset = 0
    while offset + 8 <= len(data):
        size, kind = struct.unpack_from(">I4s", data, offset)
        header = 8
        if size == 1:
            size = struct.unpack_from(">Q", data, offset + 8)[0]
            header = 16
        if size < header or offset + size > len(data):
            return
        yield kind, data[offset + header: offset + size]
        offset += size


def _timescale(moov: bytes) -> int | None:
    """The video track's `mdhd` timescale."""
    for kind, trak in _boxes(moov):
        if kind != b"trak":
            continue
        track_id, scale = None, None
        for inner, payload in _boxes(trak):
            if inner == b"tkhd":
                # version(1) flags(3), then times of 4 or 8 bytes each, then the id.
                track_id = struct.unpack_from(">I", payload, 20 if payload[0] == 1 else 12)[0]
            elif inner == b"mdia":
                for leaf, body in _boxes(payload):
                    if leaf == b"mdhd":
                        scale = struct.unpack_from(">I", body, 20 if body[0] == 1 else 12)[0]
        if track_id == _VIDEO_TRACK_ID and scale:
            return int(scale)
    return None


def _decode_time(moof: bytes) -> int | None:
    """The video track's `tfdt` base media decode time in this fragment."""
    for kind, traf in _boxes(moof):
        if kind != b"traf":
            continue
        track_id, decoded = None, None
        for inner, payload in _boxes(traf):
            if inner == b"tfhd":
                track_id = struct.unpack_from(">I", payload, 4)[0]
            elif inner == b"tfdt":
                decoded = struct.unpack_from(">Q" if payload[0] == 1 else ">I", payload, 4)[0]
        if track_id == _VIDEO_TRACK_ID:
            return decoded
    return None


def media_playlist(init_uri: str, segments: list[tuple[str, float]]) -> str:
    """An HLS v7 VOD media playlist: the init segment at `init_uri`, then
    `(uri, duration_s)` per segment, in order."""
    target = max([1, *(math.ceil(duration) for _, duration in segments)])
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        f"#EXT-X-TARGETDURATION:{target}",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        f'#EXT-X-MAP:URI="{init_uri}"',
    ]
    for uri, duration in segments:
        lines += [f"#EXTINF:{max(duration, 0.001):.3f},", uri]
    lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"
