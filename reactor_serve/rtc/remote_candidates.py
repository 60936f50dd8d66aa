"""A client's checked ICE candidates (protocol/ice_candidates.py) as aiortc's
`RTCIceCandidate`s, for a peer connection to add, each with the ICE username fragment
of the offer it belongs to when the client said (a reconnecting client's candidates
for its new offer can arrive before that offer does)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from aiortc import RTCIceCandidate
from aiortc.sdp import candidate_from_sdp

from reactor_serve.protocol.ice_candidates import check_candidates

__all__ = ["RemoteCandidate", "ice_candidate", "ice_candidates", "offer_ufrag"]

# libwebrtc writes the fragment into the candidate line as an extension attribute.
_UFRAG_IN_LINE = re.compile(r"\bufrag (\S+)")
_UFRAG_IN_SDP = re.compile(r"^a=ice-ufrag:(\S+)", re.MULTILINE)


class RemoteCandidate(NamedTuple):
    """One trickled candidate (None: the end of them) and the ICE username fragment of
    the offer it belongs to (None: the client did not say)."""

    candidate: RTCIceCandidate | None
    ufrag: str | None


def ice_candidates(raw: Any, is_final: bool = False) -> list[RemoteCandidate]:
    """A batch of client candidates (a None candidate: the end of them), ending with
    one when `is_final`. Raises CandidateError as `check_candidates`."""
    parsed = [RemoteCandidate(ice_candidate(c), _ufrag(c)) for c in check_candidates(raw)]
    if is_final and (not parsed or parsed[-1].candidate is not None):
        parsed.append(RemoteCandidate(None, None))
    return parsed


def offer_ufrag(sdp: str) -> str | None:
    """The first ICE username fragment of an SDP (an offer's candidates carry it)."""
    found = _UFRAG_IN_SDP.search(sdp)
    return found.group(1) if found is not None else None


def _ufrag(checked: dict[str, Any]) -> str | None:
    given = checked.get("usernameFragment")
    if given:
        return str(given)
    found = _UFRAG_IN_LINE.search(checked["candidate"])
    return found.group(1) if found is not None else None


def ice_candidate(checked: dict[str, Any]) -> RTCIceCandidate | None:
    """The RTCIceCandidate of a candidate `check_candidate` returned; None for the
    end of the candidates."""
    text: str = checked["candidate"]
    if not text.strip():
        return None
    # Cannot fail after _candidate_problem; the grammar is checked there.
    candidate = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:") else text)
    candidate.sdpMid = checked["sdpMid"]
    candidate.sdpMLineIndex = checked["sdpMLineIndex"]
    if candidate.sdpMid is None and candidate.sdpMLineIndex is None:
        # aiortc needs one of them to find the m-line; a bare string means the first.
        candidate.sdpMLineIndex = 0
    return candidate
