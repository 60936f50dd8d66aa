"""The ingress deployment: one stateless FastAPI app in front of every model.

docs/protocol.md's routes for each model under `/models/{name}`, and for the first model at
the root (so `GET /health` is the first model's, as the protocol has it); `GET /models`
(names, tracks, schemas, computed from the classes: no replica needed); the web page.
Media never passes through here: the client's WebRTC goes straight to the replica that
runs its session.

Nothing a session needs lives here (see `IngressSessions`): the ingress runs two or more
replicas, any of them answers any request, and killing or redeploying one leaves
every session streaming. Its init args name the models and nothing of their
settings.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from typing import Any
from urllib.parse import quote

import ray
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from ray import serve

from reactor_serve import __version__
from reactor_serve.access.access_control import AccessControl
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.access.usage_ledger import UsageLedger
from reactor_serve.http_api.pages import PICKER_PAGE, model_pages, page_response
from reactor_serve.http_api.routes import add_session_middleware, session_routes
from reactor_serve.http_api.tokens import token_routes
from reactor_serve.http_api.usage import usage_routes
from reactor_serve.protocol import model_documents
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.loading.model_spec import inspect_model
from reactor_serve.runtime.session import EndReason
from reactor_serve.serve.grafana_dashboard import install_on_head
from reactor_serve.serve.ingress_sessions import IngressSessions
from reactor_serve.serve.metrics import IngressMetrics, UsageMetrics
from reactor_serve.serve.replica_logging import join_serve_log
from reactor_serve.serve.session_directory import SessionDirectory
from reactor_serve.sessions.uploads.settings import MAX_FILE_BYTES_CEILING

__all__ = ["INGRESS_NAME", "make_ingress"]

log = logging.getLogger("reactor_serve.serve")

INGRESS_NAME = "ReactorIngress"

BACKENDS: dict[str, IngressSessions] = {}


def _live_backends() -> dict[str, IngressSessions]:
    """This process's backends (one ingress per replica process)."""
    import reactor_serve.serve.ingress as module  # the real module, not a pickled copy

    return module.BACKENDS


def make_ingress(
    auth_token: str | None,
    operator_token: str | None = None,
    access: AccessControl | None = None,
) -> Any:
    """The ingress deployment class, with its app's routes guarded by `auth_token`,
    or by API keys and tokens with `access`; the operators' session list wants
    `operator_token`."""
    # Serve pickles the FastAPI app and this class separately, so the routes and the
    # ingress object meet in the module's `BACKENDS`, looked up by import at run time
    # in the replica's process (see `_live_backends`).
    def model_backend(request: Request) -> IngressSessions:
        backends = _live_backends()
        name = request.path_params.get("name") or ""
        backend = backends.get(name)
        if backend is None:
            if not backends:
                raise HTTPException(503, "the ingress is starting", {"Retry-After": "1"})
            raise HTTPException(404, f"unknown model {name!r} (models: {', '.join(backends)})")
        return backend

    def root_backend(request: Request) -> IngressSessions:
        backends = _live_backends()
        if not backends:
            raise HTTPException(503, "the ingress is starting", {"Retry-After": "1"})
        return next(iter(backends.values()))

    def operator(request: Request) -> None:
        # Session lists are for operators only: a session id is its client's capability,
        # and even masked, who runs what is not every user's business.
        header = request.headers.get("x-operator-token") or ""
        if operator_token is None or not hmac.compare_digest(header.encode(), operator_token.encode()):
            raise HTTPException(
                403, "listing sessions needs the operator token (X-Operator-Token header; "
                     "set operator_token in the app's args)"
            )

    app = FastAPI(title="reactor-serve", version=__version__)
    # Each model's replica holds an upload to its own bound; the body of any is
    # bounded by the ceiling before that, and by its reservation as it is read.
    throttle = FailureThrottle()
    add_session_middleware(app, auth_token=auth_token, max_upload_bytes=MAX_FILE_BYTES_CEILING,
                           access=access, throttle=throttle)
    if access is not None:
        # At the root and under each model: an SDK's api_url may be either.
        app.include_router(token_routes(access, throttle))
        app.include_router(token_routes(access, throttle), prefix="/models/{name}")
        app.include_router(usage_routes(access, operator_token))
    app.include_router(session_routes(model_backend, server_version=__version__, access=access),
                       prefix="/models/{name}")
    app.include_router(session_routes(root_backend, server_version=__version__, access=access))

    # The web client: the model picker at the root (with the first model's connection
    # check), each model's player and connection check in its folder; an unknown
    # model's folder is a 404 naming the models.
    app.include_router(model_pages("", player=False))
    app.include_router(model_pages("/models/{name}", check=model_backend))

    @app.get("/", include_in_schema=False, response_model=None)
    async def picker_page(request: Request) -> HTMLResponse | RedirectResponse:
        watch = request.query_params.get("watch")
        backends = _live_backends()
        if watch is not None and backends:
            # A viewer link made on the root routes (the first model's): its page is
            # that model's player, in viewer mode. Relative, to keep any prefix.
            first = next(iter(backends))
            return RedirectResponse(f"models/{quote(first)}/?watch={quote(watch)}", 307)
        return page_response(PICKER_PAGE)

    @app.get("/models/{name}", include_in_schema=False)
    async def player_folder(name: str) -> RedirectResponse:
        # Relative, so a Serve route prefix or a /t/{token}/ prefix is kept.
        return RedirectResponse(f"{quote(name)}/", status_code=308)

    @app.get("/models")
    async def list_models() -> dict[str, Any]:
        backends = _live_backends()
        # Each backend's capacity is a cached reading, so a picker polling this
        # costs Serve's controller one status read per interval, not one per poll.
        capacities = await asyncio.gather(*(b.capacity() for b in backends.values()))
        return {
            "models": [
                {
                    "name": name,
                    "base_url": f"/models/{name}",
                    "capabilities": model_documents.capabilities(backend.spec),
                    "schema": model_documents.model_schema(backend.spec),
                    "capacity": capacity,
                }
                for (name, backend), capacity in zip(backends.items(), capacities, strict=True)
            ]
        }

    @app.get("/models/{name}/sessions", dependencies=[Depends(operator)])
    async def list_sessions(request: Request) -> dict[str, Any]:
        return {"sessions": await model_backend(request).describe_sessions()}

    @serve.deployment(name=INGRESS_NAME)
    @serve.ingress(app)
    class ReactorIngress:
        def __init__(
            self,
            models: list[dict[str, Any]],
            handles: dict[str, Any],
            ice_servers: list[dict[str, Any]],
        ) -> None:
            join_serve_log()
            metrics = IngressMetrics()
            self.app_name = serve.get_replica_context().app_name
            directory = SessionDirectory(self.app_name)
            if access is not None:
                # The waits and the ends no replica reports, in the usage ledger.
                ledger = access.usage_ledger(holds_slot=False, on_closed=UsageMetrics().interval)
                directory.events = ledger
                threading.Thread(target=_close_abandoned_usage, args=(ledger, directory),
                                 name="reactor-usage-recovery", daemon=True).start()
            self.backends = _live_backends()
            # The holder named in the records of the slot waits this replica holds.
            actor_name = ray.get_runtime_context().get_actor_name()
            for model in models:
                manifest = load_manifest(model["path"])
                spec = inspect_model(manifest.load_class(), model["name"])
                self.backends[model["name"]] = IngressSessions(
                    spec, handles[model["name"]], directory, ice_servers, metrics,
                    actor_name=actor_name,
                    admission_timeout_s=model["admission_timeout_s"],
                )
            # The operator's Grafana dashboard comes with the app: Ray's Grafana reads it
            # from the head node's session folder, whichever node this replica is on.
            install_on_head()
            if auth_token is None and access is None:
                # Asked of Serve's controller on a thread: the controller is busy
                # starting this very replica, which must not wait for it.
                threading.Thread(target=_warn_if_open_to_the_network,
                                 name="reactor-open-warning", daemon=True).start()

        async def __del__(self) -> None:
            # An ingress replica stops for three reasons: it is replaced (redeploy,
            # scale-down), killed, or the whole application is going away. Only the
            # last ends sessions: then every live one is told `sessionEnded{shutdown}`
            # at once, instead of each replica draining it for up to max_session_s.
            if not await _application_deleting(self.app_name):
                return
            for backend in list(self.backends.values()):
                try:
                    await backend.end_all(EndReason.SHUTDOWN, "the server is shutting down")
                except Exception:
                    log.exception("ending the sessions of %s at shutdown failed",
                                  backend.spec.name)

    return ReactorIngress


def _close_abandoned_usage(ledger: UsageLedger, directory: SessionDirectory) -> None:
    """At an ingress replica's start: usage intervals left open by a process that is
    gone (a crashed ingress, a whole application restarted), for sessions the session
    directory no longer holds live, closed at their last heartbeat. Any number of
    ingress replicas may do this at once: only what is still open is closed."""

    async def gone(session_ids: list[str]) -> list[str]:
        records = await asyncio.gather(*(directory.get(sid) for sid in session_ids))
        return [sid for sid, record in zip(session_ids, records, strict=True)
                if record is None or record.get("state") == "ended"]

    try:
        candidates = ledger.open_sessions()
        if not candidates:
            return
        closed = ledger.close_sessions(asyncio.run(gone(candidates)), reason="lost")
        if closed:
            log.warning("closed %d usage interval(s) of sessions that ended while no "
                        "process could record it", closed)
    except Exception:
        log.exception("closing abandoned usage intervals failed")


# Serve's controller, by the name and namespace Ray 2.60 gives it.
_SERVE_CONTROLLER = ("SERVE_CONTROLLER_ACTOR", "serve")


def _warn_if_open_to_the_network() -> None:
    """At every start of an ingress with auth off: a warning when Serve's HTTP proxy
    listens beyond loopback, where anyone who reaches it can start sessions."""
    from reactor_serve.rtc.host_candidates import is_loopback_host

    try:
        name, namespace = _SERVE_CONTROLLER
        controller = ray.get_actor(name, namespace=namespace)
        host = ray.get(controller.get_http_config.remote(), timeout=10).host
    except Exception:
        host = None  # unknown: say so rather than stay silent
    if host is not None and is_loopback_host(host):
        return
    log.warning(
        "the ingress serves on %s with auth off: anyone who can reach it can start "
        "sessions on every model. Set auth: required (docs/access.md) or auth_token "
        "in the app's args", host or "an address it could not read")


async def _application_deleting(app_name: str) -> bool:
    def read() -> bool:
        try:
            status = serve.status().applications.get(app_name)
        except Exception:
            return True  # the controller is gone too: everything is stopping
        return status is None or "DELETING" in str(status.status)

    return await asyncio.to_thread(read)
