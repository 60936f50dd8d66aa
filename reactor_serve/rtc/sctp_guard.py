"""One peer connection's SCTP transport made to survive a hostile peer: its packets
(`guard_sctp_packets`) and its data-channel frames (`guard_sctp_text_frames`). The
server's sessions and viewers call both."""

from __future__ import annotations

import logging
import struct
from typing import Any

from reactor_serve.runtime.log_throttle import LogThrottle

__all__ = ["guard_sctp_packets", "guard_sctp_text_frames", "sctp_packets_dropped"]

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


# Chunk types whose body is (or ends in) a list of TLV parameters, and where in the
# body the list starts: ABORT, ERROR, HEARTBEAT, HEARTBEAT ACK and RE-CONFIG at once,
# INIT and INIT ACK after their 16 fixed bytes (RFC 9260, RFC 6525).
_PARAMETER_LISTS = {6: 0, 9: 0, 4: 0, 5: 0, 130: 0, 1: 16, 2: 16}
_COMMON_HEADER = 12


def _malformed_parameters(packet: bytes) -> str | None:
    """What makes aiortc's parse of this SCTP packet loop, if anything.

    aiortc reads a parameter list by each parameter's length, and a length of 0 never
    moves it on: it appends for ever, on the event loop every session of the process
    shares. So every parameter of every chunk must be at least its own 4-byte header
    and within its chunk; the rest of the packet aiortc checks itself."""
    position = _COMMON_HEADER
    while position + 4 <= len(packet):
        chunk_type, _, chunk_length = struct.unpack_from("!BBH", packet, position)
        if chunk_length < 4 or position + chunk_length > len(packet):
            return None  # aiortc refuses this chunk itself (ValueError)
        start = _PARAMETER_LISTS.get(chunk_type)
        if start is not None:
            body = packet[position + 4:position + chunk_length]
            offset = start
            while offset + 4 <= len(body):
                (length,) = struct.unpack_from("!H", body, offset + 2)
                if length < 4 or offset + length > len(body):
                    return f"chunk type {chunk_type} has a parameter of length {length} at {offset}"
                offset += length + (-length % 4)
        position += chunk_length + (-chunk_length % 4)
    return None


def sctp_packets_dropped(transport: Any) -> int:
    """How many packets `guard_sctp_packets` dropped on `transport`."""
    return getattr(transport, "_reactor_packets_dropped", 0)


def guard_sctp_packets(transport: Any) -> None:
    """Make one of our peer connections' SCTP transports drop a hostile packet instead
    of hanging on it or dying of it.

    A packet whose parameter list aiortc would read for ever is dropped before aiortc
    sees it (one such packet would hang the process and exhaust its memory). Any
    exception from aiortc's handling of a packet other than the transport's own end
    (its parsers raise `struct.error` on short chunks, where they expect only
    `ValueError`) drops the packet instead of unwinding into the DTLS receive loop,
    which would close the connection. Per transport, idempotent, None ignored, as
    `guard_sctp_text_frames`; call it at the same place."""
    if transport is None or getattr(transport, "_reactor_packets_guarded", False):
        return
    original = transport._handle_data

    def drop(why: str) -> None:
        transport._reactor_packets_dropped = sctp_packets_dropped(transport) + 1
        _throttle.warning("dropped an SCTP packet: %s", why)

    async def _handle_data(data: bytes) -> None:
        malformed = _malformed_parameters(data)
        if malformed is not None:
            drop(malformed)
            return
        try:
            await original(data)
        except ConnectionError:
            raise
        except Exception as exc:
            drop(f"aiortc could not handle it ({type(exc).__name__}: {exc})")

    transport._handle_data = _handle_data
    transport._reactor_packets_guarded = True
