"""`guard_media_packets`: one peer connection's DTLS transport made to survive a
hostile peer's RTP and RTCP (the server's sessions and viewers call it).

aiortc reads every SRTP and SRTCP packet inside its DTLS transport's receive loop, and
an exception out of that read closes the transport, and with it the connection. Some
malformed packets raise more than the `ValueError` aiortc expects: a REMB whose SSRC
count runs past its bytes, or a header extension of the wrong length on a negotiated
id (a one-byte abs-send-time), raise `struct.error` from aiortc's own parsers. One such
packet from a client would end its session. Guarded, such a packet is dropped and
counted, and the connection goes on.

Per transport, not on aiortc's class, as `guard_sctp_text_frames` is: only the server's
own connections change. Call it after setRemoteDescription (which makes the transport)
and before the answer is sent. Idempotent; None is ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from reactor_serve.runtime.log_throttle import LogThrottle

__all__ = ["MediaPacketGuard", "guard_media_packets", "media_packet_guard"]

log = logging.getLogger("reactor_serve.rtc.media_packet_guard")
_throttle = LogThrottle(log)
_ATTRIBUTE = "_reactor_media_packet_guard"


@dataclass
class MediaPacketGuard:
    """What a guarded transport dropped."""

    dropped_rtp: int = 0
    dropped_rtcp: int = 0


def media_packet_guard(transport: Any) -> MediaPacketGuard | None:
    """The guard on `transport`, if it has one."""
    return getattr(transport, _ATTRIBUTE, None)


def guard_media_packets(transport: Any) -> None:
    """Drop, rather than die of, an RTP or RTCP packet that breaks aiortc's read."""
    if transport is None or media_packet_guard(transport) is not None:
        return
    guard = MediaPacketGuard()

    def dropped_rtcp() -> None:
        guard.dropped_rtcp += 1

    def dropped_rtp() -> None:
        guard.dropped_rtp += 1

    transport._handle_rtcp_data = _dropping(transport._handle_rtcp_data, "RTCP", dropped_rtcp)
    transport._handle_rtp_data = _dropping(transport._handle_rtp_data, "RTP", dropped_rtp)
    setattr(transport, _ATTRIBUTE, guard)


def _dropping(read: Callable[..., Awaitable[None]], what: str, count: Callable[[], None]) -> Callable[..., Awaitable[None]]:
    """`read`, with a packet that breaks it dropped and counted instead of raised."""

    async def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            await read(*args, **kwargs)
        except ConnectionError:
            raise  # the transport is going: aiortc's loop ends it as before
        except Exception:
            count()
            _throttle.exception("an %s packet broke aiortc's read; dropped it", what)

    return guarded
