"""`create_app`: `reactor run`'s FastAPI app, one model served from this process.

The model runs in its own process (or a thread of this one); a `SeatedSessionBackend`
runs its sessions, and the session HTTP API of docs/protocol.md is served at the root
with the player and doctor pages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from reactor_serve.access.access_control import AccessControl
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.http_api.pages import (
    PLAYER_PAGE,
    model_pages,
    page_response,
    wants_html,
)
from reactor_serve.http_api.routes import add_session_middleware, session_routes
from reactor_serve.http_api.tokens import token_routes
from reactor_serve.http_api.usage import usage_routes
from reactor_serve.rtc.settings import WebRTCSettings, WebRTCSettingsError
from reactor_serve.sessions.recording.settings import RecordingSettings
from reactor_serve.sessions.seated_sessions import SeatedSessionBackend

__all__ = ["create_app"]

log = logging.getLogger("reactor_serve.local.app")


def create_app(
    model_dir: str | Path,
    *,
    settings_override: dict[str, Any] | None = None,
    auth_token: str | None = None,
    in_process: bool | None = None,
    access: AccessControl | None = None,
    operator_token: str | None = None,
    seats: int | None = None,
    ranks: int | None = None,
) -> FastAPI:
    """A FastAPI app serving the model in `model_dir` at the root.

    The model runs in a process of its own unless `in_process` (default: the
    `REACTOR_IN_PROCESS` environment variable) asks for a thread of this one.

    The manifest and the model class are read here (errors surface at once); the
    model is loaded at startup unless `app.state.host` was started before, and shut
    down at shutdown. A failing `load()` fails startup, with the model's traceback
    logged and the ModelLoadError kept in `app.state.load_error`.

    `access` requires API keys: `POST /tokens` mints tokens, and every session route
    wants one (docs/access.md); `GET /usage` answers whoever sends `operator_token`.
    The app closes it at shutdown.

    `seats`: sessions served at once by the one loaded model (default: the model
    config's `sessions_per_replica`, else 1). `ranks`: processes, a GPU each, the
    model's `DistributedRunner` starts (default: the model config's `ranks`, else 1).
    """
    from reactor_serve import __version__
    from reactor_serve.runtime.host import ModelLoadError
    from reactor_serve.runtime.isolation.model_process import hosted_model

    host = hosted_model(model_dir, in_process, seats=seats, ranks=ranks)
    settings = _settings(host.config, settings_override, source=f"{model_dir}")
    backend = SeatedSessionBackend(host, settings)
    # A bad `recording` section fails here, naming the field, not at the first session.
    backend.recording_override = RecordingSettings.from_config(
        host.config, source=f"{model_dir}"
    ).model_dump(mode="json")
    name = host.spec.name

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A caller may have loaded the model already (`reactor run` does, to report a
        # failing load before the server starts).
        if access is not None:
            # `reactor run` holds no session across a restart: whatever usage an
            # earlier run left open ended with it, at its last heartbeat.
            ledger = access.usage_ledger()
            closed = await asyncio.to_thread(ledger.close_abandoned, lambda _sid: False)
            if closed:
                log.warning("closed %d usage interval(s) an earlier run left open", closed)
            backend.events = ledger
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
            if access is not None:
                await asyncio.to_thread(access.close)

    app = FastAPI(title=f"reactor-serve: {name}", version=__version__, lifespan=lifespan)
    app.state.backend = backend
    app.state.host = host
    app.state.load_error = None
    # CORS, doubled slashes, the token (pages and docs too), request limits.
    throttle = FailureThrottle()
    add_session_middleware(app, auth_token=auth_token,
                           max_upload_bytes=backend.upload_settings.max_file_bytes,
                           access=access, throttle=throttle)
    app.state.access = access
    if access is not None:
        app.include_router(token_routes(access, throttle))
        app.include_router(usage_routes(access, operator_token))
    app.include_router(
        session_routes(lambda request: backend, server_version=__version__, access=access)
    )

    # The player is the root's page: `/` answers browsers with it and tools with JSON.
    app.include_router(model_pages("", player=False))

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
            "capacity": backend.capacity(),
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
