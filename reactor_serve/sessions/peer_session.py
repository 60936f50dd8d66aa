"""`PeerSession`: one client's WebRTC connection bound to one model session.

The client offers; we answer with every candidate inline (offer_answering.py, shared
with viewers). `track_mapping` ties each m-line's mid to a model track: a `recvonly`
m-line (the client receives) is answered `sendonly` with the model's output track of
that name, a `sendonly` one `recvonly` into the model's input buffer; m-lines outside
the mapping are answered inactive. The client opens the data channel; we never open one.

Life of a session (`SessionState`): created -> waiting (first offer being answered,
model session opening) -> streaming -> orphaned -> ended. Losing the transport
without `stop_session` (the peer connection closed or failed, or no inbound frame for
`idle_timeout_s`) is a network blip until proven otherwise: the session is orphaned
for `reconnect_grace_s` (orphan_timer.py). The model keeps its instance and state and
is not told `@disconnected`; output is paused (nothing presented, so the bounded
output buffer makes the model's `emit` wait); input stops. A new offer within the
window resumes it on a new peer connection with fresh frames; otherwise it ends with
reason `timeout`. `close()` ends it at once. Every end sends `sessionEnded{reason,
message}` on the data channel first when one is open, and is recorded in
`end_reason`/`end_detail`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Awaitable, Callable

from aiortc import RTCDataChannel, RTCPeerConnection

from reactor_serve.interface.files import UploadedFile
from reactor_serve.protocol import channel_codec
from reactor_serve.protocol.errors import OfferRejected, session_ended
from reactor_serve.protocol.wire_v1 import codec as wire_v1
from reactor_serve.protocol.wire_version import Wire
from reactor_serve.rtc import dc_chunking, frame_metadata
from reactor_serve.rtc.codecs import answered_codecs, apply_bitrate_range
from reactor_serve.rtc.loss_rate_control import LossRateControl
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.rtc.transport_states import describe_transport
from reactor_serve.runtime.field_errors import command_error
from reactor_serve.runtime.session import EndReason, Session, SessionHost
from reactor_serve.runtime.stepping import StepFailure
from reactor_serve.sessions import farewell
from reactor_serve.sessions.candidates import TrickledCandidates, parse_candidates
from reactor_serve.sessions.contract import SessionState, mask_session_id
from reactor_serve.sessions.inbound_channel import InboundHandler
from reactor_serve.sessions.media_tracks import OutputFanout, receive_input
from reactor_serve.sessions.offer_answering import Answer, OfferAnswerer, check_offer
from reactor_serve.sessions.orphan_timer import OrphanTimer
from reactor_serve.sessions.outbox import Outbox
from reactor_serve.sessions.recording.recorder import SessionRecordings
from reactor_serve.sessions.session_steps import SessionSteps
from reactor_serve.sessions.stamped_video import StampedVideoTrack
from reactor_serve.sessions.step_store import StepStore
from reactor_serve.sessions.uploads.store import SessionUploads
from reactor_serve.sessions.viewers.room import ViewerRoom

__all__ = ["PeerSession"]

log = logging.getLogger(__name__)


class PeerSession:
    """A model session reached over WebRTC. Create and use it on the media loop."""

    OUTBOX_LIMIT = 256
    # How long the end of a session waits for `sessionEnded` to leave the data channel.
    FAREWELL_S = 0.5
    # How long ending waits for the model thread (disconnect hooks, an opening
    # session). Past it the session is ended on our side anyway: closing must never
    # hang on a model thread that is stuck or gone.
    CLOSE_TIMEOUT_S = 10.0
    # How long closing one aiortc peer connection may take.
    PC_CLOSE_TIMEOUT_S = 5.0
    # How long the grace timer lets a reconnect's negotiation in progress finish.
    NEGOTIATION_WAIT_S = 10.0
    # Candidates kept per connection before it can take them; connections remembered.
    MAX_PENDING_CANDIDATES = 256
    KEEP_CONNECTIONS = 8

    def __init__(
        self,
        host: SessionHost,
        settings: WebRTCSettings,
        session_id: str | None = None,
        on_end: Callable[[PeerSession], None] | None = None,
        on_state: Callable[[PeerSession, str], None] | None = None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.id = session_id or secrets.token_urlsafe(16)
        # What the logs name it by: an operator's log must not hand out the id.
        self._log_name = mask_session_id(self.id)
        self.on_end = on_end
        self.on_state = on_state
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self.end_detail: str | None = None
        self.session: Session | None = None
        self.connections = 0
        self._state = SessionState.CREATED
        self._pc: RTCPeerConnection | None = None
        self._pc_tracks: list[Any] = []
        self._pc_tasks: list[asyncio.Task[None]] = []
        self._fanout: OutputFanout | None = None
        # The current connection's channels; on a chunked connection each is a
        # ChunkedChannel around the RTCDataChannel (rtc/dc_chunking.py).
        self._channels: dict[str, Any] = {}
        # The peer's max-message-size when the offer being answered declared chunking.
        self._offer_chunking: int | None = None
        self._outbox = Outbox(self._channels_get, self.OUTBOX_LIMIT)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        # Every task we start, referenced until done (the loop keeps weak references).
        self._tasks: set[asyncio.Task[Any]] = set()
        self._opening: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        # Why the session is ending, from the moment `close()` is called.
        self._closing_for: tuple[str | None, str | None] = (None, None)
        self._stats_task: asyncio.Task[None] | None = None
        self._timer = OrphanTimer(
            idle_timeout_s=settings.idle_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            reconnect_grace_s=settings.reconnect_grace_s,
            on_silent=self._on_silent,
            on_expired=self._on_grace_expired,
        )
        self._finishing = False
        # Set when `close()` stopped waiting for an open still under way.
        self._open_abandoned = False
        # Set (from the model thread) once the model's own sessionEnded is on its way.
        self._farewell_queued = False
        self._candidates = TrickledCandidates(self.MAX_PENDING_CANDIDATES, self.KEEP_CONNECTIONS)
        self._answerer = OfferAnswerer(
            settings, close_timeout_s=self.PC_CLOSE_TIMEOUT_S, receives_inputs=True,
            what="the offer", label=f"session {self._log_name}",
        )
        self.ignored_frames = 0
        self._inbound: InboundHandler | None = None
        # Watch-only viewers of this session (sessions/viewers/room.py), once it is open.
        self.viewers: ViewerRoom | None = None
        # Recordings of this session (sessions/recording/recorder.py), once it is open; the start
        # options the client gave (`extra_args`: `record: true` records from the start);
        # `recording` keys overriding the model config's (serve_config.yaml).
        self.recordings: SessionRecordings | None = None
        self.extra_args: dict[str, Any] = {}
        self.recording_override: dict[str, Any] | None = None
        # "stepped": the model makes nothing until the client asks for a step
        # (sessions/session_steps.py); "streamed" by default.
        self.generation = "streamed"
        self.steps: SessionSteps | None = None
        # Where its steps are kept (its backend's, sessions/step_store.py), if anywhere.
        self.step_store: StepStore | None = None
        # The files the client uploaded to this session (its backend's store), which
        # its commands name by id; None: the session takes none.
        self.uploads: SessionUploads | None = None
        apply_bitrate_range(settings)

    # ---- state ------------------------------------------------------------------

    @property
    def state(self) -> str:
        """One of `SessionState`: created, waiting, streaming, orphaned, ended."""
        return self._state

    @property
    def connection_id(self) -> int | None:
        """The id of the latest offer's connection."""
        return self._candidates.latest

    def grace_remaining(self) -> float | None:
        """Seconds left for a reconnect while orphaned; None otherwise."""
        if self._state != SessionState.ORPHANED:
            return None
        return self._timer.grace_remaining()

    def _set_state(self, state: str) -> None:
        if state == self._state:
            return
        self._state = state
        if self.on_state is not None:
            try:
                self.on_state(self, state)
            except Exception:
                log.exception("on_state callback failed")

    def _raise_if_ended(self) -> None:
        if self.ended.is_set() or self._closing is not None or self._finishing:
            reason, detail = (
                (self.end_reason, self.end_detail) if self.end_reason else self._closing_for
            )
            raise session_ended(self.id, reason, detail)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- negotiation ------------------------------------------------------------

    def validate_offer(self, sdp_offer: Any, track_mapping: Any) -> None:
        """Raise OfferRejected if the offer or its track mapping is malformed."""
        check_offer(sdp_offer, track_mapping, self.host.spec)

    async def answer(
        self,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
    ) -> str:
        """Answer `sdp_offer` on connection `connection_id` (None: a new one).

        The first call opens the model session; a later one (a reconnect, or a resume
        of an orphaned session) replaces the peer connection and keeps the model's
        session and state. Raises OfferRejected (bad offer), UnknownSession (the
        session has ended), or the host's SessionBusy.
        """
        self._loop = asyncio.get_running_loop()
        # Every check that needs no model session comes before opening one.
        offer = check_offer(sdp_offer, track_mapping, self.host.spec)
        self._raise_if_ended()
        conn = self._candidates.offer(connection_id)
        chunking = dc_chunking.offered_limit(sdp_offer)
        stamped = frame_metadata.offered(sdp_offer)
        async with self._lock:
            self._raise_if_ended()
            first = self.session is None
            if first:
                self._set_state(SessionState.WAITING)
                try:
                    await self._open_model_session()
                except asyncio.CancelledError:
                    # Nobody will answer this session: end it rather than leave a
                    # model session open with no client (the host would be busy).
                    self._spawn(self.close(EndReason.CLIENT_CLOSED, "the offer was abandoned"))
                    raise
                except BaseException:
                    if self._state == SessionState.WAITING and self.session is None:
                        self._set_state(SessionState.CREATED)
                    raise
                self._raise_if_ended()
            fanout = self._fanout
            assert fanout is not None and self.session is not None
            pc = self._answerer.connection(self.id)
            conn.pc, conn.remote_set = pc, False
            tracks: list[Any] = []

            def outgoing(kind: str, name: str) -> Any:
                track = fanout.track(name, stamped=stamped)
                tracks.append(track)
                return track

            # Read by _wire, which the answerer calls before the connection can open a
            # channel (offers are answered one at a time, under the lock).
            self._offer_chunking = chunking
            try:
                # Candidates trickled once the offer is applied go straight to `pc`
                # (see add_ice_candidates), also while the answer gathers ours.
                answer = await self._answerer.answer(
                    pc, offer, outgoing=outgoing, wire=self._wire,
                    on_remote_set=lambda pc: self._candidates.remote_set(conn, pc),
                )
                self._raise_if_ended()
            except BaseException as exc:
                conn.pc, conn.remote_set = None, False
                await self._discard_shielded(pc, tracks)
                if isinstance(exc, asyncio.CancelledError) and first:
                    self._spawn(self.close(EndReason.CLIENT_CLOSED, "the offer was abandoned"))
                if isinstance(exc, OfferRejected):
                    self._raise_if_ended()  # closed under us: say so, not "bad offer"
                raise
            self._install(pc, tracks, answer)
            sdp = answer.sdp
            if stamped:
                self._start_stamped(answer)
                sdp = frame_metadata.with_frame_metadata(sdp)
            if chunking is not None:
                sdp = dc_chunking.with_chunking(sdp, self._inbound_limit())
            return sdp

    def _start_stamped(self, answer: Answer) -> None:
        """Start the encoders of a connection whose client negotiated frame metadata,
        each in the codec the answer sends on its track."""
        codecs = answered_codecs(answer.sdp)
        for transceiver, track in answer.sent:
            if isinstance(track, StampedVideoTrack):
                settings = self.settings
                track.start(
                    codecs.get(transceiver.mid or "", settings.codec), settings.bitrate_kbps,
                    fps_hint=float(self.host.spec.fps),
                    keyframe_interval_s=settings.viewer_keyframe_interval_s,
                )
                control = LossRateControl(settings.bitrate_kbps * 1000, settings.min_bitrate_kbps * 1000,
                                          settings.max_bitrate_kbps * 1000)
                # With the connection's other tasks: cancelled when it is replaced.
                self._pc_tasks.append(self._spawn(track.follow_loss(transceiver.sender, control)))

    def _install(self, pc: RTCPeerConnection, tracks: list[Any], answer: Answer) -> None:
        """Make a freshly answered connection the session's transport."""
        assert self.session is not None and self._fanout is not None
        previous = (self._pc, self._pc_tracks, self._pc_tasks)
        self._pc, self._pc_tracks, self._pc_tasks = pc, tracks, []
        # The old connection's channels go with it; until the client's new "data"
        # channel opens, messages wait in the outbox.
        self._channels = {}
        for transceiver, name in answer.received:
            self._pc_tasks.append(
                self._spawn(receive_input(transceiver.receiver.track, name, self.session))
            )
        self.connections += 1
        self._timer.resume()
        if pc.connectionState != "connected":
            self._timer.silence.coming_up()
        if self._fanout.paused and not self.stepped:
            # Resuming an orphaned session: fresh frames, not what queued meanwhile.
            # (A stepped session's frames answer its steps: nothing streams.)
            self._fanout.resume()
        self._set_state(SessionState.STREAMING)
        if previous[0] is not None:
            self._spawn(self._discard(*previous))

    async def add_ice_candidates(
        self,
        candidates: list[Any],
        is_final: bool = False,
        connection_id: int | None = None,
    ) -> None:
        """Trickled remote candidates for connection `connection_id` (None: the latest
        offer's, or the next offer's when none came yet).

        Each is `{"candidate": "candidate:...", "sdpMid", "sdpMLineIndex"}`; an empty
        candidate, or `is_final`, marks the end of the client's candidates. Candidates
        for a connection that cannot take them yet are kept for it. Raises
        OfferRejected naming a malformed one (and keeps none of the batch).
        """
        parsed = parse_candidates(candidates, is_final)
        self._raise_if_ended()
        await self._candidates.add(parsed, connection_id)

    async def _open_model_session(self) -> None:
        if self._opening is None:
            self._opening = self._spawn(self._open())
        opening = self._opening
        try:
            # Shielded: a cancelled offer must not cancel the model thread's connect
            # half-way; `close()` waits for it and ends what it opened.
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            raise
        except BaseException:
            if self._opening is opening:
                self._opening = None  # a later offer may try again
            raise

    async def _open(self) -> None:
        session = await self.host.open_session(_Sink(self), session_id=self.id,
                                               stepped=self.stepped)
        if self._open_abandoned:
            reason, detail = self._closing_for
            await self.host.end_session(session, reason or EndReason.SHUTDOWN, detail)
            raise OfferRejected("the session ended while its model was opening it")
        self.session = session
        self._fanout = OutputFanout(
            session.clock, self.host.spec.outputs, on_error=self._on_fanout_error,
            on_answer=session.frame_answered,
        )
        if session.ended.is_set():
            raise OfferRejected(
                f"the model ended the session at connect: {session.end_detail}"
            )
        if self.stepped:
            # Nothing streams: each step's frames answer that step.
            self.steps = SessionSteps(
                session=lambda: self.session, outputs=self.host.spec.outputs,
                inputs=self.host.spec.inputs, output_buffer=self.host.output_buffer,
                fps=self.host.spec.fps, send_frame=self._send_frame, limit=self._message_limit,
                resolve=lambda name, args: self.inbound.resolve_files(name, args),
                kept=self.step_store.keep if self.step_store is not None else None,
            )
        else:
            self._fanout.start()
        self.viewers = ViewerRoom(self.id, self.host.spec, self.settings, self._fanout)
        self.recordings = SessionRecordings.for_session(
            model=self.host.spec.name, session_id=self.id, config=self.host.config,
            outputs=self.host.spec.outputs, send=self._emit_runtime,
            override=self.recording_override,
        )
        self.recordings.attach(self._fanout, self.extra_args.get("record"))
        self._timer.start_watchdog()
        self._stats_task = self._spawn(self._report_stats())

    def _channels_get(self, label: str) -> Any:
        return self._channels.get(label)

    def _wire(self, pc: RTCPeerConnection) -> None:
        # A new connection tells afresh which wire its client speaks (a client may
        # come back with another SDK).
        if self._inbound is not None:
            self._inbound.new_connection()
        chunking = self._offer_chunking

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if pc is not self._pc:
                return
            if self._timer.silence.waiting_for_connection:
                # Up: the client's channel is open, so from now on it can speak (ICE
                # and DTLS connected are not enough: SCTP and the channel come after).
                self._timer.silence.up()
            label = channel.label
            if chunking is None:
                self._channels[label] = channel

                @channel.on("message")
                def on_message(raw: str | bytes) -> None:
                    self._on_channel_message(label, raw)
            else:
                self._channels[label] = dc_chunking.ChunkedChannel(channel, chunking)
                reassembler = dc_chunking.Reassembler(self._inbound_limit())

                @channel.on("message")
                def on_frame(raw: str | bytes) -> None:
                    try:
                        message = reassembler.push(raw)
                    except dc_chunking.ChunkingError as exc:
                        self._timer.silence.heard()
                        self.inbound.ignore(label, exc)
                        return
                    if message is None:
                        self._timer.silence.heard()
                    else:
                        self._on_channel_message(label, message)

            @channel.on("open")
            def on_open() -> None:
                self._outbox.flush()

            self._outbox.flush()

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc is not self._pc:
                return
            if pc.connectionState in ("failed", "closed"):
                self._spawn(self._lose_transport(pc, pc.connectionState))

    async def _discard(
        self, pc: RTCPeerConnection | None, tracks: list[Any], tasks: Any = ()
    ) -> None:
        for task in tasks:
            task.cancel()
        if self._fanout is not None:
            for track in tracks:
                self._fanout.release(track)
        if pc is not None:
            await self._answerer.close(pc)

    async def _discard_shielded(self, pc: RTCPeerConnection, tracks: list[Any]) -> None:
        # Runs even when the caller is being cancelled: no RTCPeerConnection leaks.
        try:
            await asyncio.shield(self._spawn(self._discard(pc, tracks)))
        except asyncio.CancelledError:
            pass

    # ---- losing the transport: orphaned -----------------------------------------

    async def _on_silent(self) -> None:
        if self._state != SessionState.STREAMING:
            return
        if self._timer.silence.waiting_for_connection:
            log.info("session %s: the connection did not come up within %.0f s (%s)",
                     self._log_name, self.settings.connect_timeout_s, self._pc_states())
            await self._lose_transport(self._pc, "unconnected")
            return
        log.info("session %s: no inbound frame for %.0f s",
                 self._log_name, self.settings.idle_timeout_s)
        await self._lose_transport(self._pc, "idle")

    def _pc_states(self) -> str:
        return describe_transport(self._pc) if self._pc is not None else "no connection"

    async def _lose_transport(self, pc: RTCPeerConnection | None, why: str) -> None:
        """The client's transport is gone (`why`: closed, failed, idle, or unconnected:
        it never came up)."""
        if pc is not self._pc or self._state != SessionState.STREAMING:
            return
        if self._closing is not None or self._finishing:
            return
        if self._timer.stopping_on_close():
            # The client asked to stop (a stop_session naming no session) and then
            # closed its connection: that close is the stop.
            await self.close(EndReason.CLIENT_CLOSED, "the client stopped the session")
            return
        grace = self.settings.reconnect_grace_s
        if grace <= 0:
            if why == "closed":
                await self.close(EndReason.CLIENT_CLOSED)
            elif why == "idle":
                await self.close(
                    EndReason.TIMEOUT,
                    f"no message from the client for {self.settings.idle_timeout_s:g} s",
                )
            elif why == "unconnected":
                await self.close(
                    EndReason.TIMEOUT,
                    f"the connection did not come up within {self.settings.connect_timeout_s:g} s",
                )
            else:
                await self.close(EndReason.TIMEOUT, "the connection to the client failed")
            return
        self._orphan(why)

    def _orphan(self, why: str) -> None:
        pc, tracks, tasks = self._pc, self._pc_tracks, self._pc_tasks
        self._pc, self._pc_tracks, self._pc_tasks = None, [], []
        self._channels = {}
        if self._fanout is not None:
            self._fanout.pause()
        log.info("session %s: transport %s; orphaned for up to %g s",
                 self._log_name, why, self.settings.reconnect_grace_s)
        self._timer.orphan()
        self._set_state(SessionState.ORPHANED)
        self._spawn(self._discard(pc, tracks, tasks))

    async def _on_grace_expired(self, orphaned_at: float) -> None:
        if self._lock.locked():
            # A reconnect is being answered: the client came back in time.
            try:
                await asyncio.wait_for(self._lock.acquire(), self.NEGOTIATION_WAIT_S)
                self._lock.release()
            except asyncio.TimeoutError:
                pass
        if self._state == SessionState.ORPHANED and self._timer.orphaned_at == orphaned_at:
            await self.close(
                EndReason.TIMEOUT,
                f"the client did not reconnect within {self.settings.reconnect_grace_s:g} s",
            )

    async def request_stop_on_close(self, window_s: float = 5.0) -> bool:
        """A stop that may mean this session (a `stop_session` naming none).

        Orphaned within the last `window_s`: the client closed and then stopped, so
        end it now. Otherwise, if its transport is lost within the next `window_s`,
        end it then instead of orphaning it. Returns whether it applied (False for an
        ended session, or one orphaned longer ago)."""
        if self.ended.is_set() or self._closing is not None or self._finishing:
            return False
        if self._state == SessionState.ORPHANED:
            if self._timer.orphaned_within(window_s):
                await self.close(EndReason.CLIENT_CLOSED, "the client stopped the session")
                return True
            return False
        self._timer.stop_on_close(window_s)
        return True

    # ---- the data channel -------------------------------------------------------

    def _on_channel_message(self, label: str, raw: str | bytes) -> None:
        # Any inbound frame, even one we cannot read, shows the client is alive.
        self._timer.silence.heard()
        # Decoding, routing and the per-session command rate limit live in
        # inbound_channel.py, whose handler never raises: an exception out of an aiortc
        # "message" handler closes the whole transport.
        try:
            self.inbound.on_message(label, raw)
        except Exception:  # only if making the handler failed: on_message itself is total
            log.exception("session %s: could not handle a %s frame", self._log_name, label)

    @property
    def inbound(self) -> InboundHandler:
        """The handler of this session's inbound frames, made on first use; it lives as
        long as the session, so its rate limit survives reconnects."""
        if self._inbound is None:
            self._inbound = self._make_inbound()
        return self._inbound

    def _make_inbound(self) -> InboundHandler:
        # The handler reads the peer through these small closures only, so that the peer's
        # session (opened after the first offer) and channels (replaced on reconnect) are
        # looked up per frame.
        def command(
            name: str, args: dict[str, Any], command_id: str | int | None, *, reply: bool = False
        ) -> str | int | None:
            session = self.session
            if session is None:
                if reply:  # nothing will answer it: say why rather than leave it waiting
                    self._emit_runtime("commandError", {
                        **command_error(name, "the session is not open yet",
                                        [{"field": None, "rule": "not_open", "value": None}]),
                        "id": command_id,
                    })
                return command_id
            return session.command(name, args, command_id, reply=reply).id

        def report_latency(command_id: Any, latency_ms: Any) -> str | None:
            session = self.session
            if session is None:
                return "no session"
            return session.report_latency(command_id, latency_ms)

        def send_control(text: str) -> None:
            channel = self._channels.get("control")
            if channel is not None and channel.readyState == "open":
                channel.send(text)

        def ignored() -> None:
            self.ignored_frames += 1

        def coalesced() -> None:
            session = self.session
            if session is not None:
                session.count_coalesced()

        def on_command(
            name: str, args: Any, error: dict[str, Any] | None, command_id: str | int | None
        ) -> None:
            recordings = self.recordings
            if recordings is not None:
                recordings.command(name, args, error, command_id)

        def recording(type_: str, data: dict[str, Any]) -> None:
            recordings = self.recordings
            if recordings is not None:
                recordings.request(type_, data)
            else:
                self._emit_runtime("recordingError", command_error(
                    type_, "the session is not open yet", [{"field": None, "rule": "not_open", "value": None}]
                ))

        return InboundHandler(
            session_id=self.id,
            command=command,
            send=self._outbox.send,
            send_control=send_control,
            spec=lambda: self.host.spec,
            on_ignored=ignored,
            report_latency=report_latency,
            on_command=on_command,
            recording=recording,
            on_coalesced=coalesced,
            send_frame=self._send_frame,
            files=self._uploaded_file,
            track_control=self._control_track,
            clips=self._request_clip,
            steps=self._request_step if self.stepped else None,
            step_bytes=wire_v1.STEP_MAX_MESSAGE_BYTES,
        )

    def _request_clip(self, seconds: float | None, answer: Callable[[Any], None]) -> bool:
        recordings = self.recordings
        if recordings is None:
            return False
        recordings.request_clip(seconds, answer)
        return True

    def _control_track(self, event: str, name: str) -> None:
        # The current connection's tracks only: a new connection starts every track
        # flowing (the official SDK resumes its tracks on each connect).
        for track in self._pc_tracks:
            if getattr(track, "name", None) != name or not hasattr(track, "pause"):
                continue
            if event == "pause_track":
                track.pause()
            else:
                track.resume()

    def _uploaded_file(self, upload_id: str) -> UploadedFile | str:
        uploads = self.uploads
        if uploads is None:
            return "this session takes no uploads"
        return uploads.file(upload_id)

    def _send_frame(self, label: str, frame: bytes) -> None:
        self._outbox.send(frame, label)

    def _inbound_limit(self) -> int:
        """The most one message from the client may weigh on a chunked connection: a
        step's input frames make it big; anything else keeps to the frame bound."""
        return wire_v1.STEP_MAX_MESSAGE_BYTES if self.stepped else channel_codec.MAX_MESSAGE_BYTES

    @property
    def stepped(self) -> bool:
        return self.generation == "stepped"

    def _message_limit(self) -> int:
        """The most one message on "data" may weigh for this client now."""
        channel = self._channels.get("data")
        return int(getattr(channel, "limit", dc_chunking.DEFAULT_LIMIT))

    def _request_step(self, request_id: str, request: Any) -> None:
        steps = self.steps
        if steps is None:
            self._send_frame(wire_v1.DATA, wire_v1.step_failed(
                request_id, StepFailure.NOT_READY, "the session is not open yet: connect first"))
            return
        steps.request(request_id, request)

    @property
    def wire(self) -> Wire:
        """The wire the client speaks on its connection now (v0 until it has spoken)."""
        inbound = self._inbound
        return inbound.wire if inbound is not None and inbound.wire is not None else Wire.V0

    def _emit(self, envelope: dict[str, Any], text: str) -> None:
        """One message to the client (loop thread): `text` is its v0 frame, sent as is
        on wire v0 and translated on wire v1, which leaves out what it has no message for."""
        if self.wire is Wire.V1:
            try:
                frames = wire_v1.from_envelope(envelope)
            except channel_codec.ProtocolError:
                log.exception("session %s: a message cannot travel on wire v1", self._log_name)
                return
            for label, frame in frames:
                self._outbox.send(frame, label)
        elif (envelope.get("data") or {}).get("type") != "commandAccepted":
            self._outbox.send(text)

    def send_message(self, payload: dict[str, Any]) -> None:
        """An application-scope message to the client, as a model's `send` makes one
        (`{"type", "data"}`): the server's own notices, such as a time limit nearing.
        Held until the channel opens, like every message."""
        try:
            text = channel_codec.application(payload)
        except channel_codec.ProtocolError:
            log.exception("session %s: a %s message is not JSON", self._log_name, payload.get("type"))
            return
        self._emit({"scope": "application", "data": payload}, text)

    def _emit_runtime(self, type_: str, data: dict[str, Any]) -> None:
        try:
            text = channel_codec.runtime(type_, data)
        except channel_codec.ProtocolError:
            log.exception("session %s: a %s message is not JSON", self._log_name, type_)
            return
        self._emit({"scope": "runtime", "data": {"type": type_, "data": data}}, text)


    # ---- what the model session sends: called from the model's threads -------------

    def _deliver(self, envelope: dict[str, Any]) -> None:
        data = envelope["data"]
        if envelope.get("scope") == "runtime":
            if data.get("type") == "sessionEnded":
                self._farewell_queued = True
            recordings = self.recordings
            if data.get("type") == "commandError" and recordings is not None and self._loop is not None:
                # The recording's command log marks the command it names rejected.
                self._loop.call_soon_threadsafe(recordings.command_error, data.get("data"))
            text = channel_codec.runtime(data["type"], data.get("data", {}))
        else:
            text = channel_codec.application(data)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._emit, envelope, text)
            viewers = self.viewers
            if viewers is not None and ViewerRoom.shares(envelope):
                ending = envelope.get("scope") == "runtime" and data.get("type") == "sessionEnded"
                loop.call_soon_threadsafe(viewers.broadcast, text, ending)

    def _model_ended(self, reason: str, detail: str | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_model_ended, reason, detail)

    def _on_model_ended(self, reason: str, detail: str | None) -> None:
        self._spawn(self._finish(reason, detail))

    def _on_fanout_error(self, exc: BaseException) -> None:
        self._spawn(
            self.close(EndReason.ERROR, f"sending the output failed: {type(exc).__name__}: {exc}")
        )

    # ---- ending -----------------------------------------------------------------

    async def close(self, reason: str = EndReason.CLIENT_CLOSED, message: str | None = None) -> None:
        """End the session now (whatever its state) and wait until it is cleaned up.

        The model is told `@disconnected`; the client gets `sessionEnded{reason,
        message}` first if its data channel is open. Every wait is bounded, and a
        cancelled caller does not leave the session half-closed."""
        if self.ended.is_set():
            return
        if self._closing is None:
            self._closing_for = (reason, message)
            self._closing = self._spawn(self._close(reason, message))
        await asyncio.shield(self._closing)

    async def _close(self, reason: str, message: str | None) -> None:
        self._timer.stop()
        if self._pc is not None and self._timer.silence.waiting_for_connection:
            # The client gave up (or the session ended) while its connection came up:
            # where it got to tells a lost candidate from a path that does not carry.
            log.info("session %s: ended before its connection came up (%s)",
                     self._log_name, self._pc_states())
        opening = self._opening
        if opening is not None and not opening.done():
            await asyncio.wait({opening}, timeout=self.CLOSE_TIMEOUT_S)
            # Still opening (its model is being restarted): what it opens later is
            # ended by `_open`, not left holding the model's seat.
            self._open_abandoned = not opening.done()
        session = self.session
        if session is not None and not session.ended.is_set():
            ending = self._spawn(self.host.end_session(session, reason, message))
            done, _ = await asyncio.wait({ending}, timeout=self.CLOSE_TIMEOUT_S)
            if not done:
                log.warning("session %s: the model thread did not end the session within "
                            "%.0f s; ending it here", self._log_name, self.CLOSE_TIMEOUT_S)
            elif ending.cancelled() or ending.exception() is not None:
                log.warning("session %s: ending the model session failed", self._log_name)
        await self._finish(reason, message)

    async def _finish(self, reason: str, detail: str | None) -> None:
        if self._finishing:
            await self.ended.wait()
            return
        self._finishing = True
        self.end_reason, self.end_detail = reason, detail
        if not self._farewell_queued:
            # The model thread did not send it (gone, stuck, or never connected).
            self._farewell_queued = True
            if self.wire is Wire.V1:
                label, frame = wire_v1.CONTROL, wire_v1.session_ended(
                    f"{reason}: {detail}" if detail else reason
                )
            else:
                label, frame = "data", farewell.session_ended(reason, detail)
            channel = self._channels.get(label)
            if channel is not None and channel.readyState == "open":
                channel.send(frame)
        for label in ("data", "control") if self.wire is Wire.V1 else ("data",):
            channel = self._channels.get(label)
            if channel is not None and channel.readyState == "open":
                await farewell.drain(channel, self.FAREWELL_S)
        self._timer.stop()
        stats = self._stats_task
        if stats is not None and stats is not asyncio.current_task():
            stats.cancel()
        pc, tracks, tasks = self._pc, self._pc_tracks, self._pc_tasks
        self._pc, self._pc_tracks, self._pc_tasks = None, [], []
        await self._discard(pc, tracks, tasks)
        for conn in self._candidates.connections():
            if conn.pc is not None and conn.pc is not pc:
                await self._discard(conn.pc, [])  # an offer abandoned mid-way
                conn.pc = None
        if self.viewers is not None:
            await self.viewers.close(reason, detail)
        if self.recordings is not None:
            # Bounded: the files are complete once the session has ended.
            await self.recordings.close(reason)
        if self.step_store is not None:
            self.step_store.close()
        if self._fanout is not None:
            await self._fanout.stop()
        self._set_state(SessionState.ENDED)
        self.ended.set()
        if self.on_end is not None:
            try:
                self.on_end(self)
            except Exception:
                log.exception("on_end callback failed")

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_interval_s)
            if self.session is None or self._fanout is None:
                continue
            if self._state != SessionState.STREAMING:
                continue  # nobody to show them to
            stats = self.stats()
            stats["connections"] = self.connections
            try:
                text = channel_codec.runtime("stats", stats)
                self._emit({"scope": "runtime", "data": {"type": "stats", "data": stats}}, text)
                if self.viewers is not None:
                    self.viewers.broadcast(text)
            except channel_codec.ProtocolError:
                log.exception("session %s: stats are not JSON", self._log_name)

    def stats(self) -> dict[str, Any]:
        """The model session's stats, with this session's output, viewers and recordings."""
        data = self.session.stats() if self.session is not None else {}
        if self._fanout is not None:
            data["superseded"] = self._fanout.superseded()
        if self.viewers is not None:
            data.update(self.viewers.stats())
        if self.recordings is not None and self.recordings.enabled:
            data.update(self.recordings.stats())
        return data


class _Sink:
    """The model session's SessionSink for a PeerSession (whose `ended` is an Event)."""

    def __init__(self, peer: PeerSession) -> None:
        self._peer = peer

    def message(self, envelope: dict[str, Any]) -> None:
        self._peer._deliver(envelope)

    def ended(self, reason: str, detail: str | None) -> None:
        self._peer._model_ended(reason, detail)
