"""A client's checked ICE candidates (protocol/ice_candidates.py) as aiortc's
`RTCIceCandidate`s, for a peer connection to add."""

from __future__ import annotations

from typing import Any

from aiortc import RTCIceCandidate
from aiortc.sdp import candidate_from_sdp

from reactor_serve.protocol.ice_candidates import check_candidates

__all__ = ["ice_candidate", "ice_candidates"]


def ice_candidates(raw: Any, is_final: bool = False) -> list[RTCIceCandidate | None]:
    """A batch of client candidates as RTCIceCandidates (None: end of candidates),
    ending with None when `is_final`. Raises CandidateError as `check_candidates`."""
    parsed = [ice_candidate(c) for c in check_candidates(raw)]
    if is_final and (not parsed or parsed[-1] is not None):
        parsed.append(None)
    return parsed


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
