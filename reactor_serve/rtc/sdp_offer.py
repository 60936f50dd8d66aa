"""A client's SDP offer, parsed before anything acts on it: the owner's and a viewer's."""

from __future__ import annotations

from typing import Any

from aiortc.sdp import SessionDescription

from reactor_serve.protocol.errors import OfferRejected

__all__ = ["parse_offer"]


def parse_offer(sdp_offer: Any) -> SessionDescription:
    """The offer's session description; OfferRejected (a 400) naming what is wrong."""
    if not isinstance(sdp_offer, str) or not sdp_offer.strip():
        raise OfferRejected("sdp_offer must be a non-empty SDP string")
    try:
        parsed = SessionDescription.parse(sdp_offer)
    except Exception as exc:
        raise OfferRejected(f"malformed SDP offer: {exc}") from None
    if not parsed.media:
        raise OfferRejected("malformed SDP offer: it has no m-lines")
    return parsed
