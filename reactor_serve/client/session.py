"""`ReactorClient`: an async Python client for a reactor-serve model (PROTOCOL.md).

    client = await connect("http://127.0.0.1:8080")
    client.send_command("set_brightness", {"brightness": 1.5})
    frame = await client.next_frame()          # ReceivedVideo: .image, .pts, .arrived_at
    schema = await client.request_schema()
    async for message in client.messages():    # model and runtime messages
        ...
    await client.close()
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any, AsyncIterator, Callable

import httpx
import numpy as np

from reactor_serve.client.peer import ClientPeer, ReceivedAudio, ReceivedVideo
from reactor_serve.webrtc.ice import is_loopback_host, use_loopback_candidates

__all__ = ["ReactorClient", "SessionRefused", "connect"]


class SessionRefused(RuntimeError):
    """The server would not start or negotiate the session (busy, bad token, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ReactorClient:
    """One session with a model. Use `connect()` to make one."""

    def __init__(self, base_url: str, peer: ClientPeer, descriptor: dict[str, Any],
                 http: httpx.AsyncClient) -> None:
        self.base_url = base_url
        self.peer = peer
        self.descriptor = descriptor
        self.session_id: str = descriptor["session_id"]
        self._http = http
        self.queue_status: dict[str, Any] | None = None
        self._watch: asyncio.Task[None] | None = None

    WATCH_INTERVAL_S = 2.0

    def _start_watch(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._watch_session())

    async def _watch_session(self) -> None:
        """End our side when the server says the session is over. A server-side end
        normally arrives as `sessionEnded`, but a replica that dies cannot send it, and
        WebRTC alone takes half a minute to notice."""
        url = _join(self.base_url, "session")
        while not self.peer.closed:
            await asyncio.sleep(self.WATCH_INTERVAL_S)
            try:
                reply = await self._http.get(url, params={"session_id": self.session_id})
            except httpx.HTTPError:
                continue
            if reply.status_code == 404 or (
                reply.status_code == 200 and reply.json().get("state") == "ended"
            ):
                await self.peer.close()
                return

    # ---- receiving --------------------------------------------------------------

    @property
    def output_tracks(self) -> list[str]:
        return [t["name"] for t in self.peer.tracks if t["direction"] == "recvonly"]

    def _default_video(self) -> str:
        for track in self.peer.tracks:
            if track["direction"] == "recvonly" and track["kind"] == "video":
                return track["name"]
        raise LookupError("the model has no output video track")

    async def next_frame(self, track: str | None = None, timeout: float = 10.0) -> ReceivedVideo:
        """The next video frame received on `track` (default: the first video output)."""
        name = track or self._default_video()
        seen = self.peer.video.get(name)
        start = seen[-1].index + 1 if seen else 0
        return await self.peer.wait_for(
            lambda: next((f for f in self.peer.video.get(name, ()) if f.index >= start), None),
            timeout,
            f"video frame on {name!r}",
        )

    def frames(self, track: str | None = None) -> AsyncIterator[ReceivedVideo]:
        """Every video frame received on `track` from now on."""
        return self.peer.iter_video(track or self._default_video())

    def audio(self, track: str) -> list[ReceivedAudio]:
        """The audio frames received so far on `track` (the most recent few seconds)."""
        return list(self.peer.audio.get(track, ()))

    @property
    def stats(self) -> dict[str, Any]:
        """The server's latest `stats` runtime message."""
        return self.peer.stats

    async def next_message(
        self, type: str | None = None, *, scope: str | None = None, timeout: float = 10.0,
        after: int | None = None,
    ) -> dict[str, Any]:
        """The next message (an envelope's `data`: `{"type", "data"}`) of this type and
        scope received after index `after` (default: from now)."""
        start = len(self.peer.messages) if after is None else after

        def find() -> dict[str, Any] | None:
            for envelope in self.peer.messages[start:]:
                data = envelope.get("data") or {}
                if (type is None or data.get("type") == type) and (
                    scope is None or envelope.get("scope") == scope
                ):
                    return data
            return None

        return await self.peer.wait_for(find, timeout, f"message {type or '(any)'}")

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Every message envelope received from now on, as it arrives."""
        index = len(self.peer.messages)
        while not self.peer.closed:
            while index < len(self.peer.messages):
                yield self.peer.messages[index]
                index += 1
            await self.peer.wait_for(
                lambda: len(self.peer.messages) > index or self.peer.closed, 3600, "message"
            )

    # ---- sending ----------------------------------------------------------------

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> None:
        """Send a model command (`set_<field>` or an `@event` name)."""
        self.peer.send_command(name, data)

    def send_frame(self, track: str, image: np.ndarray) -> None:
        """Show `image` ((H, W, 3) uint8 RGB) on input track `track` until the next one."""
        self.peer.send_frame(track, image)

    async def request_schema(self, timeout: float = 10.0) -> dict[str, Any]:
        """The model's OpenAPI document (`modelSchema`)."""
        mark = len(self.peer.messages)
        self.peer.send_runtime("requestSchema", {})
        reply = await self.next_message("modelSchema", scope="runtime", after=mark, timeout=timeout)
        return reply["data"]

    async def request_capabilities(self, timeout: float = 10.0) -> dict[str, Any]:
        mark = len(self.peer.messages)
        self.peer.send_runtime("requestCapabilities", {})
        reply = await self.next_message(
            "modelCapabilities", scope="runtime", after=mark, timeout=timeout
        )
        return reply["data"]

    async def wait_closed(self, timeout: float = 30.0) -> None:
        await self.peer.wait_for(lambda: self.peer.closed, timeout, "end of the session")

    async def close(self) -> None:
        """Stop the session and close the connection (again: nothing happens)."""
        if self._http.is_closed:
            return
        if self._watch is not None:
            self._watch.cancel()
        try:
            await self._http.post(
                _join(self.base_url, "stop_session"), json={"session_id": self.session_id}
            )
        except httpx.HTTPError:
            pass  # the server may already be gone; closing the peer still ends it
        finally:
            await self.peer.close()
            await self._http.aclose()


async def connect(
    base_url: str,
    *,
    token: str | None = None,
    inputs: dict[str, Any] | None = None,
    input_fps: float = 30.0,
    extra_args: dict[str, Any] | None = None,
    loopback_only: bool | None = None,
    timeout: float = 60.0,
    on_queue: Callable[[dict[str, Any]], None] | None = None,
) -> ReactorClient:
    """Start a session with the model served at `base_url` and connect to it.

    `inputs` maps input track names to a frame, or an iterable / async iterable of
    frames, sent at `input_fps`; any input track can also be fed later with
    `send_frame`. `loopback_only` (default: whether `base_url` is on this machine)
    keeps WebRTC on 127.0.0.1. Raises SessionRefused with the server's reason.
    """
    if loopback_only is None:
        loopback_only = _is_loopback(base_url)
    if loopback_only:
        use_loopback_candidates(True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0))
    try:
        body = {"extra_args": extra_args} if extra_args else {}
        descriptor = _checked(await http.post(_join(base_url, "start_session"), json=body), 200)
        sid = descriptor["session_id"]
        transport = _join(base_url, f"sessions/{sid}/transport/webrtc")
        ice = _checked(await http.get(f"{transport}/ice_servers"), 200).get("ice_servers", [])
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice, inputs=inputs,
                          input_fps=input_fps)
        client = ReactorClient(base_url, peer, descriptor, http)

        async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
            reply = _checked(
                await http.post(
                    f"{transport}/sdp_params",
                    json={"sdp_offer": sdp_offer, "client_info": {"sdk": "reactor-serve-python"},
                          "track_mapping": track_mapping},
                ),
                202,
            )
            connection_id = reply.get("connection_id")
            deadline = time.monotonic() + timeout
            delay = 0.05
            while time.monotonic() < deadline:
                poll = await http.get(f"{transport}/sdp_params")
                if poll.status_code == 200:
                    answer = poll.json()
                    if connection_id is None or answer.get("connection_id") == connection_id:
                        return answer["sdp_answer"]
                elif poll.status_code == 202:
                    status = poll.json() if poll.content else {}
                    client.queue_status = status
                    if on_queue is not None and status:
                        on_queue(status)
                else:
                    _checked(poll, 200)
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 1.0)
            raise SessionRefused(f"no SDP answer within {timeout} s")

        await peer.connect(signal, timeout=timeout)
        client._start_watch()
        return client
    except BaseException:
        await http.aclose()
        raise


def _checked(response: httpx.Response, expected: int) -> dict[str, Any]:
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


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def _is_loopback(base_url: str) -> bool:
    return is_loopback_host(urllib.parse.urlparse(base_url).hostname or "")
