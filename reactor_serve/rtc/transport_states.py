"""Where a peer connection that did not come up got to, in one line for a log or an error.

A connection stuck before `connected` says little by itself: its ICE, DTLS and SCTP
states, and how many candidates each side had, tell a lost candidate (no remote ones)
from a path that does not carry (candidates on both sides, ICE still checking) from a
handshake that stalled (ICE up, DTLS not).
"""

from __future__ import annotations

from aiortc import RTCDtlsTransport, RTCPeerConnection

__all__ = ["describe_transport"]


def _dtls_of(pc: RTCPeerConnection) -> RTCDtlsTransport | None:
    # Bundled, every m-line shares the first transport; the data channel's is it.
    if pc.sctp is not None:
        return pc.sctp.transport
    for transceiver in pc.getTransceivers():
        return transceiver.receiver.transport
    return None


def describe_transport(pc: RTCPeerConnection) -> str:
    """`pc`'s connection, ICE, DTLS and SCTP states and its candidate counts."""
    parts = [f"connection {pc.connectionState}", f"ICE {pc.iceConnectionState}"]
    dtls = _dtls_of(pc)
    if dtls is not None:
        ice = dtls.transport
        parts.append(f"{len(ice.iceGatherer.getLocalCandidates())} local and "
                     f"{len(ice.getRemoteCandidates())} remote candidates")
    parts.append(f"DTLS {dtls.state if dtls is not None else 'none'}")
    parts.append(f"SCTP {pc.sctp.state if pc.sctp is not None else 'none'}")
    return ", ".join(parts)
