"""What `ClientPeer` keeps of the messages it takes in, without a connection: the
server's `sessionEnded` (which the owner's reconnect supervisor and the viewer both
read), the latest `stats`, and waking whoever waits for a message; and a connect
whose session ends before its channel opens."""

import asyncio

from aiortc import RTCPeerConnection, RTCSessionDescription

from reactor_serve.client.peer import ClientPeer


def runtime(type_, data):
    return {"scope": "runtime", "data": {"type": type_, "data": data}}


async def test_the_first_session_ended_is_kept_and_later_ones_do_not_replace_it():
    peer = ClientPeer({"tracks": []})
    assert peer.session_end is None
    peer.add_message({"scope": "application", "data": {"type": "sessionEnded", "data": {}}})
    assert peer.session_end is None  # a model message of that name is not the session's end
    peer.add_message(runtime("sessionEnded", {"reason": "timeout", "message": "idle"}))
    peer.add_message(runtime("sessionEnded", {"reason": "error", "detected_by": "client"}))
    assert peer.session_end == {"reason": "timeout", "message": "idle"}
    assert len(peer.messages) == 3


async def test_stats_are_kept_and_mark_the_server_as_one_that_sends_them():
    peer = ClientPeer({"tracks": []})
    assert not peer.stats_seen
    peer.add_message(runtime("stats", {"viewers": 2}))
    assert peer.stats_seen and peer.stats == {"viewers": 2}


async def test_a_message_taken_in_wakes_a_waiter():
    peer = ClientPeer({"tracks": []})
    # The timeout only stops a hang; the message is taken in at once below.
    waiting = asyncio.ensure_future(peer.next_message("sessionEnded", scope="runtime", timeout=30))
    await asyncio.sleep(0)  # a loop turn, not wall time: the waiter starts waiting
    peer.add_message(runtime("sessionEnded", {"reason": "client_closed"}))
    assert (await waiting)["data"] == {"reason": "client_closed"}


async def _answer_then_leave(server, sdp_offer):
    """`server`'s real answer to `sdp_offer`; `server` is closed before it is returned."""
    await server.setRemoteDescription(RTCSessionDescription(sdp=sdp_offer, type="offer"))
    await server.setLocalDescription(await server.createAnswer())
    answer = server.localDescription.sdp
    await server.close()
    return answer


async def test_a_session_that_ends_before_its_channel_opens_ends_the_connect_at_once():
    server = RTCPeerConnection()
    peer = ClientPeer({"tracks": []})

    async def signal(sdp_offer, track_mapping):
        # A real answer from a peer that then goes away: the channel never opens.
        return await _answer_then_leave(server, sdp_offer)

    asked = []

    async def still_on():
        asked.append(1)
        if len(asked) == 2:
            raise LookupError("the session ended")

    peer.STILL_ON_INTERVAL_S = 0.05  # the product's poll interval, made short
    # That the attempt ended on still_on()'s error, and not on connect()'s own
    # timeout, is told by the error itself (a timeout raises TimeoutError), not by
    # how soon it came: speed is for benchmarks.
    try:
        await peer.connect(signal, timeout=60, still_on=still_on)
    except LookupError as exc:
        assert str(exc) == "the session ended"
    else:
        raise AssertionError("connect() returned on a channel that never opened")
    finally:
        await peer.close()
    assert asked == [1, 1]  # asked until it raised, and not once more


async def _refused_answer(server, sdp_offer):
    """A real answer with no candidate in it, from a peer that then goes away: the
    client's ICE has no pair to check, so it fails at once, and nothing else can
    reach the client either."""
    lines = [line for line in (await _answer_then_leave(server, sdp_offer)).splitlines()
             if not line.startswith("a=candidate:")]
    return "\r\n".join(lines) + "\r\n"


async def test_a_connection_that_fails_before_its_channel_opens_ends_the_connect_with_its_states():
    server = RTCPeerConnection()
    peer = ClientPeer({"tracks": []})

    async def signal(sdp_offer, track_mapping):
        return await _refused_answer(server, sdp_offer)

    # The error names the failure (a timeout would raise TimeoutError): the 60 s is a
    # hang guard only.
    try:
        await peer.connect(signal, timeout=60)
    except ConnectionError as exc:
        message = str(exc)
    else:
        raise AssertionError("connect() returned on a connection that failed")
    finally:
        await peer.close()
    assert message.startswith("the connection failed before its data channel opened (")
    assert "ICE failed" in message and "DTLS" in message and "SCTP" in message


async def test_a_channel_still_shut_at_the_timeout_names_how_far_the_connection_got():
    server = RTCPeerConnection()
    peer = ClientPeer({"tracks": []})

    async def signal(sdp_offer, track_mapping):
        # Answered, and then nothing: the server never checks or answers a check.
        return await _answer_then_leave(server, sdp_offer)

    # The timeout is the behaviour under test: far shorter than ICE takes to give up.
    try:
        await peer.connect(signal, timeout=0.5)
    except TimeoutError as exc:
        message = str(exc)
    else:
        raise AssertionError("connect() returned on a channel that never opened")
    finally:
        await peer.close()
    assert message.startswith("the data channel did not open within 0.5 s of the answer (")
    assert "connection connecting" in message and "SCTP" in message
