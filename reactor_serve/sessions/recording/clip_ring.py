"""The clip ring: the encoded packets of the last `clip_seconds` of a session's output.

`saveClip` writes its MP4 from these packets without encoding again, so the ring holds
whole keyframe intervals (a clip must start on a keyframe): an interval is dropped only
once the next one alone still covers the span, which makes a clip start at most one
keyframe interval before what was asked. It is bounded in bytes too, so a picture that
compresses badly cannot make it grow without bound. Encode worker only.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from reactor_serve.runtime.pacing.emission_clock import VIDEO_CLOCK_RATE
from reactor_serve.sessions.recording.encoding import EncodedPacket

__all__ = ["CLIP_MAX_BYTES", "Clip", "ClipRing"]

CLIP_MAX_BYTES = 256 * 1024 * 1024


@dataclass
class _Gop:
    """Packets from one video keyframe up to the next."""

    start_pts: int
    packets: list[EncodedPacket] = field(default_factory=list)
    bytes: int = 0


@dataclass(frozen=True)
class Clip:
    """Packets cut from the ring: the first is the video keyframe at `start_pts`."""

    start_pts: int
    newest_pts: int  # the newest video packet's pts
    packets: list[EncodedPacket]


class ClipRing:
    """Whole keyframe intervals covering the last `span_s` seconds (90 kHz video pts)."""

    def __init__(self, span_s: float, max_bytes: int = CLIP_MAX_BYTES) -> None:
        self.span_s = span_s
        self.max_bytes = max_bytes
        self._gops: collections.deque[_Gop] = collections.deque()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def start_pts(self) -> int | None:
        """The pts of the oldest keyframe held, or None when empty."""
        return self._gops[0].start_pts if self._gops else None

    def add(self, packet: EncodedPacket) -> None:
        """An encoded packet, in encoding order (audio before the first keyframe is
        not kept: a clip cannot start before it)."""
        if self.span_s <= 0:
            return
        if packet.stream == 0 and packet.keyframe:
            self._gops.append(_Gop(packet.pts))
        if not self._gops:
            return
        gop = self._gops[-1]
        gop.packets.append(packet)
        gop.bytes += len(packet.data)
        self._bytes += len(packet.data)
        newest = packet.pts if packet.stream == 0 else None
        # Drop the oldest interval once the next one alone still covers the span.
        while len(self._gops) > 1 and (
            (newest is not None and newest - self._gops[1].start_pts >= self.span_s * VIDEO_CLOCK_RATE)
            or self._bytes > self.max_bytes
        ):
            self._bytes -= self._gops.popleft().bytes

    def cut(self, seconds: float) -> Clip | None:
        """The last `seconds`, from the latest keyframe at or before their start (the
        oldest one held if none is); None when nothing is held."""
        if not self._gops:
            return None
        newest = max(p.pts for p in self._gops[-1].packets if p.stream == 0)
        start = self._gops[0]
        for gop in self._gops:
            if gop.start_pts <= newest - seconds * VIDEO_CLOCK_RATE:
                start = gop
        packets = [p for gop in self._gops if gop.start_pts >= start.start_pts for p in gop.packets]
        return Clip(start.start_pts, newest, packets)
