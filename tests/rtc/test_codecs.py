"""Codecs: which one an answer sends on each video track."""

from reactor_serve.rtc.codecs import answered_codecs


def test_answered_codecs_reads_the_first_video_codec_per_mid():
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
        "m=video 9 UDP/TLS/RTP/SAVPF 102 96\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
        "a=rtpmap:102 H264/90000\r\na=rtpmap:96 VP8/90000\r\n"
        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=rtpmap:111 opus/48000/2\r\n"
    )
    assert answered_codecs(sdp) == {"0": "h264"}
