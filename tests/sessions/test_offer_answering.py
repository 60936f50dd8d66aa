"""One way to answer an offer, for the owner and viewers."""

import asyncio

import pytest
from aiortc import RTCPeerConnection, VideoStreamTrack

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.sessions.offer_answering import OfferAnswerer, check_offer


class Spec:
    outputs = (TrackDecl("main_video", "video", object),)
    inputs = (TrackDecl("webcam", "video", object),)


async def client_offer(*directions):
    pc = RTCPeerConnection()
    for direction in directions:
        pc.addTransceiver("video", direction=direction)
    pc.createDataChannel("data")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def test_check_offer_names_the_mapping_field():
    pc, sdp = await client_offer("recvonly")
    try:
        good = [{"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}]
        assert check_offer(sdp, good, Spec).mapping["0"].name == "main_video"
        with pytest.raises(OfferRejected, match=r"track_mapping\[0\]\.kind: mid '0' is a video m-line"):
            check_offer(sdp, [{**good[0], "name": "x", "kind": "audio"}], _Audio)
        with pytest.raises(OfferRejected, match="SDP"):
            check_offer("v=0 nonsense", good, Spec)
    finally:
        await pc.close()


class _Audio:
    outputs = (TrackDecl("x", "audio", object),)
    inputs = ()


@pytest.mark.parametrize("receives_inputs", [True, False])
async def test_inputs_are_received_only_by_an_answerer_that_receives_them(receives_inputs):
    client, sdp = await client_offer("recvonly", "sendonly", "recvonly")
    mapping = [
        {"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"},
        {"mid": "1", "name": "webcam", "kind": "video", "direction": "sendonly"},
    ]  # mid 2 is outside the mapping
    # close_timeout_s: the product's bound on closing; nothing here asserts it.
    answerer = OfferAnswerer(WebRTCSettings(loopback_candidates=True), close_timeout_s=5.0,
                             receives_inputs=receives_inputs, what="the offer", label="test")
    pc = answerer.connection("key")
    made, wired, remote = [], [], []

    def outgoing(kind, name):
        made.append((kind, name))
        return VideoStreamTrack()

    async def on_remote_set(pc):
        remote.append(pc.remoteDescription is not None)

    try:
        answer = await answerer.answer(pc, check_offer(sdp, mapping, Spec), outgoing=outgoing,
                                       wire=wired.append, on_remote_set=on_remote_set)
        assert made == [("video", "main_video")] and wired == [pc] and remote == [True]
        directions = [t.direction for t in pc.getTransceivers()]
        assert directions == ["sendonly", "recvonly" if receives_inputs else "inactive", "inactive"]
        assert [name for _, name in answer.received] == (["webcam"] if receives_inputs else [])
        assert "a=candidate" in answer.sdp
    finally:
        await answerer.close(pc)
        await client.close()


async def test_a_failed_negotiation_is_an_offer_rejected_naming_the_caller():
    client, sdp = await client_offer("recvonly")
    # close_timeout_s: the product's bound on closing; nothing here asserts it.
    answerer = OfferAnswerer(WebRTCSettings(), close_timeout_s=5.0, receives_inputs=False,
                             what="the viewer's offer", label="test")
    pc = answerer.connection("key")

    def wire(pc):
        raise RuntimeError("broken")

    try:
        with pytest.raises(OfferRejected, match="could not negotiate the viewer's offer: broken"):
            await answerer.answer(pc, check_offer(sdp, [], Spec), outgoing=None, wire=wire)
    finally:
        await answerer.close(pc)
        await client.close()


async def test_closing_is_bounded_by_the_callers_timeout(caplog):
    release = asyncio.Event()

    class StuckPc:
        async def close(self):
            await release.wait()

    # The 0.05 s is the bound under test. That close() returns at all, with the pc
    # stuck for good, is the bound; how soon is for benchmarks, so the deadline here
    # only stops a hang.
    answerer = OfferAnswerer(WebRTCSettings(), close_timeout_s=0.05, receives_inputs=False,
                             what="x", label="session s")
    try:
        await asyncio.wait_for(answerer.close(StuckPc()), 60)
    except asyncio.TimeoutError:
        raise AssertionError("close() waited for a pc that never closes") from None
    assert not release.is_set()
    assert "did not close within" in caplog.text
    release.set()
