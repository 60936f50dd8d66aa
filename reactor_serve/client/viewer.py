"""`watch()`: watch someone's session with its viewer link, receiving what its owner sees.

    link = await owner.viewer_link()                 # the owner's ReactorClient
    viewer = await watch(base_url, link["viewer_token"])   # or watch(link["url"])
    frame = await viewer.next_frame()
    async for message in viewer.messages(): ...      # model messages, stats, sessionEnded
    await viewer.close()                             # the session goes on

A viewer cannot steer the session: `send_command` raises `ViewerCannotCommand`
(a command sent anyway, with `viewer.peer.send_command`, is answered by the server
with a `commandError`, "viewers cannot send commands", and never reaches the model).
A viewer does not reconnect: when its connection is lost it is over (`closed`), and
watching again is a new `watch()` with the same link. When the session ends the
viewer gets `sessionEnded` and its connection closes.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any, AsyncIterator

import httpx

from reactor_serve.client.peer import ClientPeer, ReceivedVideo, Signal
from reactor_serve.client.session import SessionRefused, checked_json, join_url
from reactor_serve.rtc.host_candidates import HostCandidatePolicy, is_loopback_host

__all__ = ["ReactorViewer", "ViewerCannotCommand", "watch"]


class ViewerCannotCommand(PermissionError):
    """Viewers watch; only the session's owner sends commands."""


class ReactorViewer:
    """One viewer's connection to a session. Use `watch()` to make one."""

    def __init__(
        self, base_url: str, viewer_token: str, peer: ClientPeer, descriptor: dict[str, Any],
        http: httpx.AsyncClient,
    ) -> None:
        self.base_url = base_url
        self.viewer_token = viewer_token
        self.peer = peer
        self.descriptor = descriptor
        self.connection_id: int | None = None
        self._http = http

    @property
    def closed(self) -> bool:
        return self.peer.closed

    @property
    def end_reason(self) -> str | None:
        """The `sessionEnded` reason, once the session has ended."""
        for envelope in self.peer.messages:
            data = envelope.get("data") or {}
            if envelope.get("scope") == "runtime" and data.get("type") == "sessionEnded":
                return (data.get("data") or {}).get("reason") or "unknown"
        return None

    @property
    def stats(self) -> dict[str, Any]:
        """The session's latest `stats` (the owner's too), `viewers` among them."""
        return self.peer.stats

    async def next_frame(self, track: str | None = None, timeout: float = 10.0) -> ReceivedVideo:
        """The next video frame received on `track` (default: the first video output)."""
        return await self.peer.next_frame(track or self.peer.default_video(), timeout)

    def frames(self, track: str | None = None) -> AsyncIterator[ReceivedVideo]:
        return self.peer.iter_video(track or self.peer.default_video())

    async def next_message(
        self, type: str | None = None, *, scope: str | None = None, timeout: float = 10.0,
        after: int | None = None,
    ) -> dict[str, Any]:
        """The next message (an envelope's `data`: `{"type", "data"}`) of this type and
        scope received after index `after` (default: from now)."""
        return await self.peer.next_message(type, scope=scope, timeout=timeout, after=after)

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> None:
        """Always raises ViewerCannotCommand: only the owner steers the session."""
        raise ViewerCannotCommand(f"viewers cannot send commands ({name!r} was not sent)")

    async def wait_closed(self, timeout: float = 30.0) -> str | None:
        """Wait until the viewer's connection is over; the session's end reason, if it ended."""
        await self.peer.wait_for(lambda: self.peer.closed, timeout, "end of watching")
        return self.end_reason

    async def close(self) -> None:
        """Stop watching. The session, its owner and other viewers are not affected."""
        try:
            await self.peer.close()
        finally:
            await self._http.aclose()


async def watch(
    base_url: str,
    viewer_token: str | None = None,
    *,
    token: str | None = None,
    loopback_only: bool | None = None,
    timeout: float = 30.0,
) -> ReactorViewer:
    """Watch the session whose viewer link is `viewer_token` on the model served at
    `base_url`, or given a viewer URL (`.../?watch=<token>`) as `base_url` alone.
    `token`: the server's auth token, if it has one. Raises SessionRefused with the
    server's reason (404: an unknown link or an ended session; 429: the session has
    its `max_viewers` already)."""
    if viewer_token is None:
        parsed = urllib.parse.urlparse(base_url)
        found = urllib.parse.parse_qs(parsed.query).get("watch")
        if not found:
            raise ValueError("give a viewer token, or a viewer URL with ?watch=<token>")
        viewer_token = found[0]
        base_url = urllib.parse.urlunparse(parsed._replace(query="", fragment=""))
    if loopback_only is None:
        loopback_only = is_loopback_host(urllib.parse.urlparse(base_url).hostname or "")
    host_candidates = HostCandidatePolicy(loopback_only=True) if loopback_only else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0))
    watch_url = join_url(base_url, f"watch/{urllib.parse.quote(viewer_token, safe='')}")
    try:
        descriptor = checked_json(await http.get(watch_url), 200)
        ice = checked_json(await http.get(f"{watch_url}/ice_servers"), 200).get("ice_servers", [])
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice,
                          host_candidates=host_candidates)
        viewer = ReactorViewer(base_url, viewer_token, peer, descriptor, http)
        await peer.connect(_watch_signal(http, watch_url, viewer, timeout), timeout=timeout)
        return viewer
    except BaseException:
        await http.aclose()
        raise


def _watch_signal(
    http: httpx.AsyncClient, watch_url: str, viewer: ReactorViewer, timeout: float
) -> Signal:
    async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
        reply = checked_json(await http.post(f"{watch_url}/sdp_params", json={
            "sdp_offer": sdp_offer, "client_info": {"sdk": "reactor-serve-python", "viewer": True},
            "track_mapping": track_mapping,
        }), 202)
        cid = reply.get("connection_id")
        viewer.connection_id = cid
        deadline = time.monotonic() + timeout
        delay = 0.02
        while time.monotonic() < deadline:
            poll = await http.get(f"{watch_url}/sdp_params", params={"connection_id": cid})
            if poll.status_code == 200:
                return poll.json()["sdp_answer"]
            if poll.status_code != 202:
                checked_json(poll, 200)
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        raise SessionRefused(f"no SDP answer for the viewer within {timeout:g} s")

    return signal
