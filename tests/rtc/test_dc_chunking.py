"""Data-channel chunking: the offer's declaration, the answer's, and the framing both
ways, with every way a frame can break it."""

import pytest

from reactor_serve.rtc.dc_chunking import (
    ChunkedChannel,
    ChunkingError,
    Reassembler,
    with_chunking,
    frames,
    offered_limit,
)

HEAD = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
MEDIA = "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:0\r\n"


@pytest.mark.parametrize("line, limit", [
    ("a=x-reactor-dc-chunking:1 max-message-size=67108864", 67108864),
    ("a=x-reactor-dc-chunking:1", 256 * 1024),
    ("a=x-reactor-dc-chunking:1 foo=bar;max-message-size=1000", 1000),
    ("a=x-reactor-dc-chunking:1 max-message-size=1000 other=1", 1000),
    ("a=x-reactor-dc-chunking:2 max-message-size=1000", None),
    ("a=x-reactor-dc-chunking:1 max-message-size=abc", None),
    ("a=x-reactor-dc-chunking:1 max-message-size=" + "9" * 40, None),
    ("a=x-reactor-dc-chunking:1 max-message-size=0", None),
    ("a=x-reactor-dc-chunking:1 max-message-size", None),
    ("a=x-reactor-dc-chunking", None),
    ("a=something-else:1", None),
])
def test_the_offer_declares_chunking_before_its_first_media_section(line, limit):
    assert offered_limit(HEAD + line + "\r\n" + MEDIA) == limit
    # The same line inside a media section is not the session's.
    assert offered_limit(HEAD + MEDIA + line + "\r\n") is None


def test_the_answer_declares_it_before_its_first_media_section():
    answer = with_chunking(HEAD + MEDIA, 65536)
    assert answer == HEAD + "a=x-reactor-dc-chunking:1 max-message-size=65536\r\n" + MEDIA
    assert offered_limit(answer) == 65536


@pytest.mark.parametrize("message", [b"", b"x", b"y" * 65535, b"z" * 65536, bytes(range(256)) * 1000,
                                     "", "text", "ü€😀" * 30000])
def test_a_message_goes_through_frames_and_back(message):
    out = frames(message)
    assert all(len(frame) <= 64 * 1024 for frame in out)
    assert all(frame[0] & 0x01 for frame in out[:-1]) and not out[-1][0] & 0x01
    assert all(bool(frame[0] & 0x02) == isinstance(message, str) for frame in out)
    reader = Reassembler(10 * 1024 * 1024)
    results = [reader.push(frame) for frame in out]
    assert results[:-1] == [None] * (len(out) - 1)
    assert results[-1] == message and type(results[-1]) is type(message)


def test_the_official_byte_layout():
    assert frames(b"ab", frame_bytes=2) == [b"\x01a", b"\x00b"]
    assert frames("ab", frame_bytes=2) == [b"\x03a", b"\x02b"]


@pytest.mark.parametrize("bad, words", [
    ("text", "text frame"),
    (b"", "empty"),
    (b"\x04abc", "version"),
    (b"\xfcabc", "version"),
])
def test_a_frame_that_breaks_the_framing_is_refused_and_the_next_message_is_read(bad, words):
    reader = Reassembler(1000)
    assert reader.push(b"\x01par") is None
    with pytest.raises(ChunkingError, match=words):
        reader.push(bad)
    assert reader.push(b"\x00next") == b"next"


def test_a_text_flag_that_changes_inside_a_message_is_refused():
    reader = Reassembler(1000)
    assert reader.push(b"\x03ab") is None
    with pytest.raises(ChunkingError, match="TEXT flag"):
        reader.push(b"\x00cd")
    assert reader.push(b"\x02ok") == "ok"


def test_text_that_is_not_utf8_is_refused():
    with pytest.raises(ChunkingError, match="UTF-8"):
        Reassembler(1000).push(b"\x02\xff\xfe")


def test_a_message_past_the_limit_is_skipped_whole_and_the_channel_goes_on():
    reader = Reassembler(10)
    assert reader.push(b"\x01123456") is None
    assert reader.push(b"\x01789012") is None  # past 10: skipping from here
    assert reader.push(b"\x01" + b"x" * 1000) is None
    with pytest.raises(ChunkingError, match="past the limit of 10"):
        reader.push(b"\x00end")
    assert reader.dropped == 1
    assert reader.push(b"\x00fits") == b"fits"


class Channel:
    label = "data"
    readyState = "open"
    bufferedAmount = 7

    def __init__(self):
        self.sent = []

    def send(self, frame):
        self.sent.append(frame)


def test_a_chunked_channel_frames_what_it_sends_within_the_peers_limit():
    raw = Channel()
    channel = ChunkedChannel(raw, limit=100_000)
    channel.send("hello")
    channel.send(b"\x0a\x01" * 40_000)
    assert raw.sent[0] == b"\x02hello"
    assert [f[0] for f in raw.sent[1:]] == [0x01, 0x00] and sum(len(f) - 1 for f in raw.sent[1:]) == 80_000
    channel.send(b"x" * 100_001)  # past the peer's limit: not sent
    assert len(raw.sent) == 3
    assert (channel.label, channel.readyState, channel.bufferedAmount) == ("data", "open", 7)
