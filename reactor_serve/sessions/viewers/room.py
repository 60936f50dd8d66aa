"""`ViewerRoom`: the watch-only viewers of one session.

The session's owner asks for a viewer link; its token (random, unguessable, not the
session id) lets anyone holding it watch, and nothing else. Each viewer offers its own
peer connection, answered here:

- Output tracks only: a `recvonly` m-line mapped to a model output is answered
  `sendonly`; everything else (the model's input tracks included) is inactive.
- Video comes from a `SharedEncoder` per output track and codec (shared_encoding.py):
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
import collections
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription

from reactor_serve.protocol import channel_codec
from reactor_serve.protocol.errors import (
    OfferRejected,
    UnknownSession,
    ViewerLimitReached,
)
from reactor_serve.rtc.codecs import prefer_codec
from reactor_serve.rtc.host_candidates import HostCandidatePolicy
from reactor_serve.rtc.ice_servers import rtc_configuration, session_ice_servers
from reactor_serve.rtc.sctp_guard import guard_sctp_text_frames
from reactor_serve.rtc.sdp_offer import parse_offer
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.runtime.field_errors import command_error
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.sessions import inbound_channel
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer, mask_session_id
from reactor_serve.sessions.media_tracks import OutputFanout
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


@dataclass
class _Viewer:
    id: int
    pc: RTCPeerConnection
    tracks: list[Any] = field(default_factory=list)
    channel: RTCDataChannel | None = None
    handler: inbound_channel.InboundHandler | None = None
    last_inbound: float = field(default_factory=time.monotonic)
    answer: asyncio.Task[str] | None = None
    closed: bool = False


class ViewerRoom:
    """The viewers of one session. Create and use it on the media loop."""

    # Viewer connections remembered for polling, answered or not.
    KEEP_ANSWERS = 16
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
        self._viewers: dict[int, _Viewer] = {}
        self._answers: collections.OrderedDict[int, _Viewer] = collections.OrderedDict()
        self._encoders: dict[tuple[str, str], SharedEncoder] = {}
        self._stop_observing: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        # The model's own sessionEnded went to the viewers: close() sends no second one.
        self._farewell_sent = False
        self._host_candidates = HostCandidatePolicy.from_settings(settings)
        # Ended encoders' work, so stats keep counting across viewers coming and going.
        self._retired: dict[str, float] = collections.defaultdict(float)

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
            self._close_viewer(v, farewell=("revoked", "the owner revoked the viewer link"))
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
        parsed = parse_offer(sdp_offer)
        mapping = self._output_mapping(track_mapping)
        if len(self._viewers) >= self.max_viewers:
            raise ViewerLimitReached(
                f"this session already has {len(self._viewers)} viewers: at most "
                f"{self.max_viewers} (max_viewers) may watch it at once"
            )
        cid = secrets.randbelow(900_000_000) + 100_000_000
        pc = RTCPeerConnection(rtc_configuration(
            session_ice_servers(self.settings.ice_servers, self.token or ""),
            self.settings.ice_transport_policy,
        ))
        viewer = self._viewers[cid] = _Viewer(cid, pc)
        self._answers[cid] = viewer
        while len(self._answers) > self.KEEP_ANSWERS:
            self._answers.popitem(last=False)
        viewer.answer = self._spawn(self._answer(viewer, sdp_offer, parsed, mapping))
        viewer.answer.add_done_callback(_retrieve)
        if self._watchdog is None:
            self._watchdog = self._spawn(self._watch_idle())
        return cid

    def poll(self, connection_id: Any) -> SdpAnswer | AnswerPending:
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

    async def _answer(
        self, viewer: _Viewer, sdp_offer: str, parsed: SessionDescription, mapping: dict[str, str]
    ) -> str:
        pc = viewer.pc
        video: list[tuple[Any, SharedVideoTrack]] = []
        try:
            for media in parsed.media:
                if media.kind not in ("audio", "video"):
                    continue
                name = mapping.get(media.rtp.muxId)
                decl = self.fanout.outputs.get(name) if name is not None else None
                if decl is None or decl.kind != media.kind:
                    pc.addTransceiver(media.kind, direction="inactive")
                    continue
                if media.kind == "video":
                    track: Any = SharedVideoTrack(decl.name)
                    transceiver = pc.addTransceiver(track, direction="sendonly")
                    prefer_codec(transceiver, self.settings.codec)
                    video.append((transceiver, track))
                else:
                    track = self.fanout.track(decl.name)
                    pc.addTransceiver(track, direction="sendonly")
                viewer.tracks.append(track)
            self._wire(viewer)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp_offer, type="offer"))
            guard_sctp_text_frames(pc.sctp)
            if self._host_candidates is not None:
                self._host_candidates.apply(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except BaseException as exc:
            await self._close_viewer(viewer)
            if isinstance(exc, Exception) and not isinstance(exc, (OfferRejected, UnknownSession)):
                raise OfferRejected(f"could not negotiate the viewer's offer: {exc}") from exc
            raise
        if viewer.closed or self._closed:
            raise UnknownSession("the session has ended")
        answer = pc.localDescription.sdp
        codecs = _answered_codecs(answer)
        for transceiver, track in video:
            codec = codecs.get(transceiver.mid, self.settings.codec)
            self._encoder(track.name, codec).subscribe(track)
        log.info("session %s: viewer %d joined (%d watching)", self._label,
                 viewer.id % 10_000, len(self._viewers))
        return answer

    def _output_mapping(self, track_mapping: Any) -> dict[str, str]:
        """mid -> output track name, for the entries that ask to receive an output."""
        if not isinstance(track_mapping, list):
            raise OfferRejected("track_mapping must be a list of {mid, name, kind, direction}")
        mapping: dict[str, str] = {}
        for i, raw in enumerate(track_mapping):
            if not isinstance(raw, dict) or not all(
                isinstance(raw.get(key), str) for key in ("mid", "name", "kind", "direction")
            ):
                raise OfferRejected(f"track_mapping[{i}] must have string mid, name, kind and direction")
            # A viewer sends nothing: its sendonly entries (model inputs) are answered
            # inactive, like m-lines outside the mapping.
            if raw["direction"] == "recvonly" and raw["name"] in self.fanout.outputs:
                mapping[raw["mid"]] = raw["name"]
        return mapping

    # ---- shared encoders ----------------------------------------------------------------

    def _encoder(self, name: str, codec: str) -> SharedEncoder:
        encoder = self._encoders.get((name, codec))
        if encoder is None:
            encoder = self._encoders[(name, codec)] = SharedEncoder(
                codec, self.settings.bitrate_kbps,
                keyframe_interval_s=self.settings.viewer_keyframe_interval_s,
                fps_hint=float(self.spec.fps),
            )
        if self._stop_observing is None:
            self._stop_observing = self.fanout.observe(self._on_presented)
        return encoder

    def _on_presented(self, presented: Any) -> None:
        for (name, _), encoder in self._encoders.items():
            image = presented.video.get(name)
            if image is not None:
                encoder.present(image, presented.pts)

    def _drop_idle_encoders(self) -> None:
        # An encoder with no viewer left stops (and a later viewer starts a new one at
        # a keyframe); with none left the fanout stops feeding us.
        for key, encoder in list(self._encoders.items()):
            if encoder.subscribers == 0:
                self._retire(encoder)
                del self._encoders[key]
        if not self._encoders and self._stop_observing is not None:
            self._stop_observing()
            self._stop_observing = None

    def _retire(self, encoder: SharedEncoder) -> None:
        for key, value in encoder.stats().items():
            if isinstance(value, (int, float)) and key != "viewers":
                self._retired[key] += value
        encoder.close()

    # ---- data channel -----------------------------------------------------------------

    def _wire(self, viewer: _Viewer) -> None:
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

            @channel.on("message")
            def on_message(raw: str | bytes) -> None:
                viewer.last_inbound = time.monotonic()
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
        while not self._closed:
            await asyncio.sleep(min(1.0, self.settings.idle_timeout_s / 4))
            now = time.monotonic()
            for viewer in list(self._viewers.values()):
                answered = viewer.answer is not None and viewer.answer.done()
                if answered and now - viewer.last_inbound > self.settings.idle_timeout_s:
                    log.info("session %s: viewer %d silent for %.0f s; dropping it",
                             self._label, viewer.id % 10_000, self.settings.idle_timeout_s)
                    await self._close_viewer(viewer)

    async def _close_viewer(
        self, viewer: _Viewer, farewell: tuple[str, str | None] | None = None
    ) -> None:
        if viewer.closed:
            return
        viewer.closed = True
        self._viewers.pop(viewer.id, None)
        channel = viewer.channel
        if channel is not None and channel.readyState == "open":
            if farewell is not None:
                reason, message = farewell
                data: dict[str, Any] = {"reason": reason}
                if message:
                    data["message"] = message
                channel.send(channel_codec.runtime("sessionEnded", data))
            await _drain(channel, self.FAREWELL_S)
        for track in viewer.tracks:
            if isinstance(track, SharedVideoTrack):
                track.stop()
            else:
                self.fanout.release(track)
        self._drop_idle_encoders()
        try:
            await asyncio.wait_for(viewer.pc.close(), self.PC_CLOSE_TIMEOUT_S)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("session %s: closing a viewer's connection failed: %r", self._label, exc)
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
        farewell = None if self._farewell_sent else (reason, message)
        await asyncio.gather(*(
            self._close_viewer(v, farewell=farewell) for v in list(self._viewers.values())
        ))
        for encoder in self._encoders.values():
            encoder.close()
        self._encoders.clear()
        if self._stop_observing is not None:
            self._stop_observing()
            self._stop_observing = None

    def stats(self) -> dict[str, Any]:
        """`viewers` (how many watch now) and, once any has, `viewer_encoding`: frames
        presented to the shared encoders, encodes made, their CPU time, and how many
        encoders there are now (one per output track and codec in use)."""
        data: dict[str, Any] = {"viewers": len(self._viewers)}
        totals = collections.defaultdict(float, self._retired)
        for encoder in self._encoders.values():
            for key, value in encoder.stats().items():
                if isinstance(value, (int, float)) and key != "viewers":
                    totals[key] += value
        if totals or self._encoders:
            data["viewer_encoding"] = {
                "encoders": len(self._encoders),
                "codecs": sorted({codec for _, codec in self._encoders}),
                "presented": int(totals["presented"]),
                "encodes": int(totals["encodes"]),
                "superseded": int(totals["superseded"]),
                "keyframes": int(totals["keyframes"]),
                "cpu_ms": round(totals["cpu_ms"], 1),
            }
        return data

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _answered_codecs(answer: str) -> dict[str, str]:
    """mid -> the video codec our answer sends on it (its first codec)."""
    codecs: dict[str, str] = {}
    for media in SessionDescription.parse(answer).media:
        if media.kind == "video" and media.rtp.codecs:
            mime = media.rtp.codecs[0].mimeType.lower()
            if mime in ("video/vp8", "video/h264"):
                codecs[media.rtp.muxId] = mime.split("/", 1)[1]
    return codecs


async def _drain(channel: RTCDataChannel, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while channel.readyState == "open" and channel.bufferedAmount > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
