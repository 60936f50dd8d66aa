"""`guard_sctp_text_frames`: one peer connection's SCTP transport made to survive a
hostile peer's data-channel frames (the server's sessions and viewers call it)."""

from __future__ import annotations

import logging
from typing import Any

from reactor_serve.runtime.log_throttle import LogThrottle

__all__ = ["guard_sctp_text_frames"]

log = logging.getLogger("reactor_serve.rtc.sctp_guard")
_throttle = LogThrottle(log)


def guard_sctp_text_frames(transport: Any) -> None:
    """Make one of our peer connections' SCTP transports survive a hostile peer.

    aiortc decodes a text frame with strict UTF-8 before any "message" handler runs, and
    an exception there (or from any handler, or from malformed channel-open messages)
    unwinds into the DTLS receive loop, which closes the transport: one bad frame would
    end the session. Guarded, a text frame that is not UTF-8 is handed on as a str
    whose bad bytes are lone surrogates (`surrogateescape`), which protocol.decode
    rejects as "not valid UTF-8 text"; anything else raised while receiving a
    data-channel frame is logged (throttled) and the frame dropped.

    Per transport, not on aiortc's class: only the server's own sessions are changed,
    never another RTCPeerConnection in the process (a client, a test). Call it after
    setRemoteDescription (which makes the transport) and before the answer is sent
    (no frame can arrive earlier). Idempotent; None (an offer without a data channel)
    is ignored.
    """
    if transport is None or getattr(transport, "_reactor_guarded", False):
        return
    from aiortc import rtcsctptransport as sctp

    original = transport._data_channel_receive

    async def _data_channel_receive(stream_id: int, pp_id: int, data: bytes) -> None:
        try:
            if pp_id == sctp.WEBRTC_STRING and stream_id in transport._data_channels:
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    transport._data_channels[stream_id].emit(
                        "message", data.decode("utf-8", "surrogateescape")
                    )
                    return
            await original(stream_id, pp_id, data)
        except Exception:
            _throttle.exception("a data-channel frame broke aiortc's receive path; dropped it")

    transport._data_channel_receive = _data_channel_receive
    transport._reactor_guarded = True
