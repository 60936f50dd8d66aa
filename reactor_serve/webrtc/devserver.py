"""`reactor run`: one model, in this process, behind the session HTTP API.

`LocalBackend` runs the sessions of one `ModelHost`: one live session at a time, as
the host allows. `create_app` wraps it in a FastAPI app that loads the model at
startup and serves PROTOCOL.md's routes at the root.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from reactor_serve.runtime.model_spec import ModelSpec
from reactor_serve.webrtc.backend import (
    AnswerPending,
    BackendError,
    ModelBusy,
    ModelUnavailable,
    OfferRejected,
    SessionInfo,
    UnknownSession,
)
from reactor_serve.webrtc.ice import client_ice_servers
from reactor_serve.webrtc.session_routes import add_session_middleware, session_routes
from reactor_serve.webrtc.settings import WebRTCSettings, WebRTCSettingsError
from reactor_serve.webrtc.web_page import (
    PLAYER_PAGE,
    asset_routes,
    page_response,
    wants_html,
)

if TYPE_CHECKING:
    from reactor_serve.runtime.host import ModelHost
    from reactor_serve.webrtc.peer import PeerSession

__all__ = ["LocalBackend", "ModelUnavailable", "NegotiationFailed", "create_app"]

log = logging.getLogger("reactor_serve.webrtc.devserver")

PeerFactory = Callable[..., "PeerSession"]


class NegotiationFailed(BackendError):
    """Answering an offer failed for a reason other than the offer itself."""

    status = 500


def _default_peer_factory() -> PeerFactory:
    # Imported late: aiortc costs import time, and tests swap in a fake.
    from reactor_serve.webrtc.peer import PeerSession

    return PeerSession


class _Slot:
    """One session of the LocalBackend and its negotiations."""

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.peer: PeerSession | None = None
        # connection id -> the task answering that offer (result: the SDP answer)
        self.negotiations: collections.OrderedDict[int, asyncio.Task[str]] = (
            collections.OrderedDict()
        )
        self.latest: int | None = None
        self.answered = False
        self.expiry: asyncio.TimerHandle | None = None
        # Candidates trickled before the first offer made the peer.
        self.early_candidates: list[tuple[list[Any], bool]] = []
        self.closing: asyncio.Task[None] | None = None


class LocalBackend:
    """A `SessionBackend` for one in-process `ModelHost`: one live session at a time."""

    # Negotiations kept per session for polls by connection id; older ones are dropped.
    KEEP_NEGOTIATIONS = 4
    # Ended sessions remembered, so late polls and stops get a clear answer.
    KEEP_ENDED = 32
    # How long closing a session waits for an offer being answered to finish first.
    NEGOTIATION_DRAIN_S = 10.0

    def __init__(
        self,
        host: ModelHost,
        settings: WebRTCSettings,
        *,
        offer_timeout_s: float = 30.0,
        peer_factory: PeerFactory | None = None,
    ) -> None:
        self._host = host
        self._settings = settings
        self._offer_timeout_s = offer_timeout_s
        self._peer_factory = peer_factory
        self._current: _Slot | None = None
        self._ended: collections.OrderedDict[str, _Slot] = collections.OrderedDict()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

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

    async def create_session(self, extra_args: dict[str, Any]) -> SessionInfo:
        self._loop = asyncio.get_running_loop()
        if not self._host.healthy:
            error = self._host.load_error
            raise ModelUnavailable(
                f"model {self.spec.name} is not loaded"
                + (f": {error}" if error is not None else "")
            )
        if self._current is not None:
            raise ModelBusy(f"model {self.spec.name} is busy with another session")
        info = SessionInfo(
            session_id=secrets.token_urlsafe(16),
            state="created",
            created_at=time.time(),
            extra_args=dict(extra_args),
        )
        slot = self._current = _Slot(info)
        self._arm_expiry(slot)
        return info

    def get_session(self, session_id: str) -> SessionInfo:
        return self._slot(session_id).info

    def live_sessions(self) -> list[SessionInfo]:
        return [self._current.info] if self._current is not None else []

    async def submit_offer(
        self, session_id: str, sdp_offer: str, track_mapping: list[dict[str, Any]]
    ) -> int:
        slot = self._slot(session_id)
        if slot is not self._current or slot.closing is not None:
            raise UnknownSession(f"session {session_id} has ended")
        if not isinstance(sdp_offer, str) or not sdp_offer.strip():
            raise OfferRejected("sdp_offer must be a non-empty SDP string")
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None
        if slot.peer is None:
            factory = self._peer_factory or _default_peer_factory()
            slot.peer = factory(
                self._host, self._settings, session_id=session_id, on_end=self._on_peer_end
            )
            for candidates, is_final in slot.early_candidates:
                await slot.peer.add_ice_candidates(candidates, is_final)
            slot.early_candidates.clear()
        if slot.info.state == "created":
            slot.info.state = "connecting"
        cid = next(self._ids)
        task = asyncio.get_running_loop().create_task(
            self._negotiate(slot, sdp_offer, track_mapping),
            name=f"reactor-offer-{session_id}-{cid}",
        )
        task.add_done_callback(_retrieve)
        # The newest offer is what a poll without a connection id sees from now on, so
        # a reconnect never hands out the previous connection's answer.
        slot.negotiations[cid] = task
        slot.latest = cid
        while len(slot.negotiations) > self.KEEP_NEGOTIATIONS:
            slot.negotiations.popitem(last=False)
        return cid

    async def add_ice_candidates(
        self, session_id: str, candidates: list[Any], is_final: bool
    ) -> None:
        slot = self._slot(session_id)
        if slot is not self._current or slot.closing is not None:
            raise UnknownSession(f"session {session_id} has ended")
        if slot.peer is None:
            slot.early_candidates.append((list(candidates), is_final))
        else:
            await slot.peer.add_ice_candidates(candidates, is_final)

    def poll_answer(self, session_id: str, connection_id: int | None) -> str | AnswerPending:
        slot = self._slot(session_id)
        cid = slot.latest if connection_id is None else connection_id
        if cid is None:
            return AnswerPending({"status": "awaiting_offer"})
        task = slot.negotiations.get(cid)
        if task is None:
            raise UnknownSession(f"unknown connection {cid} for session {session_id}")
        if not task.done():
            return AnswerPending({"status": "pending"})
        if task.cancelled():
            raise NegotiationFailed("the offer was abandoned: the session ended")
        error = task.exception()
        if error is not None:
            # A fresh exception per poll: re-raising one object grows its traceback.
            if isinstance(error, ModelBusy):
                raise ModelBusy(str(error), error.retry_after_s)
            if isinstance(error, BackendError):
                raise type(error)(str(error))
            raise NegotiationFailed(str(error))
        return task.result()

    async def stop_session(self, session_id: str) -> None:
        slot = self._slot(session_id)
        if slot.info.state == "ended":
            return
        await self._close(slot, "client_closed")

    def ice_servers(self) -> list[dict[str, Any]]:
        return client_ice_servers(self._settings.ice_servers)

    # ---- lifecycle -------------------------------------------------------------------

    async def aclose(self) -> None:
        """End the live session, if any (server shutdown)."""
        slot = self._current
        if slot is not None:
            await self._close(slot, "shutdown")

    # ---- internals -------------------------------------------------------------------

    def _slot(self, session_id: str) -> _Slot:
        current = self._current
        if current is not None and current.info.session_id == session_id:
            return current
        slot = self._ended.get(session_id)
        if slot is None:
            raise UnknownSession(f"unknown session {session_id!r}")
        return slot

    async def _negotiate(self, slot: _Slot, sdp_offer: str, mapping: list[dict[str, Any]]) -> str:
        from reactor_serve.runtime.host import SessionBusy

        assert slot.peer is not None
        try:
            answer = await slot.peer.answer(sdp_offer, mapping)
        except (OfferRejected, SessionBusy) as exc:
            # The session may still get a good offer; if none comes, let it expire.
            if not slot.answered and slot is self._current and slot.closing is None:
                self._arm_expiry(slot)
            if isinstance(exc, SessionBusy):
                raise ModelBusy(str(exc)) from exc
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: answering the offer failed", slot.info.session_id)
            if slot.closing is None and slot.info.state != "ended":
                slot.closing = asyncio.get_running_loop().create_task(self._finish(slot, "error"))
            raise NegotiationFailed(f"could not answer the offer: {type(exc).__name__}: {exc}") from exc
        slot.answered = True
        if slot.info.state == "connecting":
            slot.info.state = "live"
        return answer

    def _arm_expiry(self, slot: _Slot) -> None:
        if slot.expiry is not None:
            slot.expiry.cancel()
        loop = asyncio.get_running_loop()
        slot.expiry = loop.call_later(self._offer_timeout_s, self._expire, slot)

    def _expire(self, slot: _Slot) -> None:
        slot.expiry = None
        if slot is not self._current or slot.answered or slot.closing is not None:
            return
        if any(not task.done() for task in slot.negotiations.values()):
            return  # its outcome re-arms the expiry if it fails
        log.info("session %s got no usable offer within %.0f s; ending it",
                 slot.info.session_id, self._offer_timeout_s)
        slot.closing = asyncio.get_running_loop().create_task(self._finish(slot, "timeout"))

    async def _close(self, slot: _Slot, reason: str) -> None:
        if slot.closing is None:
            slot.closing = asyncio.get_running_loop().create_task(self._finish(slot, reason))
        # Shielded: a client that hangs up mid-stop must not leave the slot half-closed.
        await asyncio.shield(slot.closing)

    async def _finish(self, slot: _Slot, reason: str) -> None:
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None
        # Let an offer being answered finish: cancelling it could leave the model
        # session it is opening with nobody to close it.
        pending = [t for t in slot.negotiations.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.NEGOTIATION_DRAIN_S)
        if slot.peer is not None:
            try:
                await slot.peer.close(reason)
            except Exception:
                log.exception("session %s: closing its peer failed", slot.info.session_id)
        self._release(slot)

    def _on_peer_end(self, peer: PeerSession) -> None:
        # The peer ended on its own (client gone, watchdog, model ended or failed) or
        # because we closed it; either way the model is free again.
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            loop.call_soon_threadsafe(self._peer_ended, peer)
        else:
            self._peer_ended(peer)

    def _peer_ended(self, peer: PeerSession) -> None:
        slot = self._current
        if slot is not None and slot.peer is peer:
            log.info("session %s ended: %s", slot.info.session_id, peer.end_reason)
            self._release(slot)

    def _release(self, slot: _Slot) -> None:
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None
        slot.info.state = "ended"
        if self._current is slot:
            self._current = None
        self._ended[slot.info.session_id] = slot
        self._ended.move_to_end(slot.info.session_id)
        while len(self._ended) > self.KEEP_ENDED:
            self._ended.popitem(last=False)


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Failures are reported through poll_answer; a client that never polls must not
    # leave "exception was never retrieved" noise behind.
    if not task.cancelled():
        task.exception()


# --------------------------------------------------------------------------- app


def create_app(
    model_dir: str | Path,
    *,
    settings_override: dict[str, Any] | None = None,
    auth_token: str | None = None,
) -> FastAPI:
    """A FastAPI app serving the model in `model_dir` at the root.

    The manifest and the model class are read here (errors surface at once); the
    model is loaded at startup unless `app.state.host` was started before, and shut
    down at shutdown. A failing `load()` fails startup, with the model's traceback
    logged and the ModelLoadError kept in `app.state.load_error`.
    """
    from reactor_serve import __version__
    from reactor_serve.runtime.host import ModelHost, ModelLoadError

    host = ModelHost.from_manifest(model_dir)
    settings = _settings(host.config, settings_override, source=f"{model_dir}")
    backend = LocalBackend(host, settings)
    name = host.spec.name

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A caller may have loaded the model already (`reactor run` does, to report a
        # failing load before the server starts).
        if not host.healthy:
            started = time.monotonic()
            try:
                await asyncio.to_thread(host.start)
            except ModelLoadError as exc:
                # The host has logged the model's traceback; `exc.traceback` keeps it.
                app.state.load_error = exc
                log.error("model %s failed to load: %s", name, exc)
                await asyncio.to_thread(host.shutdown)
                raise
            log.info("model %s loaded in %.1f s", name, time.monotonic() - started)
        try:
            yield
        finally:
            await backend.aclose()
            await asyncio.to_thread(host.shutdown)

    app = FastAPI(title=f"reactor-serve: {name}", version=__version__, lifespan=lifespan)
    app.state.backend = backend
    app.state.host = host
    app.state.load_error = None
    # CORS, doubled slashes, the token (pages and docs too), request limits.
    add_session_middleware(app, auth_token=auth_token)
    app.include_router(
        session_routes(lambda request: backend, server_version=__version__)
    )

    app.include_router(asset_routes(""))

    @app.get("/", response_model=None)
    async def index(request: Request) -> dict[str, Any] | HTMLResponse:
        # Browsers get the player page; tools asking for JSON get this summary.
        if wants_html(request):
            return page_response(PLAYER_PAGE)
        return {
            "model": name,
            "server_version": __version__,
            "healthy": backend.healthy,
            "live_sessions": len(backend.live_sessions()),
            "routes": {
                "start_session": "POST /start_session",
                "session": "GET /session",
                "stop_session": "POST /stop_session",
                "health": "GET /health",
                "sdp_params": "POST|GET|PUT /sessions/{sid}/transport/webrtc/sdp_params",
            },
        }

    return app


def _settings(
    config: dict[str, Any], override: dict[str, Any] | None, source: str
) -> WebRTCSettings:
    settings = WebRTCSettings.from_config(config, source=source)
    if not override:
        return settings
    try:
        return WebRTCSettings.model_validate({**settings.model_dump(), **override})
    except ValidationError as exc:
        problems = "; ".join(
            f"field 'webrtc.{'.'.join(str(p) for p in err['loc'])}': {err['msg']}"
            for err in exc.errors()
        )
        raise WebRTCSettingsError(f"{source} (with overrides): {problems}") from None
