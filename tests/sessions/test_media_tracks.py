"""The output tracks a session sends: what a paused track sends (nothing) and what it
sends again once resumed."""

import asyncio

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError
from waits import within_deadline

from reactor_serve.sessions.media_tracks import PacedAudioTrack, PacedVideoTrack

IMAGE = np.zeros((4, 6, 3), np.uint8)


async def test_a_paused_video_track_sends_nothing_until_resumed():
    track = PacedVideoTrack("main_video")
    track.offer(IMAGE, 0)
    assert (await track.recv()).pts == 0
    track.pause()
    track.offer(IMAGE, 3000)
    track.offer(IMAGE, 6000)
    pending = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0.05)  # a negative check: a slow machine only sends less meanwhile
    assert not pending.done()
    track.resume()
    track.offer(IMAGE + 1, 9000)
    frame = await within_deadline(pending, "the frame offered after the resume")
    # The frames presented while paused are gone; the next one presented goes.
    assert frame.pts == 9000 and frame.to_ndarray(format="rgb24").max() == 1
    assert track.superseded == 0


async def test_a_paused_audio_track_sends_not_even_silence_and_drops_what_was_made():
    track = PacedAudioTrack("speech")
    track.offer(np.full((1, 960), 100, np.int16))
    first = await track.recv()
    assert first.to_ndarray().max() == 100
    track.offer(np.full((1, 960), 200, np.int16))
    track.pause()
    assert track.paused
    track.offer(np.full((1, 960), 300, np.int16))  # made while paused: dropped
    pending = asyncio.ensure_future(track.recv())
    # Five frames' worth, a negative check: a slow machine only sends less meanwhile.
    await asyncio.sleep(0.1)
    assert not pending.done()
    track.resume()
    frame = await within_deadline(pending, "the first audio frame after the resume")
    assert frame.to_ndarray().max() == 0  # silence: nothing queued from before
    assert frame.pts == first.pts + 960  # the timeline goes on without a hole
    track.offer(np.full((1, 960), 400, np.int16))
    again = await within_deadline(track.recv(), "the audio frame offered after the resume")
    assert again.to_ndarray().max() == 400


@pytest.mark.parametrize("track", [PacedVideoTrack("main_video"), PacedAudioTrack("speech")],
                         ids=["video", "audio"])
async def test_stopping_a_paused_track_ends_its_recv(track):
    track.pause()
    pending = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0.01)  # a negative check: a slow machine only sends less meanwhile
    assert not pending.done()
    track.stop()
    with pytest.raises(MediaStreamError):
        await within_deadline(pending, "recv() to end after stop()")
