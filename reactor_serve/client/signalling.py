"""The HTTP half of connecting to a session (docs/protocol.md): starting it, its ICE
servers, delivering an offer and polling for the answer, asking whether it still lives.

The owner's client, the viewer's client and the connectivity check all connect this
way; only what they offer, and to which URL, differs. Every refusal by the server comes
out as `SessionRefused`, carrying the status and the server's `detail`, so callers can
tell "gone" (404) from "busy" or "not allowed".
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any, Awaitable, Callable

import httpx

from reactor_serve.client.peer import Signal
from reactor_serve.rtc.host_candidates import HostCandidatePolicy, is_loopback_host

__all__ = [
    "SessionOver",
    "SessionRefused",
    "check_session",
    "checked_json",
    "fetch_ice_servers",
    "host_candidates_for",
    "http_client",
    "join_url",
    "offer_signal",
    "start_session",
    "stop_session",
    "watch_signal",
    "watch_url",
]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_CLIENT_INFO = {"sdk": "reactor-serve-python"}


class SessionRefused(RuntimeError):
    """The server would not start or negotiate the session (busy, bad token, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SessionOver(Exception):
    """The server says the session has ended (`reason`, `message`)."""

    def __init__(self, reason: str, message: str | None) -> None:
        super().__init__(message or reason)
        self.reason = reason
        self.message = message


def join_url(base_url: str, path: str) -> str:
    """`path` under `base_url`, with exactly one slash between them."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def watch_url(base_url: str, viewer_token: str) -> str:
    """The URL a viewer link is watched at (its descriptor; its ICE servers and
    offers below it)."""
    return join_url(base_url, f"watch/{urllib.parse.quote(viewer_token, safe='')}")


def http_client(token: str | None) -> httpx.AsyncClient:
    """An HTTP client for one server, carrying its auth token when it has one."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0))


def host_candidates_for(base_url: str, loopback_only: bool | None) -> HostCandidatePolicy | None:
    """Which host candidates to offer a server at `base_url`: loopback only when asked,
    or by default when the server is on this machine (aioice leaves 127.0.0.1 out of its
    candidates, so such a server would not be reached); None: every interface."""
    if loopback_only is None:
        loopback_only = is_loopback_host(urllib.parse.urlparse(base_url).hostname or "")
    return HostCandidatePolicy(loopback_only=True) if loopback_only else None


def checked_json(response: httpx.Response, expected: int) -> dict[str, Any]:
    """The JSON body of `response`, or SessionRefused naming the request, the status
    and the server's `detail` when the status is not `expected`."""
    if response.status_code != expected:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise SessionRefused(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {detail}",
            response.status_code,
        )
    return response.json() if response.content else {}


async def start_session(
    http: httpx.AsyncClient, base_url: str, extra_args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`POST start_session` on the model at `base_url`: the session descriptor.
    Raises SessionRefused with the server's reason."""
    body = {"extra_args": extra_args} if extra_args else {}
    return checked_json(await http.post(join_url(base_url, "start_session"), json=body), 200)


async def fetch_ice_servers(
    http: httpx.AsyncClient, base_url: str, session_id: str
) -> list[dict[str, Any]]:
    """The session's `ice_servers` (docs/protocol.md: `[{"uris", "credentials"?}]`)."""
    url = join_url(base_url, f"sessions/{session_id}/transport/webrtc/ice_servers")
    return checked_json(await http.get(url), 200).get("ice_servers", [])


async def stop_session(
    http: httpx.AsyncClient, base_url: str, session_id: str, timeout: float | None = None
) -> None:
    """`POST stop_session` naming the session (`timeout`: the request's bound, else the
    client's). Raises httpx.HTTPError when the server cannot be reached."""
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    await http.post(join_url(base_url, "stop_session"), json={"session_id": session_id},
                    **kwargs)


async def check_session(
    http: httpx.AsyncClient, base_url: str, session_id: str
) -> dict[str, Any]:
    """The session's descriptor; raises SessionOver when the server says it ended (or
    no longer knows it). Always names the session: the server tells nothing about
    sessions to a request that does not."""
    reply = await http.get(join_url(base_url, "session"), params={"session_id": session_id})
    body = _json(reply)
    if reply.status_code == 404:
        raise SessionOver("error", _detail(reply, body))
    if reply.status_code == 200 and body.get("state") == "ended":
        raise SessionOver(body.get("end_reason") or "unknown", body.get("end_message"))
    return body


def offer_signal(
    http: httpx.AsyncClient,
    base_url: str,
    session_id: str,
    method: str,
    timeout: float,
    *,
    on_queue: Callable[[dict[str, Any]], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> Signal:
    """A `Signal` for `ClientPeer.connect`: deliver the offer to session `session_id`
    with `method` (POST: the session's first offer, PUT: a new connection for it) and
    poll for its answer for up to `timeout` seconds. `on_queue` gets the body of each
    202 while the answer is pending (the queue position, when queued)."""
    url = join_url(base_url, f"sessions/{session_id}/transport/webrtc/sdp_params")
    return _polled_signal(
        http, method, url, _CLIENT_INFO, timeout,
        name_connection=False, on_queue=on_queue,
        missing=f"no SDP answer within {timeout:g} s", clock=clock, sleep=sleep,
    )


def watch_signal(
    http: httpx.AsyncClient,
    watch: str,
    timeout: float,
    *,
    on_offered: Callable[[int | None], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> Signal:
    """A `Signal` for a viewer: offer at the viewer link `watch` (a `watch_url`) and poll
    for the answer of that connection for up to `timeout` seconds. `on_offered` gets the
    connection id the server gave the offer."""
    return _polled_signal(
        http, "POST", f"{watch}/sdp_params", {**_CLIENT_INFO, "viewer": True}, timeout,
        name_connection=True, on_offered=on_offered,
        missing=f"no SDP answer for the viewer within {timeout:g} s", clock=clock, sleep=sleep,
    )


def _polled_signal(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    client_info: dict[str, Any],
    timeout: float,
    *,
    name_connection: bool,
    missing: str,
    on_queue: Callable[[dict[str, Any]], None] | None = None,
    on_offered: Callable[[int | None], None] | None = None,
    clock: Clock,
    sleep: Sleep,
) -> Signal:
    """Offer at `url` (answered 202 with a connection id), then poll the same URL until
    the answer is there. `name_connection`: the poll names the connection (the viewer
    API wants it); the owner's poll does not and gets the latest offer's answer."""

    async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
        reply = checked_json(
            await http.request(
                method, url,
                json={"sdp_offer": sdp_offer, "client_info": client_info,
                      "track_mapping": track_mapping},
            ),
            202,
        )
        connection_id = reply.get("connection_id")
        if on_offered is not None:
            on_offered(connection_id)
        params = {"connection_id": connection_id} if name_connection else None
        deadline = clock() + timeout
        # Fast at first (an answer is usually ready within a few tens of ms),
        # then backing off: the page polls the same way.
        delay = 0.02
        while clock() < deadline:
            poll = await http.get(url, params=params)
            if poll.status_code == 200:
                answer = poll.json()
                # An answer naming another connection is a stale one; one naming
                # none is the latest offer's (docs/protocol.md: the server clears the
                # stored answer on each offer).
                if answer.get("connection_id") in (None, connection_id):
                    return answer["sdp_answer"]
            elif poll.status_code == 202:
                if on_queue is not None:
                    on_queue(poll.json() if poll.content else {})
            else:
                checked_json(poll, 200)
            await sleep(delay)
            delay = min(delay * 1.5, 1.0)
        raise SessionRefused(missing)

    return signal


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _detail(response: httpx.Response, body: dict[str, Any]) -> str:
    detail = body.get("detail")
    return detail if isinstance(detail, str) else f"{response.status_code} {response.text}"
