"""`StampedVideoTrack`: the owner's video with each frame's metadata after it, in
packets that aiortc's packetizers send, read back as a receiver would: depayload,
take the trailer off, decode."""

import asyncio
import datetime

import numpy as np
import pytest
from aiortc.codecs.h264 import H264Decoder, H264Encoder, h264_depayload
from aiortc.codecs.vpx import Vp8Decoder, Vp8Encoder, vp8_depayload
from aiortc.jitterbuffer import JitterFrame
from aiortc.stats import RTCRemoteInboundRtpStreamStats, RTCStatsReport

from reactor_serve.rtc.frame_metadata import split_trailer
from reactor_serve.rtc.loss_rate_control import LossRateControl
from reactor_serve.sessions.stamped_video import StampedVideoTrack

AIORTC = {
    "vp8": (Vp8Encoder, Vp8Decoder, vp8_depayload),
    "h264": (H264Encoder, H264Decoder, h264_depayload),
}


def picture(level):
    image = np.zeros((96, 128, 3), np.uint8)
    image[:, :64] = level
    image[:, 64:, 2] = 200
    return image


class Receiver:
    def __init__(self, codec):
        packer, decoder, self.depayload = AIORTC[codec]
        self.packer, self.decoder = packer(), decoder()

    def receive(self, packet):
        payloads, timestamp = self.packer.pack(packet)
        frame, stamp = split_trailer(b"".join(self.depayload(p) for p in payloads))
        pictures = self.decoder.decode(JitterFrame(data=frame, timestamp=timestamp))
        return [p.to_ndarray(format="rgb24") for p in pictures], stamp


# Encoding on a loaded machine: only a bound for a test that would otherwise hang.
WAIT_S = 60.0


async def sent(track, image, pts, metadata):
    track.offer(image, pts, None, metadata)
    try:
        return await asyncio.wait_for(track.recv(), WAIT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"the frame offered at pts {pts} was not sent") from None


@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_each_frame_reaches_the_receiver_with_its_id_and_metadata(codec):
    track = StampedVideoTrack("main_video")
    track.offer(picture(10), 0, None, b"before start")  # no codec yet: dropped
    track.start(codec, 800, fps_hint=30, keyframe_interval_s=60)
    receiver = Receiver(codec)
    try:
        tags = [b'{"n":0}', None, b"\xff\x00binary", b'{"n":3}']
        for n, tag in enumerate(tags):
            pictures, stamp = receiver.receive(await sent(track, picture(40 + 40 * n), 3000 * n, tag))
            assert stamp is not None and stamp.frame_id == n + 1 and stamp.user_data == tag
            assert stamp.capture_time_us is None  # made, not captured
            assert len(pictures) == 1
            assert abs(float(pictures[0][:, :64].mean()) - (40 + 40 * n)) < 8
    finally:
        track.stop()
    assert track.encoder is None or track.encoder.subscribers == 0


async def test_h264_metadata_holding_a_start_code_leaves_only_the_frame_id():
    track = StampedVideoTrack("main_video")
    track.start("h264", 800, fps_hint=30, keyframe_interval_s=60)
    receiver = Receiver("h264")
    try:
        pictures, stamp = receiver.receive(await sent(track, picture(90), 0, b"a\x00\x00\x01b"))
        assert stamp is not None and stamp.frame_id == 1 and stamp.user_data is None
        assert track.unstampable == 1 and len(pictures) == 1
        pictures, stamp = receiver.receive(await sent(track, picture(90), 3000, b"fine"))
        assert stamp.user_data == b"fine"
    finally:
        track.stop()


async def test_a_paused_track_sends_nothing_and_resumes_at_a_keyframe():
    track = StampedVideoTrack("main_video")
    track.start("vp8", 800, fps_hint=30, keyframe_interval_s=60)
    try:
        await sent(track, picture(50), 0, None)
        await sent(track, picture(60), 3000, None)
        track.pause()
        track.offer(picture(70), 6000, None, b"unseen")
        # A negative check: a slow machine only encodes less meanwhile.
        await asyncio.sleep(0.3)
        assert track._queue.empty()
        track.resume()
        packet = await sent(track, picture(80), 9000, b"back")
        # A fresh decoder reads it: it is a keyframe.
        pictures, stamp = Receiver("vp8").receive(packet)
        assert len(pictures) == 1 and stamp.user_data == b"back" and stamp.frame_id == 3
    finally:
        track.stop()


class ReportingSender:
    """A sender whose receiver reports say what `losses` lists, one per report."""

    def __init__(self, losses, observe=None):
        self.losses = list(losses)
        self.report = None
        self.observe = observe

    async def getStats(self):
        if self.observe is not None:
            self.observe()  # what the last report made of the rate, before the next one
        if self.losses:
            self.report = RTCRemoteInboundRtpStreamStats(
                timestamp=datetime.datetime.now(), type="remote-inbound-rtp", id="r", ssrc=1,
                kind="video", transportId="t", packetsReceived=100, packetsLost=0, jitter=0,
                roundTripTime=0.01, fractionLost=self.losses.pop(0))
        return RTCStatsReport({"r": self.report} if self.report else {})


async def test_the_encoders_bitrate_follows_the_loss_the_receiver_reports():
    track = StampedVideoTrack("main_video")
    track.start("vp8", 1000, fps_hint=30, keyframe_interval_s=60)
    rates = []

    def observe():
        if not rates or rates[-1] != track.encoder.bitrate:
            rates.append(track.encoder.bitrate)

    # Every rate is read when the next report is asked for, so none is missed
    # however the loop is scheduled; the poll below only waits for the end.
    sender = ReportingSender([0.0, 0.0] + [0.5] * 8, observe)
    following = asyncio.create_task(
        track.follow_loss(sender, LossRateControl(1_000_000, 300_000, 1_200_000), every_s=0.02))
    try:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while sender.losses or track.encoder.bitrate != 300_000:
            assert asyncio.get_running_loop().time() < deadline, (
                f"the rate did not settle at the floor after the reported losses: {rates}")
            await asyncio.sleep(0.01)  # the poll interval; the deadline is the bound
        observe()
        assert rates[0] == 1_000_000 and max(rates) > 1_000_000 and rates[-1] == 300_000
        # The encoder starts afresh at the new rate: the next packet is a keyframe.
        packet = await sent(track, picture(40), 0, None)
        assert len(Receiver("vp8").receive(packet)[0]) == 1
    finally:
        following.cancel()
        track.stop()
