"""`SharedEncoder`: one encode per frame for every viewer, in packets that aiortc's own
packetizers send and its own decoders read back (VP8, and H264 as Annex B)."""

import asyncio

import numpy as np
import pytest
from aiortc.codecs.h264 import H264Decoder, H264Encoder, h264_depayload
from aiortc.codecs.vpx import Vp8Decoder, Vp8Encoder, vp8_depayload
from aiortc.jitterbuffer import JitterFrame

from reactor_serve.sessions.viewers.shared_encoder import (
    SharedEncoder,
    SharedVideoTrack,
)

AIORTC = {
    "vp8": (Vp8Encoder, Vp8Decoder, vp8_depayload),
    "h264": (H264Encoder, H264Decoder, h264_depayload),
}


def picture(n):
    """A frame whose left half's level says n, over a fixed pattern."""
    image = np.zeros((128, 160, 3), np.uint8)
    image[:, :80] = (n * 37) % 200 + 30
    image[:, 80:, 1] = np.arange(80, dtype=np.uint8)[None, :] * 3
    return image


class _Receiver:
    """What one viewer's browser does with the packets: aiortc's packetizer, then
    depayload and decode, as a real receiver would."""

    def __init__(self, codec):
        packer, decoder, self.depayload = AIORTC[codec]
        self.packer, self.decoder = packer(), decoder()

    def decode(self, packet):
        payloads, timestamp = self.packer.pack(packet)
        assert payloads and all(len(p) <= 1300 for p in payloads)
        data = b"".join(self.depayload(p) for p in payloads)
        frames = self.decoder.decode(JitterFrame(data=data, timestamp=timestamp))
        return [f.to_ndarray(format="rgb24") for f in frames], timestamp


async def until_idle(encoder):
    # Encoding on a loaded machine: the deadline only stops a hang.
    deadline = asyncio.get_running_loop().time() + 60
    while encoder._busy:
        assert asyncio.get_running_loop().time() < deadline, "the encoder did not finish a frame"
        await asyncio.sleep(0.005)  # the poll interval; the deadline is the bound


async def present_and_wait(encoder, image, pts):
    encoder.present(image, pts)
    await until_idle(encoder)


@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_viewers_share_one_encode_and_decode_what_was_shown(codec):
    encoder = SharedEncoder(codec, 800, keyframe_interval_s=60)
    first, second = SharedVideoTrack("main_video"), SharedVideoTrack("main_video")
    encoder.subscribe(first)
    receivers = {first: _Receiver(codec), second: _Receiver(codec)}
    shown = {}
    try:
        for n in range(12):
            if n == 5:
                encoder.subscribe(second)  # joins mid-stream: a keyframe is forced
            shown[n * 6000] = picture(n)
            await present_and_wait(encoder, shown[n * 6000], n * 6000)
        # One encode per presented frame, whatever the number of viewers.
        assert encoder.encode_calls == encoder.presented == 12
        assert encoder.keyframes == 2
        for track, count in ((first, 12), (second, 7)):
            assert track._queue.qsize() == count
            for i in range(count):
                packet = await track.recv()
                assert packet.pts == (12 - count + i) * 6000
                images, timestamp = receivers[track].decode(packet)
                # The viewer's first packet is a keyframe: every one decodes.
                assert len(images) == 1, (codec, track is first, i)
                original = shown[packet.pts]
                assert np.abs(images[0].astype(int) - original.astype(int)).mean() < 6
    finally:
        encoder.close()
    # Closing ends the viewers' tracks.
    with pytest.raises(Exception):
        await first.recv()


async def test_a_stuck_viewer_waits_for_a_keyframe_and_the_others_do_not():
    encoder = SharedEncoder("vp8", 500, keyframe_interval_s=60)
    stuck, live = SharedVideoTrack("v"), SharedVideoTrack("v")
    encoder.subscribe(stuck)
    encoder.subscribe(live)
    try:
        frames = SharedVideoTrack.MAX_QUEUED + 3
        for n in range(frames):
            await present_and_wait(encoder, picture(n), n * 3000)
            if n:
                await live.recv()
        # The stuck one overflowed: its queue was dropped and it asked for a keyframe;
        # it holds only what came from that keyframe on.
        assert stuck.resyncs == 1
        assert stuck._queue.qsize() < SharedVideoTrack.MAX_QUEUED
        # A fresh decoder reads its first packet: a keyframe.
        images, _ = _Receiver("vp8").decode(await stuck.recv())
        assert len(images) == 1
        assert encoder.encode_calls == frames and live.resyncs == 0
    finally:
        encoder.close()


async def test_frames_presented_while_it_encodes_are_skipped_not_queued():
    encoder = SharedEncoder("vp8", 500)
    track = SharedVideoTrack("v")
    encoder.subscribe(track)
    try:
        for n in range(10):
            encoder.present(picture(n), n * 3000)  # no waiting: the thread is busy
        # The loop does not yield while presenting, so the first encode cannot be
        # reported done before the last frame is presented, however fast it is.
        await until_idle(encoder)
        assert encoder.presented == 10
        assert encoder.encode_calls + encoder.superseded == 10
        assert encoder.encode_calls == 2  # the first, then only the newest
    finally:
        encoder.close()


async def test_no_viewer_no_encode():
    encoder = SharedEncoder("h264", 500)
    encoder.present(picture(0), 0)
    assert encoder.presented == 0 and encoder.encode_calls == 0 and encoder._executor is None
    with pytest.raises(ValueError, match="codec"):
        SharedEncoder("av1", 500)
