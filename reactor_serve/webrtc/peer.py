"""`PeerSession`: one client's WebRTC connection bound to one model session.

The client offers; we answer with every candidate inline. `track_mapping` ties each
m-line's mid to a model track: a `recvonly` m-line (the client receives) is answered
`sendonly` with the model's output track of that name, a `sendonly` one `recvonly`
into the model's input buffer; m-lines outside the mapping are answered inactive.
The client opens the data channel; we never open one. A later offer on the same
session (the client's reconnect) replaces the peer connection and keeps the model's
session and state.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiortc import RTCDataChannel, RTCIceCandidate, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription, candidate_from_sdp

from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.session import EndReason, Session
from reactor_serve.webrtc import protocol, schema
from reactor_serve.webrtc.backend import OfferRejected
from reactor_serve.webrtc.codecs import apply_bitrate_range, prefer_codec
from reactor_serve.webrtc.ice import rtc_configuration, use_loopback_candidates
from reactor_serve.webrtc.media import OutputFanout, receive_input
from reactor_serve.webrtc.settings import WebRTCSettings

__all__ = ["PeerSession", "TrackMapping"]

log = logging.getLogger("reactor_serve.webrtc")


@dataclass(frozen=True)
class TrackMapping:
    mid: str
    name: str
    kind: str
    direction: str  # the client's view: recvonly = model output, sendonly = model input


class PeerSession:
    """A model session reached over WebRTC. Create and use it on the media loop."""

    OUTBOX_LIMIT = 256
    # How long the end of a session waits for `sessionEnded` to leave the data channel.
    FAREWELL_S = 0.5

    def __init__(
        self,
        host: ModelHost,
        settings: WebRTCSettings,
        session_id: str | None = None,
        on_end: Callable[[PeerSession], None] | None = None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.id = session_id or secrets.token_urlsafe(16)
        self.on_end = on_end
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self.end_detail: str | None = None
        self.session: Session | None = None
        self.connections = 0
        self._pc: RTCPeerConnection | None = None
        self._pc_tracks: list[Any] = []
        self._pc_tasks: list[asyncio.Task[None]] = []
        self._fanout: OutputFanout | None = None
        self._channels: dict[str, RTCDataChannel] = {}
        self._outbox: collections.deque[str] = collections.deque(maxlen=self.OUTBOX_LIMIT)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_inbound = time.monotonic()
        self._finishing = False
        # Trickled remote candidates that came while no connection could take them.
        self._pending_candidates: list[RTCIceCandidate | None] = []
        self.ignored_frames = 0
        apply_bitrate_range(settings)
        if settings.loopback_candidates:
            use_loopback_candidates(True)

    # ---- negotiation ------------------------------------------------------------

    async def answer(self, sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
        """Answer `sdp_offer`; the first call opens the model session."""
        self._loop = asyncio.get_running_loop()
        parsed = _parse_offer(sdp_offer)
        mapping = self._parse_mapping(track_mapping)
        async with self._lock:
            if self.ended.is_set():
                raise OfferRejected(f"session {self.id} has ended")
            if self.session is None:
                await self._open_model_session()
            assert self._fanout is not None and self.session is not None
            pc = RTCPeerConnection(rtc_configuration(self.settings.ice_servers))
            tracks: list[Any] = []
            inputs: list[tuple[Any, str]] = []
            try:
                for media in parsed.media:
                    if media.kind not in ("audio", "video"):
                        continue
                    entry = mapping.get(media.rtp.muxId)
                    if entry is None:
                        pc.addTransceiver(media.kind, direction="inactive")
                        continue
                    if entry.kind != media.kind:
                        raise OfferRejected(
                            f"track_mapping: mid {entry.mid!r} is a {media.kind} m-line but "
                            f"is mapped to {entry.kind} track {entry.name!r}"
                        )
                    if entry.direction == "recvonly":
                        track = self._fanout.track(entry.name)
                        tracks.append(track)
                        transceiver = pc.addTransceiver(track, direction="sendonly")
                        if media.kind == "video":
                            prefer_codec(transceiver, self.settings.codec)
                    else:
                        transceiver = pc.addTransceiver(media.kind, direction="recvonly")
                        inputs.append((transceiver, entry.name))
                self._wire(pc)
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp_offer, type="offer"))
                pending, self._pending_candidates = self._pending_candidates, []
                for candidate in pending:
                    await pc.addIceCandidate(candidate)
                await pc.setLocalDescription(await pc.createAnswer())
            except OfferRejected:
                await self._discard(pc, tracks)
                raise
            except Exception as exc:
                await self._discard(pc, tracks)
                raise OfferRejected(f"could not negotiate the offer: {exc}") from exc
            previous = (self._pc, self._pc_tracks, self._pc_tasks)
            self._pc, self._pc_tracks, self._pc_tasks = pc, tracks, []
            for transceiver, name in inputs:
                task = self._loop.create_task(
                    receive_input(transceiver.receiver.track, name, self.session)
                )
                self._pc_tasks.append(task)
            self._last_inbound = time.monotonic()
            self.connections += 1
            if previous[0] is not None:
                await self._discard(*previous)
            return pc.localDescription.sdp

    async def add_ice_candidates(self, candidates: list[Any], is_final: bool = False) -> None:
        """Trickled remote candidates (newer clients offer without them).

        Each is `{"candidate": "candidate:...", "sdpMid", "sdpMLineIndex"}`; an empty
        candidate, or `is_final`, marks the end of the client's candidates. Raises
        OfferRejected naming a malformed one.
        """
        parsed: list[RTCIceCandidate | None] = [_parse_candidate(c, i) for i, c in enumerate(candidates)]
        if is_final and (not parsed or parsed[-1] is not None):
            parsed.append(None)
        if self._pc is None or self._lock.locked():
            self._pending_candidates.extend(parsed)
            return
        for candidate in parsed:
            await self._pc.addIceCandidate(candidate)

    def _parse_mapping(self, track_mapping: list[dict[str, Any]]) -> dict[str, TrackMapping]:
        if not isinstance(track_mapping, list):
            raise OfferRejected("track_mapping must be a list of {mid, name, kind, direction}")
        spec = self.host.spec
        outputs = {t.name: t for t in spec.outputs}
        inputs = {t.name: t for t in spec.inputs}
        mapping: dict[str, TrackMapping] = {}
        for i, raw in enumerate(track_mapping):
            try:
                entry = TrackMapping(
                    mid=str(raw["mid"]),
                    name=str(raw["name"]),
                    kind=str(raw["kind"]),
                    direction=str(raw["direction"]),
                )
            except (KeyError, TypeError):
                raise OfferRejected(
                    f"track_mapping[{i}] must have mid, name, kind and direction"
                ) from None
            if entry.direction == "recvonly":
                decl = outputs.get(entry.name)
                side = "output"
            elif entry.direction == "sendonly":
                decl = inputs.get(entry.name)
                side = "input"
            else:
                raise OfferRejected(
                    f"track_mapping[{i}].direction must be recvonly or sendonly, "
                    f"got {entry.direction!r}"
                )
            if decl is None:
                known = ", ".join(outputs if side == "output" else inputs) or "none"
                raise OfferRejected(
                    f"track_mapping[{i}]: the model has no {side} track {entry.name!r} "
                    f"({side} tracks: {known})"
                )
            if decl.kind != entry.kind:
                raise OfferRejected(
                    f"track_mapping[{i}]: track {entry.name!r} is {decl.kind}, not {entry.kind}"
                )
            mapping[entry.mid] = entry
        return mapping

    async def _open_model_session(self) -> None:
        self.session = await self.host.open_session(_Sink(self), session_id=self.id)
        if self.session.ended.is_set():
            raise OfferRejected(
                f"the model ended the session at connect: {self.session.end_detail}"
            )
        self._fanout = OutputFanout(self.session.clock, self.host.spec.outputs)
        self._fanout.start()
        assert self._loop is not None
        self._tasks.append(self._loop.create_task(self._watchdog()))
        self._tasks.append(self._loop.create_task(self._report_stats()))

    def _wire(self, pc: RTCPeerConnection) -> None:
        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if pc is not self._pc:
                return
            self._channels[channel.label] = channel

            @channel.on("message")
            def on_message(raw: str | bytes) -> None:
                self._on_channel_message(channel.label, raw)

            @channel.on("open")
            def on_open() -> None:
                self._flush_outbox()

            self._flush_outbox()

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc is not self._pc:
                return
            if pc.connectionState == "failed":
                await self.close(EndReason.TIMEOUT)
            elif pc.connectionState == "closed":
                await self.close(EndReason.CLIENT_CLOSED)

    async def _discard(self, pc: RTCPeerConnection | None, tracks: list[Any], tasks: Any = ()) -> None:
        for task in tasks:
            task.cancel()
        if self._fanout is not None:
            for track in tracks:
                self._fanout.release(track)
        if pc is not None:
            await pc.close()

    # ---- the data channel -------------------------------------------------------

    def _on_channel_message(self, label: str, raw: str | bytes) -> None:
        # Any inbound frame, even one we cannot read, shows the client is alive.
        self._last_inbound = time.monotonic()
        if label == "control":
            self._on_control(raw)
            return
        session = self.session
        try:
            message = protocol.decode(raw)
        except protocol.ProtocolError as exc:
            command = _command_of(raw)
            if command is not None and session is not None:
                # A command with malformed arguments: the validator answers it with a
                # commandError, like any other bad command.
                session.command(*command)
                return
            self.ignored_frames += 1
            log.warning("session %s: ignored a data-channel frame: %s", self.id, exc)
            return
        if session is None:
            return
        if message.scope == "application":
            session.command(message.type, message.data)
        elif message.type == "requestSchema":
            self._send(protocol.runtime("modelSchema", schema.model_schema(self.host.spec)))
        elif message.type == "requestCapabilities":
            self._send(
                protocol.runtime("modelCapabilities", schema.capabilities(self.host.spec))
            )
        elif message.type != "ping":
            log.debug("session %s: unhandled runtime message %r", self.id, message.type)

    def _on_control(self, raw: str | bytes) -> None:
        try:
            request = protocol.decode_control(raw)
        except protocol.ProtocolError as exc:
            self.ignored_frames += 1
            log.warning("session %s: ignored a control frame: %s", self.id, exc)
            return
        if request.get("type") != "request":
            return  # notifications (pause/resume/unpublish) need no answer
        name = (request.get("data") or {}).get("name")
        known = {t.name for t in self.host.spec.inputs} | {t.name for t in self.host.spec.outputs}
        if request.get("method") == "publish_track" and name not in known:
            reply = protocol.control_response(
                request, error=("unknown_track", f"the model has no track {name!r}")
            )
        else:
            reply = protocol.control_response(request, data={})
        channel = self._channels.get("control")
        if channel is not None and channel.readyState == "open":
            channel.send(reply)

    def _send(self, text: str) -> None:
        channel = self._channels.get("data")
        if channel is not None and channel.readyState == "open":
            channel.send(text)
        else:
            self._outbox.append(text)

    def _flush_outbox(self) -> None:
        channel = self._channels.get("data")
        while self._outbox and channel is not None and channel.readyState == "open":
            channel.send(self._outbox.popleft())

    # ---- what the model session sends: called from the model's threads -------------

    def _deliver(self, envelope: dict[str, Any]) -> None:
        data = envelope["data"]
        if envelope.get("scope") == "runtime":
            text = protocol.runtime(data["type"], data.get("data", {}))
        else:
            text = protocol.application(data)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._send, text)

    def _model_ended(self, reason: str, detail: str | None) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: loop.create_task(self._finish(reason, detail)))

    # ---- ending -----------------------------------------------------------------

    async def close(self, reason: str = EndReason.CLIENT_CLOSED) -> None:
        """End the session from the client's side and wait until it is cleaned up."""
        if self.ended.is_set():
            return
        if self.session is not None and not self.session.ended.is_set():
            await self.session.close(reason)
            await self.ended.wait()
        else:
            await self._finish(reason, None)

    async def _finish(self, reason: str, detail: str | None) -> None:
        if self._finishing:
            await self.ended.wait()
            return
        self._finishing = True
        self.end_reason, self.end_detail = reason, detail
        await self._drain_data_channel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        await self._discard(self._pc, self._pc_tracks, self._pc_tasks)
        self._pc = None
        if self._fanout is not None:
            await self._fanout.stop()
        self.ended.set()
        if self.on_end is not None:
            try:
                self.on_end(self)
            except Exception:
                log.exception("on_end callback failed")

    async def _drain_data_channel(self) -> None:
        channel = self._channels.get("data")
        deadline = time.monotonic() + self.FAREWELL_S
        while (
            channel is not None
            and channel.readyState == "open"
            and channel.bufferedAmount > 0
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # let SCTP put the last message on the wire

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.idle_timeout_s / 4))
            if time.monotonic() - self._last_inbound > self.settings.idle_timeout_s:
                log.info("session %s: no inbound frame for %.0f s, ending it",
                         self.id, self.settings.idle_timeout_s)
                await self.close(EndReason.TIMEOUT)
                return

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_interval_s)
            if self.session is None or self._fanout is None:
                continue
            stats = self.stats()
            stats["connections"] = self.connections
            try:
                self._send(protocol.runtime("stats", stats))
            except protocol.ProtocolError:
                log.exception("session %s: stats are not JSON", self.id)

    def stats(self) -> dict[str, Any]:
        data = self.session.stats() if self.session is not None else {}
        if self._fanout is not None:
            data["superseded"] = self._fanout.superseded()
        return data


def _parse_candidate(raw: Any, index: int) -> RTCIceCandidate | None:
    """An RTCIceCandidate from a client's JSON candidate; None for end-of-candidates."""
    if isinstance(raw, str):
        raw = {"candidate": raw, "sdpMLineIndex": 0}
    if not isinstance(raw, dict):
        raise OfferRejected(f"candidates[{index}] must be an object with a 'candidate' string")
    text = raw.get("candidate") or ""
    if not text.strip():
        return None
    try:
        candidate = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:") else text)
    except Exception:
        raise OfferRejected(f"candidates[{index}] is not an ICE candidate: {text[:80]!r}") from None
    # Browsers send camelCase; the Python SDK's JSON uses snake_case.
    candidate.sdpMid = raw.get("sdpMid", raw.get("sdp_mid"))
    index_value = raw.get("sdpMLineIndex", raw.get("sdp_mline_index"))
    candidate.sdpMLineIndex = int(index_value) if index_value is not None else None
    if candidate.sdpMid is None and candidate.sdpMLineIndex is None:
        candidate.sdpMLineIndex = 0
    return candidate


def _command_of(raw: str | bytes) -> tuple[str, Any] | None:
    """(name, arguments) of an application envelope whose arguments are malformed."""
    if not isinstance(raw, str) or len(raw) > protocol.MAX_MESSAGE_BYTES:
        return None
    try:
        envelope = json.loads(raw)
    except ValueError:
        return None
    inner = envelope.get("data") if isinstance(envelope, dict) else None
    if envelope.get("scope") != "application" or not isinstance(inner, dict):  # type: ignore[union-attr]
        return None
    name = inner.get("type")
    return (name, inner.get("data")) if isinstance(name, str) and name else None


def _parse_offer(sdp_offer: Any) -> SessionDescription:
    if not isinstance(sdp_offer, str) or not sdp_offer.strip():
        raise OfferRejected("sdp_offer must be a non-empty SDP string")
    try:
        parsed = SessionDescription.parse(sdp_offer)
    except Exception as exc:
        raise OfferRejected(f"malformed SDP offer: {exc}") from None
    if not parsed.media:
        raise OfferRejected("malformed SDP offer: it has no m-lines")
    return parsed



class _Sink:
    """The model session's SessionSink for a PeerSession (whose `ended` is an Event)."""

    def __init__(self, peer: PeerSession) -> None:
        self._peer = peer

    def message(self, envelope: dict[str, Any]) -> None:
        self._peer._deliver(envelope)

    def ended(self, reason: str, detail: str | None) -> None:
        self._peer._model_ended(reason, detail)
