"""The ingress deployment: one FastAPI app in front of every model.

PROTOCOL.md's routes for each model under `/models/{name}`, and for the first model at
the root (so `GET /health` is the first model's, as the protocol has it); `GET /models`
(names, tracks, schemas, computed from the classes: no replica needed); the web page.
Media never passes through here: the client's WebRTC goes straight to the replica that
runs its session.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from ray import serve

from reactor_serve import __version__
from reactor_serve.runtime.manifest import load_manifest
from reactor_serve.runtime.model_spec import inspect_model
from reactor_serve.serve.config import ModelEntry
from reactor_serve.serve.metrics import IngressMetrics
from reactor_serve.serve.serve_backend import ServeBackend
from reactor_serve.webrtc import schema
from reactor_serve.webrtc.http_api import (
    SessionHTTPMiddleware,
    session_routes,
    token_check,
)
from reactor_serve.webrtc.web_page import (
    PICKER_PAGE,
    PLAYER_PAGE,
    asset_routes,
    page_response,
)

__all__ = ["INGRESS_NAME", "make_ingress"]

log = logging.getLogger("reactor_serve.serve")

INGRESS_NAME = "ReactorIngress"

BACKENDS: dict[str, ServeBackend] = {}


def _live_backends() -> dict[str, ServeBackend]:
    """This process's backends (one ingress per replica process)."""
    import reactor_serve.serve.ingress as module  # the real module, not a pickled copy

    return module.BACKENDS


def make_ingress(auth_token: str | None) -> Any:
    """The ingress deployment class, with its app's routes guarded by `auth_token`."""
    # Serve pickles the FastAPI app and this class separately, so the routes and the
    # ingress object meet in the module's `BACKENDS`, looked up by import at run time
    # in the replica's process (see `_live_backends`).
    def model_backend(request: Request) -> ServeBackend:
        backends = _live_backends()
        name = request.path_params.get("name") or ""
        backend = backends.get(name)
        if backend is None:
            if not backends:
                raise HTTPException(503, "the ingress is starting")
            raise HTTPException(404, f"unknown model {name!r} (models: {', '.join(backends)})")
        return backend

    def root_backend(request: Request) -> ServeBackend:
        backends = _live_backends()
        if not backends:
            raise HTTPException(503, "the ingress is starting")
        return next(iter(backends.values()))

    app = FastAPI(title="reactor-serve", version=__version__)
    app.add_middleware(SessionHTTPMiddleware)
    app.include_router(
        session_routes(model_backend, server_version=__version__, auth_token=auth_token),
        prefix="/models/{name}",
    )
    app.include_router(
        session_routes(root_backend, server_version=__version__, auth_token=auth_token)
    )
    guard = [Depends(token_check(auth_token))]

    # The web client: the model picker at the root, each model's player page in its
    # folder (the trailing slash is what lets the page's relative URLs reach the model).
    app.include_router(asset_routes("", "/models/{name}"))

    @app.get("/", dependencies=guard, include_in_schema=False)
    async def picker_page() -> HTMLResponse:
        return page_response(PICKER_PAGE)

    @app.get("/models/{name}/", dependencies=guard, include_in_schema=False)
    async def player_page(request: Request) -> HTMLResponse:
        model_backend(request)  # 404 names the models when this one is unknown
        return page_response(PLAYER_PAGE)

    @app.get("/models/{name}", include_in_schema=False)
    async def player_folder(name: str) -> RedirectResponse:
        # Relative, so a Serve route prefix or a /t/{token}/ prefix is kept.
        return RedirectResponse(f"{quote(name)}/", status_code=308)

    @app.get("/models", dependencies=guard)
    async def list_models() -> dict[str, Any]:
        return {
            "models": [
                {
                    "name": name,
                    "base_url": f"/models/{name}",
                    "capabilities": schema.capabilities(backend.spec),
                    "schema": schema.model_schema(backend.spec),
                }
                for name, backend in _live_backends().items()
            ]
        }

    @app.get("/models/{name}/sessions", dependencies=guard)
    async def list_sessions(request: Request) -> dict[str, Any]:
        return {"sessions": model_backend(request).describe_sessions()}

    @serve.deployment(name=INGRESS_NAME)
    @serve.ingress(app)
    class ReactorIngress:
        def __init__(
            self,
            models: list[dict[str, Any]],
            handles: dict[str, Any],
            ice_servers: list[dict[str, Any]],
        ) -> None:
            metrics = IngressMetrics()
            self.backends = _live_backends()
            for model in models:
                manifest = load_manifest(model["path"])
                spec = inspect_model(manifest.load_class(), model["name"])
                entry = ModelEntry.model_validate(model["entry"])
                self.backends[model["name"]] = ServeBackend(
                    spec, handles[model["name"]], entry, ice_servers, metrics
                )

        async def take(self, session_id: str, timeout: float) -> list[dict[str, Any]]:
            """Messages for a live session, polled by the replica running it."""
            for backend in self.backends.values():
                if session_id in backend._sessions:
                    return await backend.take(session_id, timeout)
            return [{"type": "stop"}]

    return ReactorIngress
