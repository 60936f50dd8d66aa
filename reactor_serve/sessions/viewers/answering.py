"""Answering a viewer's offer, and telling a polling viewer its answer.

A viewer's offer goes through the owner's checks and answering (offer_answering.py)
with what is particular to viewers: it receives outputs only (its `sendonly` entries,
the model's inputs, are answered inactive), its video comes from the session's shared
encoders (encoder_pool.py) in the codec its answer settled on, and its audio from the
session's fanout like the owner's (Opus is cheap). Its connection id is random, since
anyone holding the viewer token polls with it and must not guess another viewer's.
The last `KEEP_ANSWERS` connections stay pollable, answered or not.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection

from reactor_serve.protocol.errors import OfferRejected, UnknownSession
from reactor_serve.rtc.codecs import answered_codecs
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.sessions import inbound_channel
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer
from reactor_serve.sessions.inbound_silence import InboundSilence
from reactor_serve.sessions.media_tracks import OutputFanout
from reactor_serve.sessions.offer_answering import (
    CheckedOffer,
    OfferAnswerer,
    check_offer,
)
from reactor_serve.sessions.viewers.encoder_pool import EncoderPool
from reactor_serve.sessions.viewers.shared_encoder import SharedVideoTrack

__all__ = ["ViewerAnswering", "ViewerConnection"]


@dataclass
class ViewerConnection:
    """One viewer's peer connection and what hangs on it."""

    id: int
    pc: RTCPeerConnection
    # Coming up from the start: it has `connect_timeout_s` until it connects.
    silence: InboundSilence
    tracks: list[Any] = field(default_factory=list)
    channel: RTCDataChannel | None = None
    handler: inbound_channel.InboundHandler | None = None
    answer: asyncio.Task[str] | None = None
    closed: bool = False


class ViewerAnswering:
    """Answers the viewers' offers of one session. Create and use it on the media loop."""

    KEEP_ANSWERS = 16

    def __init__(
        self,
        spec: ModelSpec,
        settings: WebRTCSettings,
        fanout: OutputFanout,
        encoders: EncoderPool,
        *,
        close_timeout_s: float,
        label: str,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.fanout = fanout
        self._encoders = encoders
        self._answerer = OfferAnswerer(
            settings, close_timeout_s=close_timeout_s, receives_inputs=False,
            what="the viewer's offer", label=f"session {label}",
        )
        self._answers: collections.OrderedDict[int, ViewerConnection] = collections.OrderedDict()

    def check(self, sdp_offer: Any, track_mapping: Any) -> CheckedOffer:
        """The owner's checks: OfferRejected naming what is wrong."""
        return check_offer(sdp_offer, track_mapping, self.spec)

    def connect(self, ice_key: str) -> ViewerConnection:
        """A new viewer connection, pollable from now on."""
        cid = secrets.randbelow(900_000_000) + 100_000_000
        silence = InboundSilence(idle_timeout_s=self.settings.idle_timeout_s,
                                 connect_timeout_s=self.settings.connect_timeout_s)
        silence.coming_up()
        viewer = ViewerConnection(cid, self._answerer.connection(ice_key), silence=silence)
        self._answers[cid] = viewer
        while len(self._answers) > self.KEEP_ANSWERS:
            self._answers.popitem(last=False)
        return viewer

    async def answer(
        self,
        viewer: ViewerConnection,
        offer: CheckedOffer,
        wire: Callable[[RTCPeerConnection], None],
        is_open: Callable[[], bool],
    ) -> str:
        """Answer `offer` on `viewer`'s connection and, if the viewer and its session
        are still `is_open()` then, start its video. The caller closes the viewer
        when this raises."""

        def outgoing(kind: str, name: str) -> Any:
            track: Any = SharedVideoTrack(name) if kind == "video" else self.fanout.track(name)
            viewer.tracks.append(track)
            return track

        answer = await self._answerer.answer(viewer.pc, offer, outgoing=outgoing, wire=wire)
        if viewer.closed or not is_open():
            raise UnknownSession("the session has ended")
        codecs = answered_codecs(answer.sdp)
        for transceiver, track in answer.sent:
            if isinstance(track, SharedVideoTrack):
                codec = codecs.get(transceiver.mid or "", self.settings.codec)
                self._encoders.subscribe(track.name, codec, track)
        return answer.sdp

    def poll(self, connection_id: Any) -> SdpAnswer | AnswerPending:
        """The answer for viewer connection `connection_id`, or that it is pending."""
        viewer = self._answers.get(connection_id) if isinstance(connection_id, int) else None
        if viewer is None:
            raise UnknownSession(f"unknown viewer connection {str(connection_id)[:20]!r}")
        task = viewer.answer
        if task is None or not task.done():
            return AnswerPending({"status": "pending"})
        if task.cancelled():
            raise UnknownSession("this viewer connection has ended")
        error = task.exception()
        if error is not None:
            if isinstance(error, OfferRejected):
                raise OfferRejected(str(error))
            raise UnknownSession(f"the viewer connection failed: {error}")
        if viewer.closed:
            raise UnknownSession("this viewer connection has ended")
        return SdpAnswer(task.result(), connection_id)

    async def close(self, viewer: ViewerConnection) -> None:
        """Close the viewer's peer connection, bounded by `close_timeout_s`."""
        await self._answerer.close(viewer.pc)
