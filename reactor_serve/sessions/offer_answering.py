"""Answering a client's offer on a fresh peer connection: the owner's and a viewer's.

Both answer the same way. The offer is checked before anything is built (the SDP
parses; `track_mapping` passes the one rule of protocol/track_mapping.py against the
model's tracks and the offer's m-lines). Then each audio and video m-line gets a
transceiver: a mapped `recvonly` line (the client receives) is answered `sendonly`
with the track the caller supplies for that output, video preferring the configured
codec; a mapped `sendonly` line is answered `recvonly` into the model's input when
the caller receives inputs (the owner), inactive when it does not (a viewer sends
nothing); lines outside the mapping are inactive. The SCTP transport is guarded
against hostile text frames, host candidates are restricted as configured, and the
answer carries every candidate inline.

What differs stays with the caller: the key its TURN credentials are minted for, the
tracks it sends, how it wires the connection's events, what happens once the offer is
applied (the owner's held candidates), and how long closing a connection may take.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpTransceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from aiortc.sdp import SessionDescription

from reactor_serve.protocol.errors import BackendError, OfferRejected
from reactor_serve.protocol.track_mapping import (
    TrackMapping,
    TrackMappingError,
    bind_track_mapping,
    check_offer_kinds,
    parse_track_mapping,
)
from reactor_serve.rtc.codecs import prefer_codec
from reactor_serve.rtc.host_candidates import HostCandidatePolicy
from reactor_serve.rtc.ice_servers import rtc_configuration, session_ice_servers
from reactor_serve.rtc.media_packet_guard import guard_media_packets
from reactor_serve.rtc.sctp_guard import guard_sctp_packets, guard_sctp_text_frames
from reactor_serve.rtc.sdp_offer import parse_offer
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime.loading.model_spec import ModelSpec

__all__ = ["Answer", "CheckedOffer", "OfferAnswerer", "check_offer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedOffer:
    """An offer whose SDP and track mapping passed every check that needs no model
    session; `mapping` is mid -> entry."""

    sdp: str
    description: SessionDescription
    mapping: dict[str, TrackMapping]


def check_offer(sdp_offer: Any, track_mapping: Any, spec: ModelSpec) -> CheckedOffer:
    """Raise OfferRejected naming what is wrong with the offer or its mapping."""
    description = parse_offer(sdp_offer)
    try:
        mapping = bind_track_mapping(
            parse_track_mapping(track_mapping),
            outputs={t.name: t.kind for t in spec.outputs},
            inputs={t.name: t.kind for t in spec.inputs},
        )
        check_offer_kinds(mapping, ((m.rtp.muxId, m.kind) for m in description.media))
    except TrackMappingError as exc:
        raise OfferRejected(str(exc)) from None
    return CheckedOffer(sdp_offer, description, mapping)


@dataclass
class Answer:
    """An answered offer: the SDP, what we send on it and what we receive."""

    sdp: str
    sent: list[tuple[RTCRtpTransceiver, MediaStreamTrack]] = field(default_factory=list)
    # (transceiver, the model input's name)
    received: list[tuple[RTCRtpTransceiver, str]] = field(default_factory=list)


class OfferAnswerer:
    """Answers one kind of client's offers (`what` names it in errors)."""

    def __init__(
        self,
        settings: WebRTCSettings,
        *,
        close_timeout_s: float,
        receives_inputs: bool,
        what: str,
        label: str,
    ) -> None:
        self.settings = settings
        self.close_timeout_s = close_timeout_s
        self.receives_inputs = receives_inputs
        self.what = what
        self.label = label
        # Loopback only, a port range, an announced address: per peer connection.
        self._host_candidates = HostCandidatePolicy.from_settings(settings)
        # Closes still running past their timeout: referenced until done.
        self._closing: set[asyncio.Task[None]] = set()

    def connection(self, ice_key: str) -> RTCPeerConnection:
        """A new peer connection; TURN credentials minted from a secret are fresh for
        each and bound to `ice_key`."""
        return RTCPeerConnection(rtc_configuration(
            session_ice_servers(self.settings.ice_servers, ice_key),
            self.settings.ice_transport_policy,
        ))

    async def answer(
        self,
        pc: RTCPeerConnection,
        offer: CheckedOffer,
        *,
        outgoing: Callable[[str, str], MediaStreamTrack],
        wire: Callable[[RTCPeerConnection], None],
        on_remote_set: Callable[[RTCPeerConnection], Awaitable[None]] | None = None,
    ) -> Answer:
        """Answer `offer` on `pc`. `outgoing(kind, name)` makes the track to send for a
        model output (the caller keeps it, to release it on failure too); `wire(pc)`
        attaches the caller's event handlers before the offer is applied.

        Raises OfferRejected when aiortc cannot negotiate the offer; errors of the
        session (BackendError) and cancellation pass through. `pc` is left to the
        caller to close either way."""
        result = Answer("")
        try:
            for media in offer.description.media:
                if media.kind not in ("audio", "video"):
                    continue
                entry = offer.mapping.get(media.rtp.muxId)
                if entry is None or (entry.direction == "sendonly" and not self.receives_inputs):
                    pc.addTransceiver(media.kind, direction="inactive")
                elif entry.direction == "recvonly":
                    track = outgoing(media.kind, entry.name)
                    transceiver = pc.addTransceiver(track, direction="sendonly")
                    if media.kind == "video":
                        prefer_codec(transceiver, self.settings.codec)
                    result.sent.append((transceiver, track))
                else:
                    transceiver = pc.addTransceiver(media.kind, direction="recvonly")
                    result.received.append((transceiver, entry.name))
            wire(pc)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer.sdp, type="offer"))
            guard_sctp_text_frames(pc.sctp)
            guard_sctp_packets(pc.sctp)
            for transport in _dtls_transports(pc):
                guard_media_packets(transport)
            if on_remote_set is not None:
                await on_remote_set(pc)
            if self._host_candidates is not None:
                # Now that the offer's bundling left one transport per group, and
                # before setLocalDescription gathers.
                self._host_candidates.apply(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except BackendError:
            raise
        except Exception as exc:
            raise OfferRejected(f"could not negotiate {self.what}: {exc}") from exc
        result.sdp = pc.localDescription.sdp
        return result

    async def close(self, pc: RTCPeerConnection) -> None:
        """Close `pc`, waiting at most `close_timeout_s` (the close goes on past it)."""
        closing = asyncio.get_running_loop().create_task(pc.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        done, _ = await asyncio.wait({closing}, timeout=self.close_timeout_s)
        if not done:
            log.warning("%s: a peer connection did not close within %.0f s",
                        self.label, self.close_timeout_s)
        elif not closing.cancelled() and closing.exception() is not None:
            log.warning("%s: closing a peer connection failed: %r", self.label, closing.exception())


def _dtls_transports(pc: RTCPeerConnection) -> list[Any]:
    """Each DTLS transport of `pc` once (bundled media and SCTP share one)."""
    transports: dict[int, Any] = {}
    for transceiver in pc.getTransceivers():
        for transport in (transceiver.sender.transport, transceiver.receiver.transport):
            if transport is not None:
                transports[id(transport)] = transport
    if pc.sctp is not None:
        transports[id(pc.sctp.transport)] = pc.sctp.transport
    return list(transports.values())
