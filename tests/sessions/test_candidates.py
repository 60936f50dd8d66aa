"""Trickled candidates find the connection that can take them, within bounds."""

import pytest

from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.sessions.candidates import TrickledCandidates, add_candidate


class FakePc:
    def __init__(self, state="new", fail=False):
        self.connectionState = state
        self.added = []
        self.fail = fail

    async def addIceCandidate(self, candidate):  # noqa: N802 (aiortc's name)
        if self.fail:
            raise ValueError("no such m-line")
        self.added.append(candidate)


async def test_candidates_before_any_offer_go_to_the_next_offer_first():
    book = TrickledCandidates()
    await book.add(["early"], None)
    conn = book.offer(None)
    assert conn.id < 0 and book.latest == conn.id  # minted here: negative
    await book.add(["late"], None)
    assert conn.pending == ["early", "late"]
    pc = FakePc()
    conn.pc = pc
    await book.remote_set(conn, pc)
    assert pc.added == ["early", "late"] and conn.pending == []
    await book.add(["after"], conn.id)
    assert pc.added[-1] == "after"


async def test_candidates_for_another_connection_wait_for_it():
    book = TrickledCandidates()
    first = book.offer(7)
    await book.add(["for 9"], 9)
    assert first.pending == [] and book.latest == 7
    second = book.offer(9)
    assert second.pending == ["for 9"]


async def test_held_candidates_are_bounded_and_a_batch_is_all_or_nothing():
    book = TrickledCandidates(max_pending=3)
    await book.add(["a", "b"], None)
    with pytest.raises(OfferRejected, match="at most 3"):
        await book.add(["c", "d"], None)
    conn = book.offer(1)
    assert conn.pending == ["a", "b"]


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
