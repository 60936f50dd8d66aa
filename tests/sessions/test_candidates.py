"""Trickled candidates find the connection that can take them, within bounds."""

import pytest

from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.rtc.remote_candidates import RemoteCandidate
from reactor_serve.sessions.candidates import TrickledCandidates, add_candidate


def c(*names, ufrag=None):
    return [RemoteCandidate(name, ufrag) for name in names]


class Description:
    def __init__(self, ufrag):
        self.sdp = f"v=0\r\na=ice-ufrag:{ufrag}\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"


class FakePc:
    def __init__(self, state="new", fail=False, ufrag=None):
        self.connectionState = state
        self.added = []
        self.fail = fail
        self.remoteDescription = Description(ufrag) if ufrag else None

    async def addIceCandidate(self, candidate):  # noqa: N802 (aiortc's name)
        if self.fail:
            raise ValueError("no such m-line")
        self.added.append(candidate)


async def test_candidates_before_any_offer_go_to_the_next_offer_first():
    book = TrickledCandidates()
    await book.add(c("early"), None)
    conn = book.offer(None)
    assert conn.id < 0 and book.latest == conn.id  # minted here: negative
    await book.add(c("late"), None)
    assert conn.pending == c("early", "late")
    pc = FakePc()
    conn.pc = pc
    await book.remote_set(conn, pc)
    assert pc.added == ["early", "late"] and conn.pending == []
    await book.add(c("after"), conn.id)
    assert pc.added[-1] == "after"


async def test_candidates_for_another_connection_wait_for_it():
    book = TrickledCandidates()
    first = book.offer(7)
    await book.add(c("for 9"), 9)
    assert first.pending == [] and book.latest == 7
    second = book.offer(9)
    assert second.pending == c("for 9")


async def test_held_candidates_are_bounded_and_a_batch_is_all_or_nothing():
    book = TrickledCandidates(max_pending=3)
    await book.add(c("a", "b"), None)
    with pytest.raises(OfferRejected, match="at most 3"):
        await book.add(c("c", "d"), None)
    conn = book.offer(1)
    assert conn.pending == c("a", "b")


def test_only_the_last_connections_are_remembered():
    book = TrickledCandidates(keep=2)
    for cid in (1, 2, 3):
        book.offer(cid)
    assert [c.id for c in book.connections()] == [2, 3]


async def test_a_closed_or_refusing_connection_does_not_raise():
    closed = FakePc("closed")
    await add_candidate(closed, "x")
    assert closed.added == []
    await add_candidate(FakePc(fail=True), "x")


async def test_a_reconnects_candidates_that_beat_its_offer_wait_for_it():
    # A client offering again on its connection id trickles the new offer's first
    # candidates before that offer arrives: the old connection must not take them.
    book = TrickledCandidates()
    conn = book.offer(1)
    old = conn.pc = FakePc(ufrag="aaaa")
    await book.remote_set(conn, old)
    await book.add(c("old host", ufrag="aaaa"), 1)
    await book.add(c("new host", ufrag="bbbb") + c("new tcp"), 1)
    assert old.added == ["old host", "new tcp"]  # no fragment: the applied offer's
    again = book.offer(1)
    assert again is conn
    await book.add(c("new srflx", ufrag="bbbb") + c("stale", ufrag="aaaa"), 1)
    assert old.added == ["old host", "new tcp"]  # offered again: everything waits
    new = conn.pc = FakePc(ufrag="bbbb")
    await book.remote_set(conn, new)
    assert new.added == ["new host", "new srflx"]  # the older offer's are dropped
    await book.add(c("later", ufrag="bbbb"), 1)
    assert new.added[-1] == "later"
