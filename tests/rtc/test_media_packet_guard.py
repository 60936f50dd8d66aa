"""`guard_media_packets`: a packet that breaks the read is dropped and counted; the
transport's own end still ends it; nothing but the guarded transport changes."""

import asyncio
import struct

import pytest

from reactor_serve.rtc.media_packet_guard import guard_media_packets, media_packet_guard


class Transport:
    """Stands in for aiortc's RTCDtlsTransport: the two reads the guard wraps."""

    def __init__(self, fail_with=None):
        self.fail_with = fail_with
        self.read = []

    async def _handle_rtcp_data(self, data):
        self.read.append(("rtcp", data))
        if self.fail_with is not None:
            raise self.fail_with

    async def _handle_rtp_data(self, data, arrival_time_ms):
        self.read.append(("rtp", data, arrival_time_ms))
        if self.fail_with is not None:
            raise self.fail_with


def test_a_packet_that_breaks_the_read_is_dropped_and_counted():
    transport = Transport(fail_with=struct.error("unpack_from requires a buffer"))
    guard_media_packets(transport)

    async def main():
        await transport._handle_rtcp_data(b"rtcp")
        await transport._handle_rtp_data(b"rtp", arrival_time_ms=7)
        await transport._handle_rtp_data(b"rtp2", arrival_time_ms=8)

    asyncio.run(main())
    assert transport.read == [("rtcp", b"rtcp"), ("rtp", b"rtp", 7), ("rtp", b"rtp2", 8)]
    guard = media_packet_guard(transport)
    assert (guard.dropped_rtcp, guard.dropped_rtp) == (1, 2)


def test_the_transport_going_away_still_ends_its_loop():
    transport = Transport(fail_with=ConnectionError("gone"))
    guard_media_packets(transport)
    with pytest.raises(ConnectionError):
        asyncio.run(transport._handle_rtcp_data(b"x"))
    with pytest.raises(ConnectionError):
        asyncio.run(transport._handle_rtp_data(b"x", arrival_time_ms=0))
    assert media_packet_guard(transport).dropped_rtcp == 0


def test_guarding_twice_wraps_once_and_other_transports_are_untouched():
    guarded, other = Transport(), Transport()
    guard_media_packets(guarded)
    first = guarded._handle_rtcp_data
    guard_media_packets(guarded)
    guard_media_packets(None)
    assert guarded._handle_rtcp_data is first
    assert media_packet_guard(other) is None
    assert "_handle_rtcp_data" not in vars(other)
