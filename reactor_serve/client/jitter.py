"""Release each received video frame as soon as its last packet is in.

aiortc's jitter buffer hands a frame to the decoder only when the first packet of the
next frame arrives, so an aiortc client sees every frame one frame interval late.
Browsers release a frame once all its packets are in, marked by the RTP marker bit;
our client does the same, so what it measures is what a viewer sees.
"""

from __future__ import annotations

from typing import Any

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

__all__ = ["release_frames_on_marker"]


class _MarkerJitterBuffer(JitterBuffer):
    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        pli_flag, frame = super().add(packet)
        if frame is None and packet.marker:
            frame = self._release(packet.timestamp)
        return pli_flag, frame

    def _release(self, timestamp: int) -> JitterFrame | None:
        if self._origin is None:
            return None
        packets: list[RtpPacket] = []
        for count in range(self.capacity):
            packet = self._packets[(self._origin + count) % self.capacity]
            if packet is None or packet.timestamp != timestamp:
                return None  # a gap, or an unfinished earlier frame: the usual path decides
            packets.append(packet)
            if packet.marker:
                self.remove(count + 1)
                return JitterFrame(
                    data=b"".join(p._data for p in packets),  # type: ignore[attr-defined]
                    timestamp=timestamp,
                )
        return None


def release_frames_on_marker(receiver: Any) -> None:
    """Give a video RTCRtpReceiver the marker-aware jitter buffer (before media flows)."""
    receiver._RTCRtpReceiver__jitter_buffer = _MarkerJitterBuffer(capacity=512, is_video=True)
