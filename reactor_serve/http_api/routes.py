"""The session HTTP API of docs/protocol.md, over any `SessionBackend`.

- `session_routes(backend_for, server_version=...)`: an `APIRouter` with the routes
  relative to a base. Include it at the root and/or under a prefix
  (`app.include_router(r, prefix="/models/{name}")`); `backend_for(request)` picks the
  backend, for example from `request.path_params`.
- `add_session_middleware(app, auth_token=...)`: once per app, the middleware the
  routes rely on, in order: CORS (outermost, so every answer carries it), doubled
  slashes, the token, request limits.
- `session_app(...)`: both on a fresh FastAPI app, at the root.

The routes keep no state of their own: whatever a later request needs (connection
ids, who may stop what) is the backend's, so any ingress replica can serve any
request. Nothing but a session's own client learns its id: no route lists sessions or
answers for "the" session without an id.

Every input is bounded and every failure a 4xx naming the problem: the bodies by
`bodies.py`, the JSON by `bounded_json`, path parameters here. A backend's
`BackendError` is answered with its status (and `Retry-After` when it says when to
retry); anything else a backend raises is a bug, logged and answered 500.
"""

# No `from __future__ import annotations`: Serve pickles these route functions by value
# into the ingress, and FastAPI must find their annotations as real classes there.

import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from reactor_serve.access.access_control import AccessControl, AccessDenied
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.access.grants import Grant
from reactor_serve.http_api.bodies import (
    InvalidBody,
    candidates_body,
    create_body,
    offer_body,
    start_body,
    stop_body,
    upload_body,
)
from reactor_serve.http_api.middleware.access_tokens import (
    GRANT_SCOPE_KEY,
    AccessTokenMiddleware,
    refusal,
)
from reactor_serve.http_api.middleware.cors import CORSMiddleware
from reactor_serve.http_api.middleware.path_normalisation import (
    PathNormalisationMiddleware,
)
from reactor_serve.http_api.middleware.request_limits import (
    DEFAULT_MAX_BODY_BYTES,
    BodyTooLarge,
    RequestLimitsMiddleware,
)
from reactor_serve.http_api.middleware.token_auth import (
    DEFAULT_PUBLIC_PATHS,
    TokenAuthMiddleware,
)
from reactor_serve.protocol.bounded_json import JSONBodyError, parse_json_object
from reactor_serve.protocol.clip_urls import SEGMENT_NAME
from reactor_serve.protocol.errors import (
    UNKNOWN_UPLOAD,
    UNKNOWN_VIEWER_LINK,
    BackendError,
)
from reactor_serve.sessions.contract import (
    AnswerPending,
    ClientIdentity,
    ClipBackend,
    SessionBackend,
    SessionInfo,
    StepBackend,
    UploadBackend,
    ViewerBackend,
)

__all__ = [
    "MAX_ID_LENGTH",
    "UPLOAD_PATH",
    "add_session_middleware",
    "read_body",
    "session_app",
    "session_routes",
]

log = logging.getLogger("reactor_serve.http_api")

MAX_ID_LENGTH = 128
# Ids are ours to mint (url-safe tokens): anything else cannot name a session, so it is
# answered 404 without asking the backend, and never echoed back.
_SESSION_ID = re.compile(r"[A-Za-z0-9._~-]{1,%d}" % MAX_ID_LENGTH)
_CONNECTION_ID = re.compile(r"[0-9]{1,9}")
_MAX_DETAIL = 500
_MAX_RETRY_AFTER_S = 3600
_WEBRTC = "/sessions/{sid}/transport/webrtc"
# Upload ids are UUIDs (sessions/uploads/store.py).
_UPLOAD_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The one route whose body is a file, not a JSON document: it gets the upload bound.
UPLOAD_PATH = re.compile(r".*/uploads/[^/]+")

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


# --------------------------------------------------------------------------- middleware


def add_session_middleware(
    app: FastAPI,
    *,
    auth_token: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_upload_bytes: int = 0,
    public_paths: Iterable[str] = DEFAULT_PUBLIC_PATHS,
    access: AccessControl | None = None,
    throttle: FailureThrottle | None = None,
) -> None:
    """Install, once per app, the middleware the session routes rely on.

    From the outside in: CORS (preflights answered before auth, CORS headers on every
    answer, a last-resort 500 that keeps them), path normalisation (`//` to `/`, so
    the token prefix is found), token auth (`auth_token=None`: off), request limits
    (body size, URL length). Guards the whole app: pages, `/docs` and `/openapi.json`
    included; only `public_paths` (health, the web client's `_web/` files) go without
    the token. `max_upload_bytes`: the body bound of an upload's `PUT` (the largest
    file any model here takes; each backend then holds its own model to its bound).

    `access` (auth required: API keys and signed tokens) takes the shared token's
    place; the two do not mix. `throttle` slows addresses that keep failing; pass the
    one `POST /tokens` uses (`access_routes`), so bad keys and bad tokens add up.
    """
    # Starlette wraps each added middleware around the previous ones: add inside out.
    app.add_middleware(
        RequestLimitsMiddleware, max_body_bytes=max_body_bytes,
        body_limits=(("PUT", UPLOAD_PATH, max_upload_bytes),) if max_upload_bytes > 0 else (),
    )
    if access is not None:
        if auth_token is not None:
            raise ValueError("a shared auth token and API-key access do not mix: choose one")
        app.add_middleware(AccessTokenMiddleware, access=access,
                           throttle=throttle or FailureThrottle())
    else:
        app.add_middleware(TokenAuthMiddleware, token=auth_token,
                           public_paths=tuple(public_paths))
    app.add_middleware(PathNormalisationMiddleware)
    app.add_middleware(CORSMiddleware)


def session_app(
    backend_for: Callable[[Request], SessionBackend],
    *,
    server_version: str,
    auth_token: str | None = None,
    max_upload_bytes: int = 0,
    **fastapi_kwargs: Any,
) -> FastAPI:
    """A FastAPI app serving the session routes at its root, with the middleware."""
    app = FastAPI(**fastapi_kwargs)
    add_session_middleware(app, auth_token=auth_token, max_upload_bytes=max_upload_bytes)
    app.include_router(session_routes(backend_for, server_version=server_version))
    return app


# --------------------------------------------------------------------------- errors


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return _json({"detail": _safe_detail(detail)}, status, headers)


def _safe_detail(text: str) -> str:
    # A message may quote client input: keep it short and encodable whatever it holds.
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 3] + "..."
    return text.encode("utf-8", "replace").decode("utf-8")


def _backend_error(exc: BackendError) -> JSONResponse:
    status = exc.status if isinstance(exc.status, int) and 400 <= exc.status <= 599 else 500
    headers: dict[str, str] = {}
    retry = exc.retry_after_s
    if isinstance(retry, (int, float)) and math.isfinite(retry):
        headers["Retry-After"] = str(min(_MAX_RETRY_AFTER_S, max(1, math.ceil(retry))))
    if status >= 500:
        log.warning("backend answered %d: %s", status, exc)
    return _error(status, str(exc) or type(exc).__name__, headers or None)


class _Refused(Exception):
    """A 4xx decided by the routes themselves (bad path parameter, missing query)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def _answering(endpoint: _F) -> _F:
    """Every outcome of a route as a response: its own refusals and bad bodies (4xx),
    the backend's errors (their status), and, as a last resort, a logged 500."""

    @functools.wraps(endpoint)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await endpoint(*args, **kwargs)
        except HTTPException:
            raise  # Starlette answers these (a 413 from the body limit, backend_for's 404)
        except ClientDisconnect:
            return _error(400, "the client went away before its request was read")
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except (InvalidBody, JSONBodyError) as exc:
            return _error(400, str(exc))
        except BackendError as exc:
            return _backend_error(exc)
        except AccessDenied as denied:
            return refusal(denied)
        except Exception:
            log.exception("session route %s failed", endpoint.__name__)
            return _error(500, "internal server error")

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- inputs


def _session_id(value: str | None) -> str:
    if value is None or not _SESSION_ID.fullmatch(value):
        raise _Refused(404, "unknown session")
    return value


def _connection_id(value: str) -> int:
    if not _CONNECTION_ID.fullmatch(value):
        raise _Refused(404, "unknown connection; POST .../connections first")
    return int(value)


async def read_body(request: Request) -> bytes:
    """The request's body, bounded even without the middleware (BodyTooLarge: 413)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > DEFAULT_MAX_BODY_BYTES:
            raise BodyTooLarge(DEFAULT_MAX_BODY_BYTES)
        chunks.append(chunk)
    return b"".join(chunks)


async def _body(request: Request) -> dict[str, Any] | None:
    """The request's JSON object (None when empty)."""
    return parse_json_object(await read_body(request))


def _client(request: Request) -> ClientIdentity:
    address = request.client.host if request.client is not None else None
    grant = _grant(request)
    # Under API-key access the key is part of who asks: a stop naming no session
    # never reaches another key's session from the same address and browser.
    agent = request.headers.get("user-agent")
    return ClientIdentity.of(
        address, request.headers.get("origin"),
        agent if grant is None else f"{agent or ''}\x1fkey:{grant.key_id}",
    )


def _grant(request: Request) -> Grant | None:
    return request.scope.get(GRANT_SCOPE_KEY)


def _session_guard(access: AccessControl) -> Callable[[Request], Awaitable[None]]:
    """A dependency of every session route: under API-key access, the session a
    request names (path `sid`, or a `session_id` query) must be the grant's. Public
    routes carry no grant and are not guarded; an id of the wrong shape is left to
    the route, which answers 404 for it."""

    async def guard(request: Request) -> None:
        grant = _grant(request)
        if grant is None:
            return
        sid = request.path_params.get("sid") or request.query_params.get("session_id")
        if sid is None or not _SESSION_ID.fullmatch(sid):
            return
        try:
            await access.authorize_session(grant, sid)
        except AccessDenied as denied:
            raise HTTPException(denied.status, denied.reason) from None

    return guard


# --------------------------------------------------------------------------- routes


def session_routes(
    backend_for: Callable[[Request], SessionBackend],
    *,
    server_version: str,
    access: AccessControl | None = None,
) -> APIRouter:
    """The session routes of docs/protocol.md, relative to a base URL.

    Authentication, CORS and limits are `add_session_middleware`'s, installed on the
    app. With `access`, the routes authorise: a start against the grant's models and
    limits, and every request naming a session against who started it.
    """
    # Without access there is nothing to guard: no dependency on the hot path.
    router = APIRouter(dependencies=[Depends(_session_guard(access))] if access is not None else [])

    def descriptor(b: SessionBackend, info: SessionInfo) -> dict[str, Any]:
        from reactor_serve.protocol.model_documents import session_descriptor

        return session_descriptor(
            b.spec, info.session_id, info.state, server_version=server_version,
            end_reason=info.end_reason, end_message=info.end_message, generation=info.generation,
        )

    # ---- session lifecycle -------------------------------------------------------

    @_answering
    async def start_session(request: Request) -> JSONResponse:
        body = start_body(await _body(request))
        b = backend_for(request)
        return _json(descriptor(b, await start(request, b, body)))

    @_answering
    async def get_session(request: Request) -> JSONResponse:
        # Only by id: "the" session of a base would tell anyone the live one's id.
        given = request.query_params.get("session_id")
        if given is None:
            raise _Refused(400, "missing query parameter 'session_id'")
        sid = _session_id(given)
        b = backend_for(request)
        return _json(descriptor(b, await b.get_session(sid)))

    @_answering
    async def stop_session(request: Request) -> JSONResponse:
        body = stop_body(await _body(request))
        b = backend_for(request)
        if body.session_id is None:
            # JS SDK 2.9.0 names no session: the backend decides, never on a guess, and
            # the answer names none either.
            matched = await b.stop_unnamed(_client(request))
            return _json({"state": "stopping", "matched": matched})
        sid = _session_id(body.session_id)
        grant = _grant(request)
        if access is not None and grant is not None:
            await access.authorize_session(grant, sid)
        await b.stop_session(sid)
        return _json({"session_id": sid, "state": "ended"})

    async def start(request: Request, b: SessionBackend, body: Any) -> SessionInfo:
        """A session started for this request, authorised and owned under access."""
        requested_at = time.time()
        grant = _grant(request)

        async def create(limit: float | None) -> SessionInfo:
            return await b.create_session(body.extra_args, _client(request),
                                          generation=body.generation, max_duration_s=limit)

        if access is None or grant is None:
            return await create(None)
        return await access.start_session(grant, b.spec.name, create, b.stop_session,
                                          requested_at)

    # ---- the official SDKs' production routes: create, poll, delete ---------------

    @_answering
    async def create_session(request: Request) -> JSONResponse:
        b = backend_for(request)
        body = create_body(await _body(request), b.spec.name)
        return _json(descriptor(b, await start(request, b, body)), 201)

    @_answering
    async def read_session(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        b = backend_for(request)
        body = descriptor(b, await b.get_session(sid))
        if body["state"] == "ended":
            # The official SDKs poll until a state they know as terminal.
            body["state"] = "CLOSED"
        return _json(body)

    @_answering
    async def delete_session(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        await backend_for(request).stop_session(sid)
        return _json({"session_id": sid, "state": "ended"})

    @_answering
    async def health(request: Request) -> JSONResponse:
        b = backend_for(request)
        report = await b.health()
        healthy = bool(report.get("healthy", True))
        live = report.get("live_sessions", 0)
        body = {
            "status": "ok" if healthy else "unhealthy",
            "model": b.spec.name,
            "live_sessions": live if isinstance(live, int) else 0,
        }
        if "ranks" in report:
            body["ranks"] = report["ranks"]
        return _json(body, 200 if healthy else 503)

    # ---- WebRTC transport --------------------------------------------------------

    @_answering
    async def ice_servers(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        b = backend_for(request)
        await b.get_session(sid)  # 404 for an unknown session
        return _json({"ice_servers": b.ice_servers(sid)})

    @_answering
    async def offer(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        body = offer_body(await _body(request))
        cid = await backend_for(request).submit_offer(sid, body.sdp_offer, body.track_mapping)
        # Exactly 202: the JS client treats 200 and 201 as errors here.
        return _json({"connection_id": cid}, 202)

    @_answering
    async def poll(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        result = await backend_for(request).poll_answer(sid, None)
        return _answer(result, None)

    @_answering
    async def ice_candidates(request: Request, sid: str) -> JSONResponse:
        # JS 2.9.0 never calls this (its offers carry every candidate).
        sid = _session_id(sid)
        body = candidates_body(await _body(request))
        await backend_for(request).add_ice_candidates(sid, None, body.candidates, body.is_final)
        return _json({}, 202)

    # ---- newer clients: register a connection, then offer on it -------------------

    @_answering
    async def register(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        b = backend_for(request)
        cid = await b.register_connection(sid)
        return _json({"connection_id": cid, "track_map": _track_map(b)}, 201)

    @_answering
    async def connection_offer(request: Request, sid: str, cid: str) -> JSONResponse:
        sid, number = _session_id(sid), _connection_id(cid)
        body = offer_body(await _body(request))
        given = await backend_for(request).submit_offer(
            sid, body.sdp_offer, body.track_mapping, number
        )
        return _json({"connection_id": given}, 202)

    @_answering
    async def connection_poll(request: Request, sid: str, cid: str) -> JSONResponse:
        sid, number = _session_id(sid), _connection_id(cid)
        return _answer(await backend_for(request).poll_answer(sid, number), number)

    @_answering
    async def connection_ice_candidates(request: Request, sid: str, cid: str) -> JSONResponse:
        sid, number = _session_id(sid), _connection_id(cid)
        body = candidates_body(await _body(request))
        await backend_for(request).add_ice_candidates(sid, number, body.candidates, body.is_final)
        return _json({}, 202)

    # ---- table ---------------------------------------------------------------------

    def add(path: str, endpoint: Callable[..., Any], method: str, name: str, **kw: Any) -> None:
        router.add_api_route(path, endpoint, methods=[method], name=name, **kw)

    add("/start_session", start_session, "POST", "start_session")
    add("/session", get_session, "GET", "get_session")
    add("/stop_session", stop_session, "POST", "stop_session")
    add("/health", health, "GET", "health")
    add("/sessions", create_session, "POST", "create_session", status_code=201)
    add("/sessions/{sid}", read_session, "GET", "read_session")
    add("/sessions/{sid}", delete_session, "DELETE", "delete_session")
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
    _add_viewer_routes(router, backend_for)
    _add_upload_routes(router, backend_for)
    _add_clip_routes(router, backend_for)
    _add_step_routes(router, backend_for)
    return router


def _answer(result: "str | AnswerPending", connection_id: int | None) -> JSONResponse:
    if isinstance(result, AnswerPending):
        return _json(result.status or {"status": "pending"}, 202)
    body: dict[str, Any] = {"sdp_answer": str(result)}
    # A flat poll names no connection: the backend's answer may carry its id.
    cid = connection_id if connection_id is not None else getattr(result, "connection_id", None)
    if cid is not None:
        body["connection_id"] = cid
    return _json(body, 200)


def _track_map(b: SessionBackend) -> dict[str, Any]:
    """The model's tracks by name, from the model's side (out = it sends, in = it receives)."""
    spec = b.spec
    tracks: dict[str, Any] = {}
    for direction, decls in (("out", spec.outputs), ("in", spec.inputs)):
        for t in decls:
            rate = float(spec.fps) if t.kind == "video" else t.sample_rate
            tracks[t.name] = {"kind": t.kind, "direction": direction, "rate": rate}
    return tracks


# --------------------------------------------------------------------------- viewers


def _viewer_backend(b: SessionBackend) -> ViewerBackend:
    if not callable(getattr(b, "viewer_link", None)):
        raise _Refused(404, "this server has no viewer links")
    return b  # type: ignore[return-value]


def _viewer_token(value: str) -> str:
    # Minted like session ids; anything else names no viewer link.
    if not _SESSION_ID.fullmatch(value):
        raise _Refused(404, UNKNOWN_VIEWER_LINK)
    return value


def _add_viewer_routes(
    router: APIRouter, backend_for: Callable[[Request], SessionBackend]
) -> None:
    """Watch-only links (sessions/viewers/room.py). The owner, proven by the session id in the
    path, asks for the link; a viewer, holding only the token, reads what to offer and
    offers. Nothing a viewer gets names the session."""

    @_answering
    async def create_link(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        b = _viewer_backend(backend_for(request))
        link = await b.viewer_link(sid)
        token = str(link["viewer_token"])
        # The player page of this base, in viewer mode.
        page = str(request.url.replace(query="")).rstrip("/")
        page = page[: -len(f"/sessions/{sid}/viewers")] if page.endswith("/viewers") else page
        return _json({**link, "url": f"{page}/?watch={token}"}, 201)

    @_answering
    async def revoke_link(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        revoked = await _viewer_backend(backend_for(request)).revoke_viewers(sid)
        return _json({"revoked": revoked})

    @_answering
    async def watch_descriptor(request: Request, token: str) -> JSONResponse:
        from reactor_serve.protocol.model_documents import capabilities

        token = _viewer_token(token)
        b = backend_for(request)
        info = await _viewer_backend(b).watch_info(token)
        caps = capabilities(b.spec)
        caps["tracks"] = [t for t in caps["tracks"] if t.get("direction") == "recvonly"]
        caps["commands"] = []
        return _json({"viewer": True, "model": {"name": b.spec.name}, "capabilities": caps, **info})

    @_answering
    async def watch_ice_servers(request: Request, token: str) -> JSONResponse:
        token = _viewer_token(token)
        servers = await _viewer_backend(backend_for(request)).watch_ice_servers(token)
        return _json({"ice_servers": servers})

    @_answering
    async def watch_offer(request: Request, token: str) -> JSONResponse:
        token = _viewer_token(token)
        body = offer_body(await _body(request))
        cid = await _viewer_backend(backend_for(request)).watch_offer(
            token, body.sdp_offer, body.track_mapping
        )
        return _json({"connection_id": cid}, 202)

    @_answering
    async def watch_poll(request: Request, token: str) -> JSONResponse:
        token = _viewer_token(token)
        given = request.query_params.get("connection_id")
        if given is None:
            raise _Refused(400, "missing query parameter 'connection_id' (from the offer's 202)")
        number = _connection_id(given)
        result = await _viewer_backend(backend_for(request)).watch_poll(token, number)
        return _answer(result, number)

    def add(path: str, endpoint: Callable[..., Any], method: str, name: str, **kw: Any) -> None:
        router.add_api_route(path, endpoint, methods=[method], name=name, **kw)

    add("/sessions/{sid}/viewers", create_link, "POST", "create_viewer_link", status_code=201)
    add("/sessions/{sid}/viewers", revoke_link, "DELETE", "revoke_viewer_link")
    add("/watch/{token}", watch_descriptor, "GET", "watch_descriptor")
    add("/watch/{token}/ice_servers", watch_ice_servers, "GET", "watch_ice_servers")
    add("/watch/{token}/sdp_params", watch_offer, "POST", "watch_offer", status_code=202)
    add("/watch/{token}/sdp_params", watch_poll, "GET", "watch_answer")


# --------------------------------------------------------------------------- uploads


def _upload_backend(b: SessionBackend) -> UploadBackend:
    if not callable(getattr(b, "create_upload", None)):
        raise _Refused(404, "this server takes no uploads")
    return b  # type: ignore[return-value]


def _add_upload_routes(
    router: APIRouter, backend_for: Callable[[Request], SessionBackend]
) -> None:
    """Files for a session's commands (sessions/uploads/). The owner, proven by the
    session id in the path, reserves an upload and gets a URL holding its fresh id;
    a `PUT` of exactly the reserved bytes to that URL completes it."""

    @_answering
    async def create_upload(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        body = upload_body(await _body(request))
        upload_id = await _upload_backend(backend_for(request)).create_upload(
            sid, body.name, body.size, body.mime_type
        )
        # The PUT URL under this base (a model's prefix included).
        here = str(request.url.replace(query="")).rstrip("/")
        base = here[: -len(f"/sessions/{sid}/uploads")]
        return _json({
            "presigned_id": upload_id,
            "presigned_url": f"{base}/uploads/{upload_id}",
            "path": f"sessions/{sid}/uploads/{upload_id}/{body.name}",
            "upload_id": upload_id,
        }, 201)

    @_answering
    async def write_upload(request: Request, upload_id: str) -> Response:
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise _Refused(404, UNKNOWN_UPLOAD)
        b = _upload_backend(backend_for(request))
        size = await b.upload_size(upload_id)
        declared = request.headers.get("content-length")
        if declared is not None and declared.strip() != str(size):
            raise _Refused(400, f"Content-Length is {_safe_detail(declared)[:24]}; "
                                f"the upload was reserved for {size} bytes")
        # Read no further than the reservation, whatever the body (chunked) claims.
        chunks: list[bytes] = []
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > size:
                raise _Refused(400, f"the body is longer than the {size} bytes reserved")
            chunks.append(chunk)
        await b.write_upload(upload_id, b"".join(chunks))
        return Response(status_code=200)

    router.add_api_route("/sessions/{sid}/uploads", create_upload, methods=["POST"],
                         name="create_upload", status_code=201)
    router.add_api_route("/uploads/{upload_id}", write_upload, methods=["PUT"],
                         name="write_upload")


# --------------------------------------------------------------------------- clips

_MARKER = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")


def _clip_backend(b: SessionBackend) -> ClipBackend:
    if not callable(getattr(b, "clip_playlist", None)):
        raise _Refused(404, "this server keeps no clips")
    return b  # type: ignore[return-value]


def _marker(request: Request, name: str) -> float:
    value = request.query_params.get(name)
    if value is None or not _MARKER.fullmatch(value):
        raise _Refused(400, f"query parameter {name!r} must be a clip marker in seconds "
                            f"(like 12.345), got {_safe_detail(str(value))[:24]!r}")
    return float(value)


def _add_clip_routes(
    router: APIRouter, backend_for: Callable[[Request], SessionBackend]
) -> None:
    """The clips a session's wire v1 client asked for, as HLS (fMP4): the playlist
    `clip_ready` names, then its segments, relative to it. The owner proves itself
    with the session id, in the query and in each segment's path."""

    @_answering
    async def clip_playlist(request: Request) -> Response:
        sid = _session_id(request.query_params.get("session_id"))
        start, end = _marker(request, "start"), _marker(request, "end")
        result = await _clip_backend(backend_for(request)).clip_playlist(sid, start, end)
        if not isinstance(result, str):
            # The clip's end is not written yet (a recording in progress).
            return Response(status_code=202, headers={"Retry-After": f"{max(1, math.ceil(result))}"})
        return Response(result, media_type="application/vnd.apple.mpegurl",
                        headers={"Cache-Control": "no-store"})

    @_answering
    async def clip_chunk(request: Request, sid: str, segment: str) -> Response:
        # Not `name`: a Serve prefix (/models/{name}) has that parameter.
        sid = _session_id(sid)
        if not SEGMENT_NAME.fullmatch(segment):
            raise _Refused(404, "no such clip segment")
        data = await _clip_backend(backend_for(request)).clip_chunk(sid, segment)
        return Response(data, media_type="video/mp4" if segment.endswith(".mp4") else "video/iso.segment",
                        headers={"Cache-Control": "no-store"})

    router.add_api_route("/clips", clip_playlist, methods=["GET"], name="clip_playlist")
    router.add_api_route("/clips/chunks/{sid}/{segment}", clip_chunk, methods=["GET"],
                         name="clip_chunk")


# --------------------------------------------------------------------------- steps

_STEP = re.compile(r"[1-9][0-9]{0,9}")
_STEP_FILE = re.compile(r"[A-Za-z0-9_.-]{1,128}\.(?:mp4|json)")


def _step_backend(b: SessionBackend) -> StepBackend:
    if not callable(getattr(b, "kept_steps", None)):
        raise _Refused(404, "this server keeps no steps")
    return b  # type: ignore[return-value]


def _step_number(value: str) -> int:
    if not _STEP.fullmatch(value):
        raise _Refused(404, f"no step {_safe_detail(value)[:24]!r}: steps are numbered from 1")
    return int(value)


def _add_step_routes(
    router: APIRouter, backend_for: Callable[[Request], SessionBackend]
) -> None:
    """A stepped session's kept steps (sessions/step_store.py), to its owner: the list,
    each step's result.json, and its files."""

    @_answering
    async def list_steps(request: Request, sid: str) -> JSONResponse:
        sid = _session_id(sid)
        return _json({"steps": await _step_backend(backend_for(request)).kept_steps(sid)})

    @_answering
    async def get_step(request: Request, sid: str, step: str) -> JSONResponse:
        sid = _session_id(sid)
        return _json(await _step_backend(backend_for(request)).kept_step(sid, _step_number(step)))

    @_answering
    async def get_step_file(request: Request, sid: str, step: str, file: str) -> Response:
        sid = _session_id(sid)
        number = _step_number(step)
        if not _STEP_FILE.fullmatch(file):
            raise _Refused(404, f"step {number} has no such file")
        data, content_type = await _step_backend(backend_for(request)).kept_step_file(sid, number, file)
        return Response(data, media_type=content_type)

    router.add_api_route("/sessions/{sid}/steps", list_steps, methods=["GET"], name="list_steps")
    router.add_api_route("/sessions/{sid}/steps/{step}", get_step, methods=["GET"], name="get_step")
    router.add_api_route("/sessions/{sid}/steps/{step}/{file}", get_step_file, methods=["GET"],
                         name="get_step_file")
