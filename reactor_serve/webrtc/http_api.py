"""The session HTTP API of PROTOCOL.md, over any `SessionBackend`.

Two pieces, because FastAPI routes cannot see or rewrite the raw path:

- `session_routes(...)`: an `APIRouter` with the routes relative to a base. Include it
  at the root and/or under a prefix (`app.include_router(r, prefix="/models/{name}")`);
  `backend_for(request)` picks the backend, for example from `request.path_params`.
- `SessionHTTPMiddleware`: install it once per app. It collapses doubled slashes (the
  JS client builds `${apiUrl}/start_session`), strips a leading `/t/{token}` path
  prefix (a JS client in local mode can only carry a token inside its `apiUrl`) and
  remembers that token for the routes' auth check, answers CORS preflights and puts
  the CORS headers on every response, errors included.

`session_app(...)` is both on a fresh FastAPI app, at the root.
"""

# No `from __future__ import annotations`: Serve pickles these route functions by value
# into the ingress, and FastAPI must find their annotations as real classes there.

import collections
import functools
import hmac
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from reactor_serve.runtime.field_errors import field_problems
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reactor_serve.webrtc.backend import (
    AnswerPending,
    BackendError,
    ModelBusy,
    SessionBackend,
    SessionInfo,
)

__all__ = [
    "CORS_METHODS",
    "PATH_TOKEN_KEY",
    "SessionHTTPMiddleware",
    "session_app",
    "session_routes",
    "token_check",
]

log = logging.getLogger("reactor_serve.webrtc.http")

CORS_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
# Sent when a preflight names no headers: what our clients send.
_DEFAULT_ALLOW_HEADERS = (
    "Authorization, Content-Type, Reactor-API-Version, Reactor-API-Accept-Version, "
    "Reactor-WebRTC-Version"
)
# The ASGI scope key where the middleware leaves a `/t/{token}` prefix it stripped.
PATH_TOKEN_KEY = "reactor_serve.path_token"

_TOKEN_PREFIX = re.compile(r"^/t/([^/]+)(?=/|$)")
_SLASHES = re.compile(r"/{2,}")
_WEBRTC = "/sessions/{sid}/transport/webrtc"

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


# --------------------------------------------------------------------------- bodies


class _Body(BaseModel):
    # Clients add fields over versions (client_info, ice_servers, ...): ignore them.
    model_config = ConfigDict(extra="ignore")


class _StartBody(_Body):
    extra_args: dict[str, Any] | None = None


class _StopBody(_Body):
    session_id: str | None = None


class _TrackMappingEntry(_Body):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)

    mid: str
    name: str
    kind: str
    direction: str


class _OfferBody(_Body):
    sdp_offer: str = Field(min_length=1)
    client_info: Any = None
    track_mapping: list[_TrackMappingEntry] = Field(default_factory=list)


class _IceCandidatesBody(_Body):
    # Checked by the backend, which names a malformed candidate.
    candidates: list[Any] = Field(default_factory=list)
    is_final: bool = False


_B = TypeVar("_B", bound=_Body)


async def _read_body(request: Request, model: type[_B], *, required: bool) -> _B:
    """Parse and validate a JSON body; every problem is a 400 that names it."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise HTTPException(400, f"request body required: a JSON object ({_fields(model)})")
        return model()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPException(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPException(
            400, f"request body must be a JSON object, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(field_problems(exc))
        raise HTTPException(400, f"invalid request body: {problems}") from None


def _fields(model: type[BaseModel]) -> str:
    return ", ".join(
        f"{name}{'' if info.is_required() else '?'}" for name, info in model.model_fields.items()
    )


# --------------------------------------------------------------------------- errors


def _http_error(exc: BackendError) -> HTTPException:
    headers: dict[str, str] = {}
    if isinstance(exc, ModelBusy) and exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return HTTPException(exc.status, str(exc) or type(exc).__name__, headers or None)


def _backend_errors(endpoint: _F) -> _F:
    """Turn the backend's errors into `{"detail": ...}` responses with their status."""

    @functools.wraps(endpoint)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await endpoint(*args, **kwargs)
        except BackendError as exc:
            raise _http_error(exc) from None

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- connection ids


class _Connections:
    """The connection ids clients see, per session.

    `SessionBackend.submit_offer` mints a connection id per offer, but newer clients
    register a connection first (`POST .../connections`) and then offer on it, and a
    flat `GET .../sdp_params` reply names its connection without the client saying
    which. So the routes remember, per session: the backend id of the latest offer,
    and each registered id's backend id. Bounded, oldest sessions forgotten first; the
    state lives beside the backend's own session state, in the same process.
    """

    MAX_SESSIONS = 1024

    def __init__(self) -> None:
        self._sessions: collections.OrderedDict[str, _SessionConnections] = (
            collections.OrderedDict()
        )
        self._next_registered = 0

    def of(self, session_id: str) -> "_SessionConnections":
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = _SessionConnections()
            while len(self._sessions) > self.MAX_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return entry

    def latest(self, session_id: str) -> int | None:
        entry = self._sessions.get(session_id)
        return entry.latest if entry is not None else None

    def register(self, session_id: str) -> int:
        self._next_registered += 1
        self.of(session_id).registered[self._next_registered] = None
        return self._next_registered

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


class _SessionConnections:
    __slots__ = ("latest", "registered")

    def __init__(self) -> None:
        self.latest: int | None = None
        # registered id -> the backend's id of its latest offer (None until offered)
        self.registered: dict[int, int | None] = {}


# --------------------------------------------------------------------------- routes


def session_routes(
    backend_for: Callable[[Request], SessionBackend],
    *,
    server_version: str,
    auth_token: str | None = None,
) -> APIRouter:
    """The session routes of PROTOCOL.md, relative to a base URL.

    `auth_token`: when set, every route but `/health` wants `Authorization: Bearer
    <token>` or the `/t/{token}/` path prefix (which needs `SessionHTTPMiddleware`);
    anything else is a 401. When unset, any Authorization header is ignored.
    """
    router = APIRouter()
    connections = _Connections()
    guarded = [Depends(token_check(auth_token))]

    def descriptor(b: SessionBackend, info: SessionInfo) -> dict[str, Any]:
        from reactor_serve.webrtc.schema import session_descriptor

        return session_descriptor(b.spec, info.session_id, info.state, server_version=server_version)

    def only_live(b: SessionBackend, action: str) -> SessionInfo:
        # The JS client names no session on stop or GET /session: act only when there is
        # no doubt which one is meant, never on a guess.
        live = b.live_sessions()
        if len(live) == 1:
            return live[0]
        if not live:
            raise HTTPException(404 if action == "describe" else 400, "no live session")
        raise HTTPException(
            400,
            f"{len(live)} sessions are live; name the one to {action} with "
            + ('?session_id=...' if action == "describe" else '{"session_id": "..."}'),
        )

    # ---- session lifecycle -------------------------------------------------------

    @_backend_errors
    async def start_session(request: Request) -> dict[str, Any]:
        body = await _read_body(request, _StartBody, required=False)
        b = backend_for(request)
        info = await b.create_session(body.extra_args or {})
        return descriptor(b, info)

    @_backend_errors
    async def get_session(request: Request, session_id: str | None = None) -> dict[str, Any]:
        b = backend_for(request)
        info = b.get_session(session_id) if session_id else only_live(b, "describe")
        return descriptor(b, info)

    @_backend_errors
    async def stop_session(request: Request) -> dict[str, Any]:
        body = await _read_body(request, _StopBody, required=False)
        b = backend_for(request)
        sid = body.session_id or only_live(b, "stop").session_id
        await b.stop_session(sid)
        connections.forget(sid)
        return {"session_id": sid, "state": "ended"}

    @_backend_errors
    async def health(request: Request) -> JSONResponse:
        b = backend_for(request)
        # `healthy` is not part of SessionBackend; backends that can tell expose it.
        healthy = bool(getattr(b, "healthy", True))
        body = {
            "status": "ok" if healthy else "unhealthy",
            "model": b.spec.name,
            "live_sessions": len(b.live_sessions()),
        }
        return JSONResponse(body, status_code=200 if healthy else 503)

    # ---- WebRTC transport --------------------------------------------------------

    @_backend_errors
    async def ice_servers(request: Request, sid: str) -> dict[str, Any]:
        b = backend_for(request)
        b.get_session(sid)
        return {"ice_servers": b.ice_servers()}

    async def submit(request: Request, sid: str) -> int:
        body = await _read_body(request, _OfferBody, required=True)
        cid = await backend_for(request).submit_offer(
            sid, body.sdp_offer, [entry.model_dump() for entry in body.track_mapping]
        )
        connections.of(sid).latest = cid
        return cid

    @_backend_errors
    async def offer(request: Request, sid: str) -> JSONResponse:
        # Exactly 202: the JS client treats 200 and 201 as errors here.
        cid = await submit(request, sid)
        return JSONResponse({"connection_id": cid}, status_code=202)

    @_backend_errors
    async def poll(request: Request, sid: str) -> JSONResponse:
        b = backend_for(request)
        cid = connections.latest(sid)
        return _answer_response(b.poll_answer(sid, cid), cid)

    @_backend_errors
    async def ice_candidates(request: Request, sid: str) -> JSONResponse:
        # JS 2.9.0 never calls this (its offers carry every candidate); newer clients
        # trickle theirs here.
        body = await _read_body(request, _IceCandidatesBody, required=False)
        b = backend_for(request)
        b.get_session(sid)
        await b.add_ice_candidates(sid, body.candidates, body.is_final)
        return JSONResponse({}, status_code=202)

    # ---- newer clients: register a connection, then offer on it -------------------

    def registered(sid: str, cid: str) -> tuple[int, _SessionConnections]:
        number = int(cid) if cid.isdigit() else None
        entry = connections.of(sid)
        if number is None or number not in entry.registered:
            raise HTTPException(
                404, f"unknown connection {cid!r} for session {sid}; POST .../connections first"
            )
        return number, entry

    @_backend_errors
    async def register(request: Request, sid: str) -> JSONResponse:
        b = backend_for(request)
        b.get_session(sid)
        cid = connections.register(sid)
        return JSONResponse({"connection_id": cid, "track_map": _track_map(b)}, status_code=201)

    @_backend_errors
    async def connection_offer(request: Request, sid: str, cid: str) -> JSONResponse:
        backend_for(request).get_session(sid)
        number, entry = registered(sid, cid)
        backend_cid = await submit(request, sid)
        entry.registered[number] = backend_cid
        return JSONResponse({"connection_id": number}, status_code=202)

    @_backend_errors
    async def connection_poll(request: Request, sid: str, cid: str) -> JSONResponse:
        b = backend_for(request)
        b.get_session(sid)
        number, entry = registered(sid, cid)
        backend_cid = entry.registered[number]
        if backend_cid is None:
            return JSONResponse({"status": "awaiting_offer"}, status_code=202)
        return _answer_response(b.poll_answer(sid, backend_cid), number)

    @_backend_errors
    async def connection_ice_candidates(request: Request, sid: str, cid: str) -> JSONResponse:
        body = await _read_body(request, _IceCandidatesBody, required=False)
        b = backend_for(request)
        b.get_session(sid)
        registered(sid, cid)
        await b.add_ice_candidates(sid, body.candidates, body.is_final)
        return JSONResponse({}, status_code=202)

    # ---- table ---------------------------------------------------------------------

    def add(path: str, endpoint: Callable[..., Any], method: str, name: str, **kw: Any) -> None:
        router.add_api_route(
            path, endpoint, methods=[method], name=name,
            dependencies=kw.pop("dependencies", guarded), **kw,
        )

    add("/start_session", start_session, "POST", "start_session")
    add("/session", get_session, "GET", "get_session")
    add("/stop_session", stop_session, "POST", "stop_session")
    add("/health", health, "GET", "health", dependencies=[])
    add(f"{_WEBRTC}/ice_servers", ice_servers, "GET", "ice_servers")
    # POST and PUT are registered apart so each has its own OpenAPI operation id.
    add(f"{_WEBRTC}/sdp_params", offer, "POST", "post_sdp_offer", status_code=202)
    add(f"{_WEBRTC}/sdp_params", offer, "PUT", "put_sdp_offer", status_code=202)
    add(f"{_WEBRTC}/sdp_params", poll, "GET", "get_sdp_answer")
    add(f"{_WEBRTC}/ice_candidates", ice_candidates, "POST", "ice_candidates", status_code=202)
    add(f"{_WEBRTC}/connections", register, "POST", "register_connection", status_code=201)
    conn = f"{_WEBRTC}/connections/{{cid}}"
    add(f"{conn}/sdp_params", connection_offer, "POST", "post_connection_offer", status_code=202)
    add(f"{conn}/sdp_params", connection_offer, "PUT", "put_connection_offer", status_code=202)
    add(f"{conn}/sdp_params", connection_poll, "GET", "get_connection_answer")
    add(f"{conn}/ice_candidates", connection_ice_candidates, "POST",
        "connection_ice_candidates", status_code=202)
    return router


def _answer_response(result: str | AnswerPending, connection_id: int | None) -> JSONResponse:
    if isinstance(result, AnswerPending):
        return JSONResponse(result.status or {"status": "pending"}, status_code=202)
    body: dict[str, Any] = {"sdp_answer": result}
    if connection_id is not None:
        body["connection_id"] = connection_id
    return JSONResponse(body, status_code=200)


def _track_map(b: SessionBackend) -> dict[str, Any]:
    """The model's tracks by name, from the model's side (out = it sends, in = it receives)."""
    spec = b.spec
    tracks: dict[str, Any] = {}
    for direction, decls in (("out", spec.outputs), ("in", spec.inputs)):
        for t in decls:
            rate = float(spec.fps) if t.kind == "video" else t.sample_rate
            tracks[t.name] = {"kind": t.kind, "direction": direction, "rate": rate}
    return tracks


def token_check(token: str | None) -> Callable[[Request], None]:
    """A FastAPI dependency: the token auth of the session routes, for other routes
    of the same app (the index page). A no-op when `token` is None."""

    def check(request: Request) -> None:
        if token is None:
            return
        given = request.scope.get(PATH_TOKEN_KEY)
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and _same(value.strip(), token):
            return
        if given is not None and _same(given, token):
            return
        raise HTTPException(
            401,
            "a valid token is required: send 'Authorization: Bearer <token>' or "
            "prefix the path with /t/<token>",
            {"WWW-Authenticate": "Bearer"},
        )

    return check


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


# --------------------------------------------------------------------------- middleware


class SessionHTTPMiddleware:
    """Path normalisation, the `/t/{token}` prefix and CORS, for a whole app.

    Pure ASGI (not BaseHTTPMiddleware) so it can rewrite the path before routing and
    adds nothing per request beyond a header merge.
    """

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = _rewrite_path(scope)
        request_headers = _headers(scope)
        if scope["method"] == "OPTIONS":
            await _preflight(request_headers, send)
            return
        cors = _cors_headers()
        started = False

        async def send_with_cors(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in cors if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_cors)
        except Exception:
            # Starlette's outermost error handler would answer without CORS headers,
            # which a browser reports as an opaque "Failed to fetch".
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if started:
                raise
            await _send_json(send, 500, {"detail": "internal server error"}, cors)


def _rewrite_path(scope: dict[str, Any]) -> dict[str, Any]:
    path: str = scope["path"]
    root: str = scope.get("root_path", "") or ""
    prefix, rest = (root, path[len(root):]) if root and path.startswith(root) else ("", path)
    rest = _SLASHES.sub("/", rest)
    token = None
    match = _TOKEN_PREFIX.match(rest)
    if match:
        token = match.group(1)
        rest = rest[match.end():] or "/"
    new_path = prefix + rest
    if new_path == path and token is None:
        return scope
    scope = dict(scope)
    scope["path"] = new_path
    scope["raw_path"] = new_path.encode("utf-8", "surrogateescape")
    if token is not None:
        from urllib.parse import unquote

        scope[PATH_TOKEN_KEY] = unquote(token)
    return scope


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cors_headers() -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", b"*"),
        (b"access-control-expose-headers", b"Retry-After, Content-Length"),
    ]


async def _preflight(request_headers: dict[str, str], send: Any) -> None:
    # Echo the requested headers: a literal "*" does not cover Authorization.
    allow_headers = request_headers.get("access-control-request-headers") or _DEFAULT_ALLOW_HEADERS
    headers = [
        *_cors_headers(),
        (b"access-control-allow-methods", CORS_METHODS.encode()),
        (b"access-control-allow-headers", allow_headers.encode("latin-1")),
        (b"access-control-max-age", b"600"),
        (b"vary", b"Access-Control-Request-Headers"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _send_json(
    send: Any, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            *headers,
        ],
    })
    await send({"type": "http.response.body", "body": data})


# --------------------------------------------------------------------------- app


def session_app(
    backend_for: Callable[[Request], SessionBackend],
    *,
    server_version: str,
    auth_token: str | None = None,
    **fastapi_kwargs: Any,
) -> FastAPI:
    """A FastAPI app serving the session routes at its root, with the middleware."""
    app = FastAPI(**fastapi_kwargs)
    app.add_middleware(SessionHTTPMiddleware)
    app.include_router(
        session_routes(backend_for, server_version=server_version, auth_token=auth_token)
    )
    return app
