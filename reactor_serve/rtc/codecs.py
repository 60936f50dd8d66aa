"""Video codec choice and bitrate range for aiortc's encoders.

aiortc steers bitrate only from the browser's REMB estimate and clamps it to fixed
ranges (VP8 0.25 to 1.5 Mbps, H264 0.5 to 3 Mbps), too low for 720p of generated
video. Those clamps are module constants of aiortc's encoders, so the configured
range is applied process-wide: one model per process, as in a replica or `reactor run`.
"""

from __future__ import annotations

from aiortc import RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import h264, vpx
from aiortc.sdp import SessionDescription

from reactor_serve.rtc.settings import WebRTCSettings

__all__ = ["answered_codecs", "apply_bitrate_range", "prefer_codec"]

_MIME = {"vp8": "video/VP8", "h264": "video/H264"}


def apply_bitrate_range(settings: WebRTCSettings) -> None:
    """Start at `bitrate_kbps` and let the receiver's estimate move it within
    [`min_bitrate_kbps`, `max_bitrate_kbps`]."""
    for module in (vpx, h264):
        module.MIN_BITRATE = settings.min_bitrate_kbps * 1000
        module.MAX_BITRATE = settings.max_bitrate_kbps * 1000
        module.DEFAULT_BITRATE = settings.bitrate_kbps * 1000


def prefer_codec(transceiver: RTCRtpTransceiver, codec: str) -> None:
    """Put `codec` first for this video transceiver; the offer's other codecs (and RTX)
    stay available as fallbacks, so a client without it still connects."""
    preferred = _MIME[codec].lower()
    codecs = RTCRtpSender.getCapabilities("video").codecs
    ordered = sorted(codecs, key=lambda c: (c.mimeType.lower() != preferred, c.mimeType.lower() == "video/rtx"))
    transceiver.setCodecPreferences(ordered)


def answered_codecs(answer: str) -> dict[str, str]:
    """mid -> the video codec our answer sends on it (its first codec)."""
    codecs: dict[str, str] = {}
    for media in SessionDescription.parse(answer).media:
        if media.kind == "video" and media.rtp.codecs:
            mime = media.rtp.codecs[0].mimeType.lower()
            if mime in ("video/vp8", "video/h264"):
                codecs[media.rtp.muxId] = mime.split("/", 1)[1]
    return codecs
