"""`SeatedSessionBackend`: the sessions of one model host, one live per seat.

It implements the `SessionBackend` contract (sessions/contract.py) for `reactor run`
and for each Serve replica: a host has one seat, or `sessions_per_replica` seats over
one loaded model (runtime/seats.py), and each seat serves one live session at a time.
An orphaned session counts as live, holding its seat, until its client reconnects or
its grace ends.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reactor_serve.protocol.errors import (
    NOT_CONNECTED_FOR_UPLOADS,
    UNKNOWN_UPLOAD,
    BackendError,
    ClipGone,
    ModelBusy,
    ModelUnavailable,
    NegotiationFailed,
    UnknownClip,
    UnknownSession,
    UnknownStep,
    UnknownUpload,
    UploadRejected,
    session_ended,
)
from reactor_serve.rtc.ice_servers import client_ice_servers, session_ice_servers
from reactor_serve.rtc.node_network import with_node_network
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.runtime.native_memory import release_freed_memory
from reactor_serve.runtime.session import EndReason
from reactor_serve.sessions.contract import (
    AnswerPending,
    ClientIdentity,
    SdpAnswer,
    SessionEvents,
    SessionInfo,
    SessionState,
    mask_session_id,
)
from reactor_serve.sessions.negotiations import Negotiations
from reactor_serve.sessions.recording.served_clips import ServedClips
from reactor_serve.sessions.session_steps import check_steppable
from reactor_serve.sessions.step_store import StepSettings, StepStore
from reactor_serve.sessions.time_limit import TimeLimit
from reactor_serve.sessions.uploads.settings import UploadSettings
from reactor_serve.sessions.uploads.store import SessionUploads
from reactor_serve.sessions.viewers.links import ViewerLinks

if TYPE_CHECKING:
    from reactor_serve.rtc.settings import WebRTCSettings
    from reactor_serve.runtime.session import SessionHost
    from reactor_serve.sessions.peer_session import PeerSession
    from reactor_serve.sessions.viewers.room import ViewerRoom

__all__ = ["HeldSession", "SeatedSessionBackend"]

log = logging.getLogger("reactor_serve.sessions.seated_sessions")

PeerFactory = Callable[..., "PeerSession"]


def _default_peer_factory() -> PeerFactory:
    # Imported here, not at the module's top: tests that swap in a fake never pay for
    # aiortc. A real backend imports it when it is made (see __init__).
    from reactor_serve.sessions.peer_session import PeerSession

    return PeerSession


class _Slot:
    """One session of the SeatedSessionBackend: its seat, its PeerSession and its
    negotiations."""

    def __init__(
        self,
        seat: SessionHost,
        info: SessionInfo,
        client: ClientIdentity,
        peer: PeerSession,
        negotiations: Negotiations,
        uploads: SessionUploads,
    ) -> None:
        self.seat = seat
        self.info = info
        self.client = client
        # None once the session has ended (SeatedSessionBackend._release).
        self.peer: PeerSession | None = peer
        self.negotiations = negotiations
        self.uploads = uploads
        self.closing: asyncio.Task[None] | None = None
        # A stepped session's kept steps; they outlive it as long as its record does.
        self.steps: StepStore | None = None
        self.time_limit: TimeLimit | None = None

    def ended_error(self) -> UnknownSession:
        return session_ended(self.info.session_id, self.info.end_reason, self.info.end_message)


@dataclasses.dataclass(frozen=True)
class HeldSession:
    """What the backend still holds of one session, read-only: for operators and for
    checking that an ended session leaves nothing heavy behind."""

    info: SessionInfo
    # None once the session has ended.
    peer: PeerSession | None
    # The tasks answering its offers, oldest first; None for each once it has ended.
    answering: tuple[asyncio.Task[str] | None, ...]


class SeatedSessionBackend:
    """A `SessionBackend` for one model host (the model in its own process, or in
    this one): one live session per seat.

    An orphaned session is live: it holds its seat (and its state) until its client
    reconnects or the grace ends, so with every seat held a new session gets 409 with
    a Retry-After of the soonest grace or offer wait to end. Ended sessions are remembered (bounded), so a late
    poll, offer or stop learns that the session ended and why.
    """

    # How long after a session ends its freed memory is handed back to the OS.
    TRIM_DELAY_S = 0.5
    # Ended sessions remembered, so late polls and stops get a clear answer.
    KEEP_ENDED = 32
    # `stop_unnamed`: how recent a transport loss counts as "the client just closed",
    # and how long a later one still counts as the stop's.
    STOP_UNNAMED_WINDOW_S = 5.0
    # Retry-After for a model that is not loaded.
    UNAVAILABLE_RETRY_S = 5.0
    # How long a poll for an answer being made waits for it before saying "pending".
    ANSWER_HOLD_S = 1.0

    def __init__(
        self,
        host: SessionHost,
        settings: WebRTCSettings,
        *,
        offer_timeout_s: float = 30.0,
        peer_factory: PeerFactory | None = None,
    ) -> None:
        self._host = host
        # A `SeatedHost` offers its seats; any other `SessionHost` is one seat.
        self._seats: list[SessionHost] = list(getattr(host, "seats", None) or [host])
        # This node's address, port range and transport policy (environment) win; a
        # malformed one fails here, where `reactor run` or a Serve replica starts.
        self._settings = with_node_network(settings)
        self._offer_timeout_s = offer_timeout_s
        # The real one is imported now, as the server starts: imported on the first
        # session instead (aiortc, PyAV, protobuf), it would delay that session's answer.
        self._peer_factory = peer_factory or _default_peer_factory()
        # The model's `recording` settings, validated, for every session's recorder
        # (sessions/recording/recorder.py); None: read from the model config per session.
        self.recording_override: dict[str, Any] | None = None
        # The model config's `uploads` bounds; a bad section fails here, at start.
        self.upload_settings = UploadSettings.from_config(
            getattr(host, "config", None), source=f"model {host.spec.name}"
        )
        # Where stepped sessions keep their steps (sessions/step_store.py), checked now.
        self.step_settings = StepSettings.from_config(
            getattr(host, "config", None), source=f"model {host.spec.name}"
        )
        # Told each session's state changes (usage metering); None: nobody listens.
        self.events: SessionEvents | None = None
        # The live sessions (an orphaned one included), by id, one per seat at most.
        self._live: dict[str, _Slot] = {}
        self._ended: collections.OrderedDict[str, _Slot] = collections.OrderedDict()
        # Tasks we start, referenced until done (the loop keeps weak references).
        self._tasks: set[asyncio.Task[Any]] = set()
        self.viewer_links: ViewerLinks[_Slot] = ViewerLinks(
            _room_of,
            lambda slot: self._live.get(slot.info.session_id) is slot and slot.closing is None,
            max_viewers=self._settings.max_viewers,
            model_name=host.spec.name,
        )

    # ---- SessionBackend --------------------------------------------------------------

    @property
    def spec(self) -> ModelSpec:
        return self._host.spec

    @property
    def healthy(self) -> bool:
        return self._host.healthy

    @property
    def settings(self) -> WebRTCSettings:
        return self._settings

    async def create_session(
        self,
        extra_args: dict[str, Any],
        client: ClientIdentity | None = None,
        *,
        session_id: str | None = None,
        generation: str = "streamed",
        max_duration_s: float | None = None,
        ends_at: float | None = None,
    ) -> SessionInfo:
        """Reserve a free seat for a new session (state `created`). `session_id`: an id chosen by
        the caller (a Serve replica takes the ingress's), else a fresh random one.
        `max_duration_s` (from now) or `ends_at` (wall-clock seconds, as the ingress
        fixed it when the session was created): when the session is ended with
        `sessionEnded{reason: "limit"}`, warned a minute before (sessions/time_limit.py)."""
        check_steppable(self.spec, generation)
        if not self._host.healthy:
            error = self._host.load_error
            raise ModelUnavailable(
                f"model {self.spec.name} is not loaded"
                + (f": {error}" if error is not None else ""),
                retry_after_s=None if error is not None else self.UNAVAILABLE_RETRY_S,
            )
        seat = self._free_seat()
        if seat is None:
            raise self._all_seats_busy()
        sid = session_id or secrets.token_urlsafe(16)
        if sid in self._ended:
            raise self._ended[sid].ended_error()
        if sid in self._live:
            raise ModelBusy(f"session {sid[:64]!r} already exists", retry_after_s=None)
        info = SessionInfo(
            session_id=sid,
            state=SessionState.CREATED,
            created_at=time.time(),
            extra_args=dict(extra_args),
            generation=generation,
        )
        peer = self._peer_factory(
            seat,
            self._settings,
            session_id=sid,
            on_end=self._on_peer_end,
            on_state=self._on_peer_state,
        )
        # Start options (`record`, sessions/recording/recorder.py) travel with the peer.
        peer.extra_args = dict(extra_args)
        peer.generation = generation
        steps = StepStore(self.step_settings, self.spec.name, sid) if generation == "stepped" else None
        peer.step_store = steps
        peer.recording_override = self.recording_override
        uploads = SessionUploads(self.upload_settings)
        # The peer's commands name uploads by id (sessions/uploads/arguments.py).
        peer.uploads = uploads
        slot = self._live[sid] = _Slot(
            seat, info, client or ClientIdentity(""), peer,
            Negotiations(sid, self._offer_timeout_s), uploads,
        )
        slot.steps = steps
        self._arm_expiry(slot)
        self._tell(slot, SessionState.CREATED)
        if max_duration_s is not None and ends_at is None:
            ends_at = info.created_at + max_duration_s
        if ends_at is not None:
            slot.time_limit = TimeLimit(
                ends_at, warn=peer.send_message,
                end=lambda message: self.end_session(sid, EndReason.LIMIT, message))
            slot.time_limit.start()
        return _snapshot(slot)

    async def get_session(self, session_id: str) -> SessionInfo:
        return _snapshot(self._slot(session_id))

    def live_sessions(self) -> list[SessionInfo]:
        return [_snapshot(slot) for slot in self._live.values()]

    async def submit_offer(
        self,
        session_id: str,
        sdp_offer: str,
        track_mapping: list[dict[str, Any]],
        connection_id: int | None = None,
    ) -> int:
        slot = self._live_slot(session_id)
        negotiations = slot.negotiations
        if connection_id is not None and not negotiations.knows(connection_id):
            raise negotiations.unknown_connection(connection_id)
        # A malformed offer is refused here (400) and changes nothing: no
        # negotiation, the offer expiry keeps running.
        slot.peer.validate_offer(sdp_offer, track_mapping)
        return negotiations.offer(
            connection_id,
            lambda cid: self._spawn(
                self._negotiate(slot, sdp_offer, track_mapping, cid),
                name=f"reactor-offer-{cid}",
            ),
        )

    async def register_connection(self, session_id: str) -> int:
        return self._live_slot(session_id).negotiations.register()

    async def poll_answer(
        self, session_id: str, connection_id: int | None
    ) -> SdpAnswer | AnswerPending:
        slot = self._slot(session_id)
        negotiations = slot.negotiations
        if slot.info.state == SessionState.ENDED:
            if connection_id is not None and not negotiations.knows(connection_id):
                raise negotiations.unknown_connection(connection_id)
            # An answer to a session that is over would only mislead the client.
            raise slot.ended_error()
        answer = negotiations.poll(connection_id)
        if isinstance(answer, AnswerPending) and answer.status.get("status") == "pending":
            # The answer is being made: hand it over the moment it is, rather than
            # have the client come back after its poll interval (the official SDK
            # waits 200 ms after its first poll, longer than answering takes).
            await negotiations.wait_answer(connection_id, self.ANSWER_HOLD_S)
            if slot.info.state == SessionState.ENDED:
                raise slot.ended_error()
            answer = negotiations.poll(connection_id)
        return answer

    async def add_ice_candidates(
        self,
        session_id: str,
        connection_id: int | None,
        candidates: list[Any],
        is_final: bool,
    ) -> None:
        slot = self._live_slot(session_id)
        if connection_id is not None and not slot.negotiations.knows(connection_id):
            raise slot.negotiations.unknown_connection(connection_id)
        # Parsed and checked at once: a malformed candidate is a 400 and nothing of
        # its batch is kept, so it cannot poison a later offer.
        await slot.peer.add_ice_candidates(candidates, is_final, connection_id=connection_id)

    async def stop_session(self, session_id: str) -> None:
        await self.end_session(session_id, EndReason.CLIENT_CLOSED, None)

    async def end_session(self, session_id: str, reason: str, message: str | None = None) -> None:
        """End the session now with `reason` (sent as `sessionEnded{reason, message}`);
        a no-op for an ended one. Raises UnknownSession."""
        slot = self._slot(session_id)
        if slot.info.state == SessionState.ENDED:
            return
        await self._close(slot, reason, message)

    async def stop_unnamed(self, client: ClientIdentity) -> int:
        stopped = 0
        for slot in list(self._live.values()):
            if slot.client != client or slot.closing is not None or slot.peer is None:
                continue
            if await slot.peer.request_stop_on_close(self.STOP_UNNAMED_WINDOW_S):
                stopped += 1
        return stopped

    async def describe_sessions(self) -> list[dict[str, Any]]:
        entries = []
        for slot in self._live.values():
            entry: dict[str, Any] = {
                "session_id": mask_session_id(slot.info.session_id),
                "state": slot.info.state,
                "created_at": slot.info.created_at,
                "connections": getattr(slot.peer, "connections", 0),
                "where": "local",
                "seat": self.seat_of(slot.info.session_id),
            }
            if slot.info.state == SessionState.ORPHANED:
                entry["reconnect_within_s"] = self._busy_for(slot)
            entries.append(entry)
        return entries

    async def health(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "healthy": self._host.healthy,
            "live_sessions": len(self._live),
            "seats": len(self._seats),
            "model": self.spec.name,
        }
        if self._host.ranks > 1:
            # What each rank process is doing (a failed rank restarts them all).
            report["ranks"] = {
                "expected": self._host.ranks,
                "running": {str(r.rank): {"pid": r.pid, "activity": r.activity}
                            for r in self._host.rank_processes()},
            }
        if self._host.load_error is not None:
            report["load_error"] = str(self._host.load_error)
        return report

    def ice_servers(self, session_id: str) -> list[dict[str, Any]]:
        return client_ice_servers(session_ice_servers(self._settings.ice_servers, session_id))

    def capacity(self) -> dict[str, int]:
        """The same shape as a Serve model's capacity in `GET /models`: one replica
        (this process; none once the model is gone), busy once every seat holds a live
        session (an orphaned one included), its seats used and free, and no queue: a
        session with every seat taken gets 409."""
        replicas = 1 if self._host.healthy else 0
        used = len(self._live) if replicas else 0
        seats = len(self._seats) * replicas
        busy = 1 if replicas and used >= seats else 0
        return {"replicas": replicas, "starting": 0, "busy": busy, "free": replicas - busy,
                "waiting": 0, "max_replicas": 1, "seats_per_replica": len(self._seats),
                "seats_used": used, "seats_free": seats - used}

    # ---- UploadBackend ---------------------------------------------------------------

    async def create_upload(self, session_id: str, name: str, size: int, mime_type: str) -> str:
        slot = self._live_slot(session_id)
        # As on Serve, where no replica holds a session before its first offer.
        if slot.info.state == SessionState.CREATED:
            raise UploadRejected(NOT_CONNECTED_FOR_UPLOADS)
        return slot.uploads.reserve(name, size, mime_type)

    async def upload_size(self, upload_id: str) -> int:
        return self._uploads_of(upload_id).size_of(upload_id)

    async def write_upload(self, upload_id: str, data: bytes) -> None:
        self._uploads_of(upload_id).write(upload_id, data)

    def _uploads_of(self, upload_id: str) -> SessionUploads:
        for slot in self._live.values():
            if slot.closing is None and slot.uploads.owns(upload_id):
                return slot.uploads
        raise UnknownUpload(UNKNOWN_UPLOAD)

    # ---- ClipBackend -------------------------------------------------------------------

    async def clip_playlist(self, session_id: str, start: float, end: float) -> str | float:
        clips = self._served_clips(session_id)
        return await asyncio.to_thread(clips.playlist, start, end)

    async def clip_chunk(self, session_id: str, name: str) -> bytes:
        clips = self._served_clips(session_id)
        return await asyncio.to_thread(clips.chunk, name)

    # ---- StepBackend -------------------------------------------------------------------

    async def kept_steps(self, session_id: str) -> list[int]:
        return self._step_store(session_id).steps()

    async def kept_step(self, session_id: str, step: int) -> dict[str, Any]:
        return self._step_store(session_id).result(step)

    async def kept_step_file(self, session_id: str, step: int, name: str) -> tuple[bytes, str]:
        return await asyncio.to_thread(self._step_store(session_id).file, step, name)

    def _step_store(self, session_id: str) -> StepStore:
        store = self._slot(session_id).steps
        if store is None:
            raise UnknownStep("this session is not stepped: it keeps no steps")
        return store

    def _served_clips(self, session_id: str) -> ServedClips:
        slot = self._slot(session_id)
        if not self._is_live(slot) or slot.info.state == SessionState.ENDED or slot.peer is None:
            raise ClipGone(f"session {session_id} has ended: its clips are gone")
        recordings = slot.peer.recordings
        if recordings is None:
            raise UnknownClip("this session has no clips")
        return recordings.served

    # ---- ViewerBackend: watch-only links ----------------------------------------------

    async def viewer_link(self, session_id: str) -> dict[str, Any]:
        return self.viewer_links.mint(self._live_slot(session_id))

    async def revoke_viewers(self, session_id: str) -> bool:
        return await self.viewer_links.revoke(self._live_slot(session_id))

    async def watch_info(self, viewer_token: str) -> dict[str, Any]:
        slot, room = self.viewer_links.watched(viewer_token)
        return {"state": slot.info.state, "viewers": room.count, "max_viewers": room.max_viewers}

    async def watch_offer(
        self, viewer_token: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        return self.viewer_links.watched(viewer_token)[1].offer(sdp_offer, track_mapping)

    async def watch_poll(self, viewer_token: str, connection_id: int) -> SdpAnswer | AnswerPending:
        return self.viewer_links.watched(viewer_token)[1].poll(connection_id)

    async def watch_ice_servers(self, viewer_token: str) -> list[dict[str, Any]]:
        self.viewer_links.watched(viewer_token)
        # Minted for the token: a TURN username never carries the session id.
        return client_ice_servers(session_ice_servers(self._settings.ice_servers, viewer_token))

    # ---- for the Serve replica and operators ----------------------------------------

    def seat_of(self, session_id: str) -> int:
        """The seat (0-based) the live session `session_id` holds. Raises UnknownSession."""
        slot = self._live.get(session_id)
        if slot is None:
            raise UnknownSession(f"session {str(session_id)[:64]!r} is not live")
        return self._seats.index(slot.seat)

    def live_peer(self, session_id: str) -> PeerSession | None:
        """The live session's PeerSession, or None when it is not live."""
        slot = self._live.get(session_id)
        return slot.peer if slot is not None else None

    def ended_sessions(self) -> list[HeldSession]:
        """What is still held of the ended sessions remembered, oldest first."""
        return [
            HeldSession(_snapshot(slot), slot.peer, tuple(slot.negotiations.tasks()))
            for slot in self._ended.values()
        ]

    def stats(self, session_id: str) -> dict[str, Any]:
        """The live session's numbers (fps, queue depth, ...), or {} when it is not
        live or not connected yet."""
        slot = self._live.get(session_id)
        if slot is None or slot.peer is None or slot.info.state in (
            SessionState.CREATED, SessionState.ENDED
        ):
            return {}
        return slot.peer.stats()

    def input_latencies(self, session_id: str, since: int) -> tuple[list[float], int]:
        """Input-to-frame latencies (ms) the session's client reported after its first
        `since`, and how many it has reported in all: for a metric that observes each."""
        try:
            session = getattr(self._slot(session_id).peer, "session", None)
        except UnknownSession:
            session = None
        if session is None:
            return [], since
        return session.input_latency.since(since), session.input_latency.count

    async def wait_ended(self, session_id: str, timeout: float) -> bool:
        """Wait up to `timeout` s for the session to end; whether it has."""
        slot = self._slot(session_id)
        peer = slot.peer
        if slot.info.state != SessionState.ENDED and peer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(peer.ended.wait()), timeout)
            except asyncio.TimeoutError:
                pass
        return slot.info.state == SessionState.ENDED or peer is None or peer.ended.is_set()

    # ---- lifecycle -------------------------------------------------------------------

    async def aclose(self) -> None:
        """End every live session, streaming or orphaned (server shutdown): each
        client gets `sessionEnded{reason: "shutdown"}` before its transport closes."""
        await asyncio.gather(*(
            self._close(slot, EndReason.SHUTDOWN, "the server is shutting down")
            for slot in list(self._live.values())
        ))

    # ---- internals -------------------------------------------------------------------

    def _spawn(self, coro: Any, name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _is_live(self, slot: _Slot) -> bool:
        return self._live.get(slot.info.session_id) is slot

    def _free_seat(self) -> SessionHost | None:
        taken = {id(slot.seat) for slot in self._live.values()}
        return next((seat for seat in self._seats if id(seat) not in taken), None)

    def _all_seats_busy(self) -> ModelBusy:
        """Every seat holds a session: retry when the soonest of them may free its
        seat (an orphan's grace, an offer's wait), if any is known."""
        waits = [w for w in map(self._busy_for, self._live.values()) if w is not None]
        orphaned = all(s.info.state == SessionState.ORPHANED for s in self._live.values())
        if len(self._seats) == 1:
            what = "busy with another session"
        else:
            what = f"busy: all {len(self._seats)} seats hold a session"
        return ModelBusy(
            f"model {self.spec.name} is {what}"
            + (" (waiting for its client to reconnect)" if orphaned and len(self._seats) == 1
               else ""),
            retry_after_s=min(waits) if waits else None,
        )

    def _slot(self, session_id: str) -> _Slot:
        live = self._live.get(session_id) if isinstance(session_id, str) else None
        if live is not None:
            return live
        slot = self._ended.get(session_id) if isinstance(session_id, str) else None
        if slot is None:
            raise UnknownSession(f"unknown session {str(session_id)[:64]!r}")
        return slot

    def _live_slot(self, session_id: str) -> _Slot:
        slot = self._slot(session_id)
        if not self._is_live(slot) or slot.info.state == SessionState.ENDED:
            raise slot.ended_error()
        if slot.closing is not None:
            raise UnknownSession(f"session {session_id} is ending")
        return slot

    def _busy_for(self, slot: _Slot) -> float | None:
        """Retry-After for a new session while `slot` holds the model."""
        if slot.info.state == SessionState.ORPHANED:
            left = slot.peer.grace_remaining()
            return None if left is None else max(1.0, round(left, 1))
        left = slot.negotiations.expires_in()
        return None if left is None else max(1.0, round(left, 1))

    async def _negotiate(
        self, slot: _Slot, sdp_offer: str, mapping: list[dict[str, Any]], cid: int
    ) -> str:
        from reactor_serve.runtime.host import SessionBusy

        peer = slot.peer
        if peer is None:  # the session ended before this task first ran
            raise slot.ended_error()
        try:
            answer = await peer.answer(sdp_offer, mapping, connection_id=cid)
        except (BackendError, SessionBusy) as exc:
            # The session may still get a good offer; if none comes, let it expire.
            if (
                not slot.negotiations.answered and self._is_live(slot)
                and slot.closing is None
            ):
                self._arm_expiry(slot)
            if isinstance(exc, SessionBusy):
                raise ModelBusy(str(exc)) from exc
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: answering the offer failed", mask_session_id(slot.info.session_id))
            message = f"could not answer the offer: {type(exc).__name__}: {exc}"
            if slot.closing is None and slot.info.state != SessionState.ENDED:
                slot.closing = self._spawn(self._finish(slot, EndReason.ERROR, message))
            raise NegotiationFailed(message) from exc
        slot.negotiations.mark_answered()
        return answer

    def _arm_expiry(self, slot: _Slot) -> None:
        slot.negotiations.arm_expiry(lambda: self._expire(slot))

    def _expire(self, slot: _Slot) -> None:
        # The table checked that no offer was answered or is being answered.
        if not self._is_live(slot) or slot.closing is not None:
            return
        timeout_s = slot.negotiations.timeout_s
        log.info("session %s got no usable offer within %.0f s; ending it",
                 mask_session_id(slot.info.session_id), timeout_s)
        slot.closing = self._spawn(
            self._finish(slot, EndReason.TIMEOUT, f"no usable offer within {timeout_s:g} s")
        )

    async def _close(self, slot: _Slot, reason: str, message: str | None) -> None:
        if slot.closing is None:
            slot.closing = self._spawn(self._finish(slot, reason, message))
        # Shielded: a client that hangs up mid-stop must not leave the slot half-closed.
        await asyncio.shield(slot.closing)

    async def _finish(self, slot: _Slot, reason: str, message: str | None) -> None:
        slot.negotiations.cancel_expiry()
        # Taken now: the peer's end (during its close) releases the seat, which lets
        # go of both.
        peer, negotiations = slot.peer, slot.negotiations.tasks()
        try:
            # The peer ends whatever it is doing, an offer being answered included,
            # and bounds every wait of its own.
            if peer is not None:
                await peer.close(reason, message)
        except Exception:
            log.exception("session %s: closing its peer failed", mask_session_id(slot.info.session_id))
        for task in negotiations:
            if task is not None and not task.done():
                task.cancel()
        if slot.info.state != SessionState.ENDED:
            slot.info.end_reason = slot.info.end_reason or reason
            slot.info.end_message = slot.info.end_message or message
            self._release(slot)

    def _slot_of(self, peer: PeerSession) -> _Slot | None:
        # A peer is made with its session's id (create_session).
        slot = self._live.get(peer.id)
        return slot if slot is not None and slot.peer is peer else None

    def _on_peer_state(self, peer: PeerSession, state: str) -> None:
        slot = self._slot_of(peer)
        if slot is not None and state != SessionState.ENDED and state != slot.info.state:
            slot.info.state = state
            self._tell(slot, state)

    def _tell(self, slot: _Slot, state: str) -> None:
        events = self.events
        if events is None:
            return
        frames = 0
        try:
            if slot.peer is not None:
                frames = int(slot.peer.stats().get("presented") or 0)
        except Exception:
            log.debug("no frame count for a state change", exc_info=True)
        try:
            events.session_state(slot.info.session_id, state, time.time(),
                                 reason=slot.info.end_reason, frames=frames)
        except Exception:
            log.exception("the session events listener failed")

    def _on_peer_end(self, peer: PeerSession) -> None:
        # The peer ended on its own (client gone past the grace, watchdog, model ended
        # or failed) or because we closed it; either way the model is free again.
        slot = self._slot_of(peer)
        if slot is None:
            return
        slot.info.end_reason = peer.end_reason
        slot.info.end_message = peer.end_detail
        log.info("session %s ended: %s", mask_session_id(slot.info.session_id), peer.end_reason)
        self._release(slot)

    def _release(self, slot: _Slot) -> None:
        if slot.time_limit is not None:
            slot.time_limit.cancel()
        if slot.info.state != SessionState.ENDED:
            self._tell(slot, SessionState.ENDED)
        self.viewer_links.forget(slot)
        # Uploaded bytes go with the session, whatever ended it.
        slot.uploads.clear()
        slot.info.state = SessionState.ENDED
        if self._is_live(slot):
            del self._live[slot.info.session_id]
        # A late poll, offer or stop needs the record and the connection ids only. The
        # peer (its aiortc connection, encoders, recorder, viewer room) and the
        # negotiations (a failed one's traceback holds the peer's frames) go now, not
        # when KEEP_ENDED newer sessions have pushed this one out.
        slot.peer = None
        slot.negotiations.release()
        self._ended[slot.info.session_id] = slot
        self._ended.move_to_end(slot.info.session_id)
        while len(self._ended) > self.KEEP_ENDED:
            self._ended.popitem(last=False)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop running (a test's direct call): nothing was served
        self._spawn(self._release_freed_memory(), name="release-freed-memory")

    async def _release_freed_memory(self) -> None:
        # The session's frames, encoders and connection were freed (the last of them as
        # aiortc's closing timers run out), but glibc keeps freed memory in its heaps
        # wherever live blocks sit above it, so a heap's top is rarely free and nothing
        # is trimmed, and RSS grows with every session while malloc's in-use bytes stay
        # flat (runtime/native_memory.py). Trimming once the session is gone hands it back;
        # during a session the heaps are reused as they are.
        await asyncio.sleep(self.TRIM_DELAY_S)
        try:
            await asyncio.to_thread(release_freed_memory)
        except RuntimeError:
            # The loop's default executor was shut down while the delay ran: the process
            # is ending (Serve stopped the replica), and its memory goes with it. Raised
            # here, it was a "Task exception was never retrieved" in every such replica.
            return


def _snapshot(slot: _Slot) -> SessionInfo:
    # A copy: callers must not see (or make) later changes to the live record.
    return dataclasses.replace(slot.info, extra_args=dict(slot.info.extra_args))


def _room_of(slot: _Slot) -> ViewerRoom | None:
    # A peer makes its room once it streams; an ended slot has no peer.
    return getattr(slot.peer, "viewers", None)


