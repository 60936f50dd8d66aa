"""OutputEncode: the encoder made at the model's first picture, keyframes on schedule and on request."""

import numpy as np
import pytest

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.recording.encoding import OutputEncode
from reactor_serve.sessions.recording.settings import RecordingSettings

SECOND = 90_000


class Stereo:
    channels = 2


def presented(n, *, new=True, size=(48, 64), fps=10.0, image=None, audio=True):
    if image is None:
        image = np.full((*size, 3), n % 255, dtype=np.uint8)
    tracks = {"tone": np.zeros((2, 4800), dtype=np.int16)} if audio else {}
    return PresentedFrame(video={"main": image}, audio=tracks, pts=n * SECOND // 10,
                          audio_pts=n * 4800, slot=n / 10, is_new=new, emitted_at=None,
                          seq=n, fps=fps)


class CpuClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.002  # each reading 2 ms later
        return self.now


def make(keyframe_interval_s=1.0):
    settings = RecordingSettings(enabled=True, keyframe_interval_s=keyframe_interval_s)
    return OutputEncode(settings, "main", [TrackDecl("tone", "audio", Stereo)], cpu_clock=CpuClock())


def video_keyframes(packets):
    return [p.pts for p in packets if p.stream == 0 and p.keyframe]


def test_the_placeholder_before_the_first_picture_is_not_encoded():
    encode = make()
    assert encode.encode(presented(0, new=False, size=(480, 640))) == []
    assert encode.encoder is None
    packets = encode.encode(presented(1, size=(47, 63)))
    # Made at the model's own size (even, as H.264 wants) and rate; it starts on a keyframe.
    assert (encode.encoder.width, encode.encoder.height) == (62, 46) and encode.fps == 10.0
    assert video_keyframes(packets) == [SECOND // 10]
    assert any(p.stream == 1 for p in packets)  # the audio track, encoded too
    # From then on a repeated picture is a frame of its own.
    assert [p.stream for p in encode.encode(presented(2, new=False))].count(0) == 1
    encode.close()


def test_keyframes_come_every_interval_and_when_asked():
    encode = make(keyframe_interval_s=0.5)
    keyframes = []
    for n in range(12):
        if n == 7:
            encode.want_keyframe()
        keyframes += video_keyframes(encode.encode(presented(n)))
    assert keyframes == [0, 5 * SECOND // 10, 7 * SECOND // 10]
    encode.close()


def test_the_encoders_cpu_time_is_counted():
    encode = make()
    encode.encode(presented(0, audio=False))
    encode.encode(presented(1, audio=False))
    assert encode.encoder.cpu_s == pytest.approx(0.004)
    encode.close()


def test_a_failed_encode_drops_the_encoder_and_the_next_frame_makes_it_again():
    encode = make()
    encode.encode(presented(0))
    with pytest.raises(Exception):
        encode.encode(presented(1, image=np.zeros((48, 64, 4), dtype=np.float64)))
    assert encode.encoder is None
    packets = encode.encode(presented(2))
    assert encode.encoder is not None and video_keyframes(packets) == [2 * SECOND // 10]
    encode.close()
