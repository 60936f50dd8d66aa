"""Per-frame metadata: the SDP attribute and the trailer after each encoded frame."""

import struct

import pytest

from reactor_serve.rtc import frame_metadata
from reactor_serve.rtc.frame_metadata import (
    FrameStamp,
    append_trailer,
    split_trailer,
    splits_h264,
)

OFFER = "v=0\r\no=- 1 2 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n{extra}m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\n"


@pytest.mark.parametrize("extra, expected", [
    ("a=x-reactor-frame-metadata:1\r\n", True),
    ("a=x-reactor-frame-metadata:1 future=yes\r\n", True),
    ("a=x-reactor-frame-metadata:2\r\n", False),
    ("", False),
])
def test_an_offer_declares_it_at_session_level(extra, expected):
    assert frame_metadata.offered(OFFER.format(extra=extra)) is expected


def test_a_declaration_inside_a_media_section_does_not_count():
    assert not frame_metadata.offered(OFFER.format(extra="") + "a=x-reactor-frame-metadata:1\r\n")


def test_the_answer_declares_it_before_its_first_media_section():
    answer = frame_metadata.with_frame_metadata(OFFER.format(extra=""))
    assert frame_metadata.offered(answer)
    assert answer.index("a=x-reactor-frame-metadata:1\r\n") < answer.index("m=video")


@pytest.mark.parametrize("stamp", [
    FrameStamp(1),
    FrameStamp(2**64 - 1, capture_time_us=1_700_000_000_000_000, user_data=b"\x00" * 300),
    FrameStamp(42, user_data=b'{"seed":7}'),
])
def test_a_stamp_comes_back_off_its_frame(stamp):
    frame = bytes(range(256)) * 3
    stamped = append_trailer(frame, stamp)
    assert stamped.startswith(frame) and stamped.endswith(b"RXMT")
    assert split_trailer(stamped) == (frame, stamp)


def test_an_empty_stamp_still_makes_a_trailer_a_receiver_recognises():
    stamped = append_trailer(b"\x10\x20", FrameStamp())
    assert stamped == b"\x10\x20" + struct.pack("<I", 0) + b"RXMT"
    assert split_trailer(stamped) == (b"\x10\x20", FrameStamp())


@pytest.mark.parametrize("data", [
    b"",
    b"RXMT",                                     # shorter than length and mark
    b"\x9d\x01\x2a plain frame",                 # no mark
    b"abc" + struct.pack("<I", 50) + b"RXMT",    # declares more than there is
    b"abc" + struct.pack("<I", 0xFFFFFFFF) + b"RXMT",
    b"\xff\xff\xff" + struct.pack("<I", 3) + b"RXMT",  # a protobuf that does not parse
])
def test_a_frame_without_a_whole_trailer_is_left_as_it_is(data):
    assert split_trailer(data) == (data, None)


def test_an_h264_trailer_holding_a_start_code_is_found():
    frame = b"\x00\x00\x00\x01\x65\x88\x84"
    assert not splits_h264(frame, append_trailer(frame, FrameStamp(9, user_data=b"ok")))
    assert splits_h264(frame, append_trailer(frame, FrameStamp(9, user_data=b"a\x00\x00\x01b")))
    # Across the joint: a frame's last two bytes and the trailer's first.
    assert splits_h264(b"\x65\x00\x00", b"\x65\x00\x00\x01" + b"RXMT")
