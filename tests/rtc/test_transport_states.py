"""describe_transport: the states and candidate counts of a real aiortc connection,
before negotiation and once connected."""

import asyncio

from aiortc import RTCPeerConnection

from reactor_serve.rtc.transport_states import describe_transport


def test_a_connection_with_nothing_negotiated_says_so():
    pc = RTCPeerConnection()
    try:
        assert describe_transport(pc) == "connection new, ICE new, DTLS none, SCTP none"
    finally:
        asyncio.run(pc.close())


async def test_a_connected_pair_counts_both_sides_candidates():
    offerer, answerer = RTCPeerConnection(), RTCPeerConnection()
    try:
        offerer.createDataChannel("data")
        opened = asyncio.Event()
        answerer.on("datachannel", lambda channel: opened.set())
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(offerer.localDescription)
        before = describe_transport(answerer)
        await answerer.setLocalDescription(await answerer.createAnswer())
        await offerer.setRemoteDescription(answerer.localDescription)
        await asyncio.wait_for(opened.wait(), 30)  # bounds a hang only
        assert before.startswith("connection new, ICE new, 0 local and ")
        assert before.endswith(" remote candidates, DTLS new, SCTP new")
        after = describe_transport(answerer)
        assert after.startswith("connection connected, ICE completed, ")
        assert after.endswith(" remote candidates, DTLS connected, SCTP connected")
        local, remote = (int(w) for w in after.split(", ")[2].split()[::3][:2])
        assert local >= 1 and remote >= 1
    finally:
        await offerer.close()
        await answerer.close()
