"""`ViewerRoom`: the watch-only viewers of one session.

The session's owner asks for a viewer link; its token (random, unguessable, not the
session id) lets anyone holding it watch, and nothing else. Each viewer offers its own
peer connection, answered by answering.py:

- Output tracks only: a `recvonly` m-line mapped to a model output is answered
  `sendonly`; everything else (the model's input tracks included) is inactive. The
  mapping is checked by the owner's rule (protocol/track_mapping.py).
- Video comes from a `SharedEncoder` per output track and codec (encoder_pool.py):
  one encode per frame whatever the number of viewers. Audio comes from the session's
  `OutputFanout` like the owner's (Opus is cheap).
- The data channel carries the session's model messages, `stats` and `sessionEnded`
  to viewers. Every command a viewer sends is answered with a `commandError` ("viewers
  cannot send commands") and never reaches the model.
- A viewer leaving (its connection closed or failed, or silent for `idle_timeout_s`)
  changes nothing for the session; the session ending ends every viewer with
  `sessionEnded`; the owner reconnecting does not touch them (they live on the
  session's fanout, not on the owner's connection). While the owner is away
  (orphaned), the output is paused for everyone.
- At most `max_viewers` viewers (answered and being answered) per session.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from aiortc import RTCDataChannel

from reactor_serve.protocol import channel_codec
from reactor_serve.protocol.errors import UnknownSession, ViewerLimitReached
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime.field_errors import command_error
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.sessions import farewell, inbound_channel
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer, mask_session_id
from reactor_serve.sessions.inbound_silence import silence_checks
from reactor_serve.sessions.media_tracks import OutputFanout
from reactor_serve.sessions.offer_answering import CheckedOffer
from reactor_serve.sessions.viewers.answering import ViewerAnswering, ViewerConnection
from reactor_serve.sessions.viewers.encoder_pool import EncoderPool
from reactor_serve.sessions.viewers.shared_encoder import (
    SharedEncoder,
    SharedVideoTrack,
)

__all__ = ["VIEWER_COMMAND_REFUSED", "ViewerRoom"]

log = logging.getLogger(__name__)

VIEWER_COMMAND_REFUSED = "viewers cannot send commands"
# The runtime messages viewers get; the rest (replies to the owner's requests, the
# owner's commandErrors) are the owner's.
_SHARED_RUNTIME = ("stats", "sessionEnded")


class ViewerRoom:
    """The viewers of one session. Create and use it on the media loop."""

    FAREWELL_S = 0.3
    PC_CLOSE_TIMEOUT_S = 5.0

    def __init__(
        self,
        session_id: str,
        spec: ModelSpec,
        settings: WebRTCSettings,
        fanout: OutputFanout,
    ) -> None:
        self._label = mask_session_id(session_id)
        self.spec = spec
        self.settings = settings
        self.fanout = fanout
        self.token: str | None = None
        self._viewers: dict[int, ViewerConnection] = {}
        self._encoders = EncoderPool(fanout.observe, self._make_encoder)
        self._answering = ViewerAnswering(
            spec, settings, fanout, self._encoders,
            close_timeout_s=self.PC_CLOSE_TIMEOUT_S, label=self._label,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        # The model's own sessionEnded went to the viewers: close() sends no second one.
        self._farewell_sent = False

    # ---- the link ---------------------------------------------------------------------

    @property
    def max_viewers(self) -> int:
        return self.settings.max_viewers

    @property
    def count(self) -> int:
        return len(self._viewers)

    def link(self) -> str:
        """The viewer token, minted on first use."""
        if self.token is None:
            self.token = secrets.token_urlsafe(24)
        return self.token

    def admits(self, token: Any) -> bool:
        return (
            not self._closed and isinstance(token, str) and self.token is not None
            and secrets.compare_digest(token.encode(), self.token.encode())
        )

    async def revoke(self) -> bool:
        """Forget the token and end its viewers (they get sessionEnded{reason: revoked})."""
        had = self.token is not None
        self.token = None
        await asyncio.gather(*(
            self._close_viewer(v, last_word=("revoked", "the owner revoked the viewer link"))
            for v in list(self._viewers.values())
        ))
        return had

    # ---- negotiation ------------------------------------------------------------------

    def offer(self, sdp_offer: Any, track_mapping: Any) -> int:
        """Start answering a viewer's offer; returns its connection id (random: other
        holders of the token must not guess it). Raises OfferRejected (malformed offer),
        ViewerLimitReached."""
        if self._closed:
            raise UnknownSession("the session has ended")
        offer = self._answering.check(sdp_offer, track_mapping)
        if len(self._viewers) >= self.max_viewers:
            raise ViewerLimitReached(
                f"this session already has {len(self._viewers)} viewers: at most "
                f"{self.max_viewers} (max_viewers) may watch it at once"
            )
        viewer = self._answering.connect(self.token or "")
        self._viewers[viewer.id] = viewer
        viewer.answer = self._spawn(self._answer(viewer, offer))
        viewer.answer.add_done_callback(_retrieve)
        if self._watchdog is None:
            self._watchdog = self._spawn(self._watch_idle())
        return viewer.id

    def poll(self, connection_id: Any) -> SdpAnswer | AnswerPending:
        """The answer for a viewer connection, or that it is pending."""
        return self._answering.poll(connection_id)

    async def _answer(self, viewer: ViewerConnection, offer: CheckedOffer) -> str:
        try:
            answer = await self._answering.answer(
                viewer, offer, wire=lambda pc: self._wire(viewer), is_open=lambda: not self._closed
            )
        except BaseException:
            await self._close_viewer(viewer)
            raise
        log.info("session %s: viewer %d joined (%d watching)", self._label,
                 viewer.id % 10_000, len(self._viewers))
        return answer

    def _make_encoder(self, codec: str) -> SharedEncoder:
        return SharedEncoder(
            codec, self.settings.bitrate_kbps,
            keyframe_interval_s=self.settings.viewer_keyframe_interval_s,
            fps_hint=float(self.spec.fps),
        )

    # ---- data channel -----------------------------------------------------------------

    def _wire(self, viewer: ViewerConnection) -> None:
        pc = viewer.pc

        def send(text: str) -> None:
            channel = viewer.channel
            if channel is not None and channel.readyState == "open":
                channel.send(text)

        def refuse(name: str, args: dict[str, Any], command_id: str | int | None) -> None:
            error = command_error(
                name, VIEWER_COMMAND_REFUSED, [{"field": None, "rule": "viewer", "value": None}]
            )
            if command_id is not None:
                error["id"] = command_id
            send(channel_codec.runtime("commandError", error))

        viewer.handler = inbound_channel.InboundHandler(
            session_id=f"{self._label} viewer",
            command=refuse,
            send=send,
            send_control=lambda text: None,
            spec=lambda: self.spec,
        )

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label != "data":
                return
            viewer.channel = channel
            # Up once its channel is open: from then on the viewer can speak.
            viewer.silence.up()

            @channel.on("message")
            def on_message(raw: str | bytes) -> None:
                viewer.silence.heard()
                if viewer.handler is not None:
                    viewer.handler.on_message("data", raw)

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState in ("failed", "closed") and not viewer.closed:
                self._spawn(self._close_viewer(viewer))

    def broadcast(self, text: str, ending: bool = False) -> None:
        """Send a data-channel message of the session to every viewer (`ending`: it is
        the session's `sessionEnded`). See `shares` for which messages are shared."""
        if ending:
            self._farewell_sent = True
        for viewer in self._viewers.values():
            channel = viewer.channel
            if channel is not None and channel.readyState == "open":
                try:
                    channel.send(text)
                except Exception:
                    log.debug("session %s: a viewer's channel refused a message", self._label)

    @staticmethod
    def shares(envelope: dict[str, Any]) -> bool:
        """Whether a message the model session sends its owner goes to viewers too."""
        if envelope.get("scope") == "application":
            return True
        data = envelope.get("data") or {}
        return envelope.get("scope") == "runtime" and data.get("type") in _SHARED_RUNTIME

    # ---- ending -------------------------------------------------------------------------

    async def _watch_idle(self) -> None:
        async for stalled in silence_checks(min(1.0, self.settings.idle_timeout_s / 4)):
            if self._closed:
                return
            for viewer in list(self._viewers.values()):
                viewer.silence.excuse(stalled)
                answered = viewer.answer is not None and viewer.answer.done()
                if answered and viewer.silence.silent():
                    why = ("not connected after" if viewer.silence.waiting_for_connection
                           else "silent for")
                    log.info("session %s: viewer %d %s %.0f s; dropping it",
                             self._label, viewer.id % 10_000, why, viewer.silence.limit_s)
                    await self._close_viewer(viewer)

    async def _close_viewer(
        self, viewer: ViewerConnection, last_word: tuple[str, str | None] | None = None
    ) -> None:
        if viewer.closed:
            return
        viewer.closed = True
        self._viewers.pop(viewer.id, None)
        channel = viewer.channel
        if channel is not None and channel.readyState == "open":
            if last_word is not None:
                channel.send(farewell.session_ended(*last_word))
            await farewell.drain(channel, self.FAREWELL_S)
        for track in viewer.tracks:
            if isinstance(track, SharedVideoTrack):
                track.stop()
            else:
                self.fanout.release(track)
        # A later viewer of a track no one watches now starts a new encoder at a keyframe.
        self._encoders.drop_idle()
        await self._answering.close(viewer)
        log.info("session %s: viewer %d left (%d watching)", self._label,
                 viewer.id % 10_000, len(self._viewers))

    async def close(self, reason: str, message: str | None) -> None:
        """The session ended: every viewer gets `sessionEnded{reason, message}` and is
        closed; the token dies."""
        if self._closed:
            return
        self._closed = True
        self.token = None
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        last_word = None if self._farewell_sent else (reason, message)
        await asyncio.gather(*(
            self._close_viewer(v, last_word=last_word) for v in list(self._viewers.values())
        ))
        self._encoders.close()

    def stats(self) -> dict[str, Any]:
        """`viewers` (how many watch now) and, once any has, `viewer_encoding`: frames
        presented to the shared encoders, encodes made, their CPU time, and how many
        encoders there are now (one per output track and codec in use)."""
        data: dict[str, Any] = {"viewers": len(self._viewers)}
        encoding = self._encoders.stats()
        if encoding is not None:
            data["viewer_encoding"] = encoding
        return data

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
