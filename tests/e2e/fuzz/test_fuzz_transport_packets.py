"""Hostile RTP, RTCP and SCTP packets on a live session, over a real aiortc connection
on 127.0.0.1.

The client is a `ClientPeer` sending a camera to the reference `v2v` model, so the
server both receives media (RTP from the client) and sends it (RTCP from the client
about it). Crafted packets go through the client's own SRTP, as a hostile peer's
would. After every case: the session is the first and only one, its connection is up,
the camera still comes back transformed and video still arrives. Without the guard
(rtc/media_packet_guard.py), a REMB whose SSRC count runs past its bytes or a one-byte
abs-send-time extension closes the server's DTLS transport and ends the session; without
the SCTP packet guard (rtc/sctp_guard.py), a parameter of length 0 hangs the process
that holds the session, and a short INIT chunk ends the session.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from aiortc.rtp import (
    RTCP_PSFB,
    RTCP_PSFB_APP,
    RTCP_PSFB_PLI,
    RTCP_RR,
    RTCP_RTPFB,
    RTCP_RTPFB_NACK,
    pack_rtcp_packet,
)
from aiortc.rtcsctptransport import crc32c
from aiortc.sdp import SessionDescription
from paths import TEST_MODELS

from reactor_serve.client.peer import ClientPeer
from reactor_serve.protocol import model_documents
from reactor_serve.rtc.media_packet_guard import media_packet_guard
from reactor_serve.rtc.sctp_guard import sctp_packets_dropped
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.sessions.peer_session import PeerSession

WAIT_S = 60.0
V2V = TEST_MODELS / "reference" / "v2v"


def _rtcp(packet_type: int, fmt: int, payload: bytes) -> bytes:
    return pack_rtcp_packet(packet_type, fmt, payload + bytes(-len(payload) % 4))


def _rtp(payload_type: int, sequence: int, ssrc: int, extensions: bytes = b"", payload: bytes = b"\0" * 20) -> bytes:
    first = 0x90 if extensions else 0x80
    header = struct.pack("!BBHLL", first, payload_type, sequence, 0, ssrc)
    if extensions:
        extensions += bytes(-len(extensions) % 4)
        header += struct.pack("!HH", 0xBEDE, len(extensions) // 4) + extensions
    return header + payload


def _one_byte_extension(extension_id: int, value: bytes) -> bytes:
    return bytes([(extension_id << 4) | (len(value) - 1)]) + value


def rtcp_cases(media_ssrc: int) -> list[tuple[str, list[bytes]]]:
    rng = random.Random(32)
    sender = struct.pack("!LL", 0x1111, media_ssrc)
    return [
        ("REMB whose SSRC count runs past its bytes",
         [_rtcp(RTCP_PSFB, RTCP_PSFB_APP, struct.pack("!LL", 0x1111, 0) + b"REMB" + bytes([200, 0, 0, 1]))]),
        ("REMB asking for 2^63 bps",
         [_rtcp(RTCP_PSFB, RTCP_PSFB_APP, struct.pack("!LL", 0x1111, 0) + b"REMB"
                + bytes([1, 0xFF, 0xFF, 0xFF]) + struct.pack("!L", media_ssrc))]),
        ("receiver report shorter than its count",
         [_rtcp(RTCP_RR, 3, struct.pack("!L", 0x1111) + bytes(10))]),
        ("transport-wide feedback of random bytes",
         [_rtcp(RTCP_RTPFB, 15, sender + rng.randbytes(4 * rng.randrange(1, 20))) for _ in range(20)]),
        ("NACK storm for sequence numbers never sent",
         [_rtcp(RTCP_RTPFB, RTCP_RTPFB_NACK, sender + struct.pack("!HH", rng.randrange(65536), 0xFFFF) * 50)
          for _ in range(20)]),
        ("picture-loss flood", [_rtcp(RTCP_PSFB, RTCP_PSFB_PLI, sender) for _ in range(200)]),
        ("unknown packet types and formats",
         [_rtcp(pt, fmt, sender + rng.randbytes(8)) for pt in (192, 195, 204, 207, 208) for fmt in (0, 7, 31)]),
    ]


def rtp_cases(payload_type: int, abs_send_time: int, mid: int) -> list[tuple[str, list[bytes]]]:
    """Each case from an SSRC of its own: the client's SRTP refuses to send a sequence
    number its camera's stream already used. The camera's payload type routes them to
    the camera's receiver all the same."""
    rng = random.Random(33)
    return [
        ("abs-send-time extension of one byte",
         [_rtp(payload_type, 100, 0xA1, _one_byte_extension(abs_send_time, b"\x42"))]),
        ("mid extension that is not UTF-8",
         [_rtp(payload_type, 100, 0xA2, _one_byte_extension(mid, b"\xff\xfe"))]),
        ("extension block whose value runs past it",
         [_rtp(payload_type, 100, 0xA3, bytes([(abs_send_time << 4) | 15]) + b"\x01\x02\x03")]),
        ("random payloads on the camera's payload type",
         [_rtp(payload_type, 100 + k, 0xA4, payload=rng.randbytes(rng.randrange(1, 1200))) for k in range(50)]),
        ("payload types nobody negotiated",
         [_rtp(rng.randrange(96, 128), 100 + k, 0xA5) for k in range(20)]),
    ]


def _sctp(*chunks: tuple[int, bytes], tag: int = 0) -> bytes:
    """An SCTP packet with a correct checksum, so that the parse goes past it."""
    body = b"".join(
        struct.pack("!BBH", chunk_type, 0, 4 + len(value)) + value + bytes(-len(value) % 4)
        for chunk_type, value in chunks
    )
    header = struct.pack("!HHL", 5000, 5000, tag)
    return header + struct.pack("<L", crc32c(header + b"\0\0\0\0" + body)) + body


def sctp_cases() -> list[tuple[str, list[bytes]]]:
    zero_length = struct.pack("!HH", 1, 0) + bytes(4)
    return [
        ("ABORT whose cause has length 0", [_sctp((6, zero_length))]),
        ("HEARTBEAT whose parameter has length 0", [_sctp((4, zero_length))]),
        ("INIT whose parameter after its fixed fields has length 0",
         [_sctp((1, bytes(16) + zero_length))]),
        ("RE-CONFIG whose parameter runs past its chunk", [_sctp((130, struct.pack("!HH", 13, 200)))]),
        ("INIT shorter than its fixed fields", [_sctp((1, bytes(4)))]),
        ("SACK shorter than its fixed fields", [_sctp((3, bytes(4)))]),
    ]


@pytest.fixture
async def live(host_of):
    host = host_of(V2V)
    peer = PeerSession(host, WebRTCSettings(loopback_candidates=True))
    camera = np.zeros((96, 128, 3), np.uint8)
    camera[:, :64] = 200
    client = ClientPeer(model_documents.capabilities(host.spec), inputs={"camera": camera})
    await client.connect(peer.answer, timeout=WAIT_S)
    client.send_command("set_style", {"style": "sketch"})  # the model inverts the camera
    await _camera_comes_back(client)
    yield host, peer, client
    await client.close()
    await peer.close()


async def _camera_comes_back(client: ClientPeer) -> None:
    start = len(client.video.get("main_video", ()))
    await client.wait_for(
        lambda: any(f.image.shape == (96, 128, 3) and f.image[:, 100:].mean() > 200
                    for f in list(client.video.get("main_video", ()))[start:]),
        WAIT_S, "camera frame that came back inverted",
    )


async def _still_alive(host, peer: PeerSession, client: ClientPeer) -> None:
    await _camera_comes_back(client)
    assert not peer.ended.is_set()
    assert peer.connections == 1  # not a reconnect that hid a lost transport
    assert client.pc.connectionState == "connected"
    assert host.model_errors == 0


async def _fire(live, cases, send, after_each=None) -> None:
    """Send each case's packets with `send`, then check the session is still whole,
    naming the case that broke it."""
    host, peer, client = live
    for name, packets in cases:
        for packet in packets:
            await send(packet)
        try:
            await _still_alive(host, peer, client)
        except (AssertionError, TimeoutError) as exc:
            raise AssertionError(f"after {name!r}: {exc}") from exc
        if after_each is not None:
            after_each()


def _client_transport(client: ClientPeer):
    return client.pc.getTransceivers()[0].sender.transport


def _server_transport(peer: PeerSession):
    return peer._pc.getTransceivers()[0].sender.transport


async def test_hostile_rtcp_is_dropped_and_the_session_goes_on(live):
    host, peer, client = live
    server_video_ssrc = next(t.sender._ssrc for t in peer._pc.getTransceivers() if t.sender.track is not None)
    await _fire(live, rtcp_cases(server_video_ssrc), _client_transport(client)._send_rtp)
    # The first case is one aiortc cannot read without raising: dropped and counted.
    assert media_packet_guard(_server_transport(peer)).dropped_rtcp >= 1


async def test_hostile_rtp_is_dropped_and_the_session_goes_on(live):
    host, peer, client = live
    offer = SessionDescription.parse(client.pc.localDescription.sdp)
    video = next(m for m in offer.media if m.kind == "video" and m.direction == "sendonly")
    ids = {x.uri: x.id for x in video.rtp.headerExtensions}
    payload_type = video.rtp.codecs[0].payloadType
    cases = rtp_cases(
        payload_type,
        ids["http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"],
        ids["urn:ietf:params:rtp-hdrext:sdes:mid"],
    )
    await _fire(live, cases, _client_transport(client)._send_rtp)
    assert media_packet_guard(_server_transport(peer)).dropped_rtp >= 1


async def test_hostile_sctp_packets_are_dropped_and_the_session_goes_on(live):
    host, peer, client = live

    def commands() -> None:
        # The data channel still carries commands both ways.
        client.send_command("set_style", {"style": "none"})
        client.send_command("set_style", {"style": "sketch"})

    # DTLS application data: the peer's SCTP.
    await _fire(live, sctp_cases(), _client_transport(client)._send_data, commands)
    assert sctp_packets_dropped(peer._pc.sctp) == len(sctp_cases())
