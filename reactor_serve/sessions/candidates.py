"""The candidates a client trickles, kept for the peer connection that can take them.

Candidates race the offer they belong to: over HTTP a client may send them before its
offer, while it is being answered, or for a connection that a newer offer already
replaced. Each offer gets a `Connection` (by the id the backend minted for it, or one
minted here); candidates for a connection whose remote description is not set yet are
held for it, and candidates naming no connection before any offer wait for the next
offer. Every list is bounded, and only the last `keep` connections are remembered:
a client cannot grow the session's memory by trickling.

A reconnect offers again on the same connection id, and its first candidates often
arrive before that offer: a candidate whose ICE username fragment is not the applied
offer's belongs to an offer still on its way, and is held for it (the fragment tells
the offers apart; candidates of an older offer are dropped when the newer one applies).
"""

from __future__ import annotations

import collections
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCIceCandidate, RTCPeerConnection

from reactor_serve.protocol import ice_candidates
from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.rtc import remote_candidates
from reactor_serve.rtc.remote_candidates import RemoteCandidate

__all__ = ["Connection", "TrickledCandidates", "add_candidate", "parse_candidates"]

log = logging.getLogger(__name__)


@dataclass
class Connection:
    """One offer's peer connection and the candidates trickled for it."""

    id: int
    pc: RTCPeerConnection | None = None
    # Set once the offer is applied: from then on candidates go straight to `pc`
    # (also while the answer is still gathering).
    remote_set: bool = False
    # The ICE username fragment of the offer applied to `pc`, when it has one.
    ufrag: str | None = None
    pending: list[RemoteCandidate] = field(default_factory=list)


class TrickledCandidates:
    """The connections of one session's offers and the candidates waiting for them."""

    def __init__(self, max_pending: int = 256, keep: int = 8) -> None:
        self.max_pending = max_pending
        self.keep = keep
        self._connections: collections.OrderedDict[int, Connection] = collections.OrderedDict()
        self._latest: int | None = None
        # Candidates trickled for "the latest connection" before any offer.
        self._early: list[RemoteCandidate] = []
        # Connection ids minted here when the caller names none (negative: never one
        # a backend mints).
        self._local_ids = itertools.count(-1, -1)

    @property
    def latest(self) -> int | None:
        """The id of the latest offer's connection."""
        return self._latest

    def connections(self) -> list[Connection]:
        """The connections remembered, oldest first."""
        return list(self._connections.values())

    def offer(self, connection_id: int | None) -> Connection:
        """The connection a new offer is answered on (`connection_id` None: a new one),
        now the latest; candidates sent before any offer move to it."""
        cid = connection_id if connection_id is not None else next(self._local_ids)
        conn = self._connection(cid)
        # Offered again (a reconnect): until the new offer applies, candidates wait.
        conn.remote_set = False
        self._latest = cid
        if self._early:
            conn.pending[:0] = self._early
            self._early = []
        return conn

    async def remote_set(self, conn: Connection, pc: RTCPeerConnection) -> None:
        """`pc` has the offer: it takes the candidates held for `conn` that belong to
        that offer, and later ones."""
        conn.remote_set = True
        description = pc.remoteDescription
        conn.ufrag = remote_candidates.offer_ufrag(description.sdp) if description is not None else None
        pending, conn.pending = conn.pending, []
        for item in pending:
            if self._belongs(conn, item):
                await add_candidate(pc, item.candidate)

    @staticmethod
    def _belongs(conn: Connection, item: RemoteCandidate) -> bool:
        return item.ufrag is None or conn.ufrag is None or item.ufrag == conn.ufrag

    async def add(self, candidates: list[RemoteCandidate], connection_id: int | None) -> None:
        """Checked candidates for `connection_id` (None: the latest offer's, or the next
        offer's when none came yet). Raises OfferRejected past `max_pending` held."""
        cid = connection_id if connection_id is not None else self._latest
        if cid is None:
            self._hold(self._early, candidates)
            return
        conn = self._connection(cid)
        if conn.pc is None or not conn.remote_set:
            self._hold(conn.pending, candidates)
            return
        later = [item for item in candidates if not self._belongs(conn, item)]
        if later:  # for an offer on this connection that has not arrived yet
            self._hold(conn.pending, later)
        for item in candidates:
            if self._belongs(conn, item):
                await add_candidate(conn.pc, item.candidate)

    def _connection(self, cid: int) -> Connection:
        conn = self._connections.get(cid)
        if conn is None:
            conn = self._connections[cid] = Connection(cid)
            while len(self._connections) > self.keep:
                self._connections.popitem(last=False)
        return conn

    def _hold(self, target: list[Any], items: list[Any]) -> None:
        if len(target) + len(items) > self.max_pending:
            raise OfferRejected(f"too many candidates before the offer (at most {self.max_pending})")
        target.extend(items)


def parse_candidates(candidates: Any, is_final: bool = False) -> list[RemoteCandidate]:
    """A client's trickled candidates (a None candidate: the end of them).

    Checked by the same rules as the HTTP routes' (`ice_candidates`). Raises
    OfferRejected naming the first malformed one; nothing is kept then."""
    try:
        return remote_candidates.ice_candidates(candidates, is_final)
    except ice_candidates.CandidateError as exc:
        raise OfferRejected(str(exc)) from None


async def add_candidate(pc: RTCPeerConnection, candidate: RTCIceCandidate | None) -> None:
    """Give `pc` one remote candidate (None: the end of them)."""
    # A candidate the connection cannot use (closed, no such m-line) is not the
    # session's problem: log it and go on.
    if pc.connectionState == "closed":
        return
    try:
        await pc.addIceCandidate(candidate)
    except Exception as exc:
        log.warning("an ICE candidate was not usable: %r", exc)
