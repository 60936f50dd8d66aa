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

import urllib.parse
from typing import Any, AsyncIterator

import httpx

from reactor_serve.client.peer import ClientPeer, ReceivedVideo
from reactor_serve.client.signalling import (
    checked_json,
    host_candidates_for,
    http_client,
    watch_signal,
    watch_url,
)

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
        ended = self.peer.session_end
        return None if ended is None else ended.get("reason") or "unknown"

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
    host_candidates = host_candidates_for(base_url, loopback_only)
    http = http_client(token)
    link = watch_url(base_url, viewer_token)
    try:
        descriptor = checked_json(await http.get(link), 200)
        ice = checked_json(await http.get(f"{link}/ice_servers"), 200).get("ice_servers", [])
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice,
                          host_candidates=host_candidates)
        viewer = ReactorViewer(base_url, viewer_token, peer, descriptor, http)

        def offered(connection_id: int | None) -> None:
            viewer.connection_id = connection_id

        await peer.connect(watch_signal(http, link, timeout, on_offered=offered), timeout=timeout)
        return viewer
    except BaseException:
        await http.aclose()
        raise
