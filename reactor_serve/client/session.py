"""`ReactorClient`: an async Python client for a reactor-serve model (docs/protocol.md).

    client = await connect("http://127.0.0.1:8080")
    client.send_command("set_brightness", {"brightness": 1.5})
    frame = await client.next_frame()          # ReceivedVideo: .image, .pts, .arrived_at
    schema = await client.request_schema()
    async for message in client.messages():    # model and runtime messages
        ...
    await client.close()

The client survives a lost transport (a network drop, a suspended laptop): its
`ReconnectSupervisor` (client/reconnect.py) offers again on the same session and the
model keeps its state. When the session is over it says why, always: the server's
`sessionEnded`, or one built here from what the server answers about the session (or
from the server being gone). `client.state` is connecting | streaming | reconnecting |
ended. How it talks HTTP to the server is client/signalling.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import httpx
import numpy as np

from reactor_serve.client.input_latency import LatencyRecord
from reactor_serve.client.peer import ClientPeer, ReceivedAudio, ReceivedVideo, Signal
from reactor_serve.client.reconnect import (
    ClientState,
    ReconnectPolicy,
    ReconnectSupervisor,
)
from reactor_serve.client.signalling import (
    SessionOver,
    SessionRefused,
    check_session,
    checked_json,
    fetch_ice_servers,
    host_candidates_for,
    http_client,
    join_url,
    offer_signal,
    start_session,
    stop_session,
)

__all__ = ["ReactorClient", "RecordingRefused", "connect"]

log = logging.getLogger("reactor_serve.client")


class RecordingRefused(RuntimeError):
    """The server answered a recording request with `recordingError`; `data` is it
    (`{"command", "message", "errors": [{"field", "rule", "value"}]}`)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(str(data.get("message") or data))
        self.data = data


StateCallback = Callable[[str, dict[str, Any]], None]


class ReactorClient:
    """One session with a model. Use `connect()` to make one."""

    def __init__(
        self,
        base_url: str,
        peer: ClientPeer,
        descriptor: dict[str, Any],
        http: httpx.AsyncClient,
        *,
        reconnect: ReconnectPolicy | None = None,
        on_state: StateCallback | None = None,
        on_queue: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.base_url = base_url
        self.peer = peer
        self.descriptor = descriptor
        self.session_id: str = descriptor["session_id"]
        self._http = http
        self.queue_status: dict[str, Any] | None = None
        self.policy = reconnect or ReconnectPolicy()
        self.on_state = on_state
        self._on_queue = on_queue
        self.state = ClientState.CONNECTING
        # Why the session ended, once it has: the `sessionEnded` reason and message.
        self.end_reason: str | None = None
        self.end_message: str | None = None
        self._supervisor: ReconnectSupervisor | None = None
        self._supervising: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def reconnects(self) -> int:
        """Successful reconnects so far (each one a new peer connection, same session)."""
        return self._supervisor.reconnects if self._supervisor is not None else 0

    # ---- state ------------------------------------------------------------------

    def _set_state(self, state: str, **detail: Any) -> None:
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state, detail)
            except Exception:
                log.exception("on_state callback failed")

    def _start_supervisor(self) -> None:
        supervisor = ReconnectSupervisor(
            self.peer,
            self.policy,
            check_session=lambda: check_session(self._http, self.base_url, self.session_id),
            reoffer=lambda timeout: self.peer.connect(self._signal("PUT", timeout), timeout=timeout),
            set_state=self._set_state,
            end=self._end,
            server=self.base_url,
            name=self._masked(),
        )
        self._supervisor = supervisor
        self.peer.on_lost = supervisor.lost
        self._set_state(ClientState.STREAMING)
        self._supervising = asyncio.get_running_loop().create_task(
            supervisor.run(), name=f"reactor-client-{self.session_id[:6]}"
        )

    async def _end(self, reason: str, message: str | None) -> None:
        """The session is over: say why (as the server's own `sessionEnded` would) and
        close our side. The server's own message, when it came, is not repeated."""
        if self.state == ClientState.ENDED:
            return
        self.end_reason, self.end_message = reason, message
        if self.peer.session_end is None:
            data: dict[str, Any] = {"reason": reason, "detected_by": "client"}
            if message:
                data["message"] = message
            self.peer.add_message(
                {"scope": "runtime", "data": {"type": "sessionEnded", "data": data}}
            )
        log.info("session %s ended: %s%s", self._masked(), reason,
                 f" ({message})" if message else "")
        self._set_state(ClientState.ENDED, reason=reason, message=message)
        await self.peer.close()

    async def _still_on(self) -> None:
        """Raises SessionRefused, naming why, once the server says the session ended."""
        try:
            await check_session(self._http, self.base_url, self.session_id)
        except SessionOver as over:
            raise SessionRefused(
                f"the session ended before its connection opened ({over.reason}"
                + (f": {over.message}" if over.message else "") + ")"
            ) from None
        except httpx.HTTPError:
            pass  # the server did not answer: the wait goes on, bounded by its timeout

    def _masked(self) -> str:
        return self.session_id[:4] + "…"

    # ---- signalling ---------------------------------------------------------------

    def _signal(self, method: str, timeout: float) -> Signal:
        """Deliver an offer with `method` (POST: the first, PUT: a reconnect) and poll
        for its answer for up to `timeout` seconds."""

        def on_queue(status: dict[str, Any]) -> None:
            self.queue_status = status
            if self._on_queue is not None and status:
                self._on_queue(status)

        return offer_signal(
            self._http, self.base_url, self.session_id, method, timeout, on_queue=on_queue
        )

    # ---- receiving --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The session is over for this client (ended, or closed)."""
        return self.peer.closed

    @property
    def output_tracks(self) -> list[str]:
        return [t["name"] for t in self.peer.tracks if t["direction"] == "recvonly"]

    async def next_frame(self, track: str | None = None, timeout: float = 10.0) -> ReceivedVideo:
        """The next video frame received on `track` (default: the first video output)."""
        return await self.peer.next_frame(track or self.peer.default_video(), timeout)

    def frames(self, track: str | None = None) -> AsyncIterator[ReceivedVideo]:
        """Every video frame received on `track` from now on (across reconnects)."""
        return self.peer.iter_video(track or self.peer.default_video())

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
        return await self.peer.next_message(type, scope=scope, timeout=timeout, after=after)

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Every message envelope received from now on, as it arrives, up to and
        including the `sessionEnded` that ends the session."""
        index = len(self.peer.messages)
        while True:
            while index < len(self.peer.messages):
                yield self.peer.messages[index]
                index += 1
            if self.peer.closed:
                return
            await self.peer.wait_for(
                lambda: len(self.peer.messages) > index or self.peer.closed, 3600, "message"
            )

    # ---- sending ----------------------------------------------------------------

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> str:
        """Send a model command (`set_<field>` or an `@event` name); returns its id,
        under which `input_latency()` reports the frame that answered it. Raises
        ConnectionError while there is no open connection (reconnecting, ended)."""
        return self.peer.send_command(name, data)

    def input_latency(self) -> list[LatencyRecord]:
        """The commands answered so far (the latest 512), oldest first: each with its
        input-to-frame latency (send -> the first frame made after the model applied
        it, decoded here), that frame, and where the server's part of it went."""
        return self.peer.latency.records()

    def latency_summary(self) -> dict[str, Any]:
        """Input-to-frame latency of the answered commands: last, p50, p95 (ms), count."""
        return self.peer.latency.summary()

    def send_frame(self, track: str, image: np.ndarray) -> None:
        """Show `image` ((H, W, 3) uint8 RGB) on input track `track` until the next one."""
        self.peer.send_frame(track, image)

    async def request_schema(self, timeout: float = 10.0) -> dict[str, Any]:
        """The model's OpenAPI document (`modelSchema`)."""
        mark = len(self.peer.messages)
        self.peer.send_runtime("requestSchema", {})
        reply = await self.next_message("modelSchema", scope="runtime", after=mark, timeout=timeout)
        return reply["data"]

    async def viewer_link(self) -> dict[str, Any]:
        """A watch-only link to this session, for `watch()` or a browser:
        `{"viewer_token", "url", "viewers", "max_viewers"}`. The same token each time
        until `revoke_viewer_link()`; it dies with the session."""
        url = join_url(self.base_url, f"sessions/{self.session_id}/viewers")
        return checked_json(await self._http.post(url), 201)

    async def revoke_viewer_link(self) -> bool:
        """End every viewer and forget the link; whether there was one."""
        url = join_url(self.base_url, f"sessions/{self.session_id}/viewers")
        return bool(checked_json(await self._http.delete(url), 200).get("revoked"))

    # ---- uploads ------------------------------------------------------------------------

    async def upload(
        self, data: bytes, *, name: str, mime_type: str = "application/octet-stream"
    ) -> dict[str, Any]:
        """Upload a file to this session; returns the reference to put in a command's
        arguments where the model takes an `UploadedFile`:
        `client.send_command("set_palette", {"image": await client.upload(png, name="a.png",
        mime_type="image/png")})`. Raises SessionRefused naming the problem (over the
        model's bounds: 413)."""
        url = join_url(self.base_url, f"sessions/{self.session_id}/uploads")
        reserved = checked_json(await self._http.post(
            url, json={"name": name, "size": len(data), "mime_type": mime_type}), 201)
        checked_json(await self._http.put(
            reserved["presigned_url"], content=data, headers={"content-type": mime_type}), 200)
        return {"upload_id": reserved["upload_id"], "name": name, "mime_type": mime_type,
                "size": len(data)}

    # ---- recordings (the model must opt in: `recording: {enabled: true}`) -------------

    async def start_recording(self, timeout: float = 10.0) -> dict[str, Any]:
        """Record this session on the server from now on: `{"id", "url"}` once the
        first frame is written. Raises RecordingRefused (not allowed, already
        recording, the destination cannot be written)."""
        return await self._recording_request("startRecording", {}, "recordingStarted", timeout)

    async def stop_recording(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop the recording: `{"id", "url", "frames", "bytes", "seconds", "commands",
        "dropped", "reason"}` once its files are complete (and uploaded)."""
        return await self._recording_request("stopRecording", {}, "recordingStopped", timeout)

    async def save_clip(self, seconds: float | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Save the last `seconds` (default: all the server keeps) as a file of its
        own: `{"id", "url", "frames", "bytes", "seconds", "commands"}`."""
        data: dict[str, Any] = {} if seconds is None else {"seconds": seconds}
        return await self._recording_request("saveClip", data, "clipSaved", timeout)

    async def _recording_request(
        self, type_: str, data: dict[str, Any], answer: str, timeout: float
    ) -> dict[str, Any]:
        mark = len(self.peer.messages)
        self.peer.send_runtime(type_, data)

        def find() -> dict[str, Any] | None:
            for envelope in self.peer.messages[mark:]:
                message = envelope.get("data") or {}
                if envelope.get("scope") != "runtime":
                    continue
                if message.get("type") == answer:
                    return message
                if message.get("type") == "recordingError" and (
                    (message.get("data") or {}).get("command") == type_
                ):
                    return message
            return None

        reply = await self.peer.wait_for(find, timeout, f"answer to {type_}")
        if reply["type"] == "recordingError":
            raise RecordingRefused(reply.get("data") or {})
        return reply.get("data") or {}

    async def request_capabilities(self, timeout: float = 10.0) -> dict[str, Any]:
        mark = len(self.peer.messages)
        self.peer.send_runtime("requestCapabilities", {})
        reply = await self.next_message(
            "modelCapabilities", scope="runtime", after=mark, timeout=timeout
        )
        return reply["data"]

    async def wait_state(self, state: str, timeout: float = 30.0) -> None:
        """Wait until `client.state` is `state`."""
        await self.peer.wait_for(lambda: self.state == state, timeout, f"state {state!r}")

    async def wait_closed(self, timeout: float = 30.0) -> str | None:
        """Wait for the end of the session; returns why it ended (`end_reason`)."""
        await self.peer.wait_for(lambda: self.peer.closed, timeout, "end of the session")
        return self.end_reason

    async def close(self) -> None:
        """Stop the session (naming it) and close the connection; never reconnects.
        Calling it again does nothing."""
        if self._closing:
            return
        self._closing = True
        supervisor, self._supervising = self._supervising, None
        if supervisor is not None and not supervisor.done():
            supervisor.cancel()
            try:
                await supervisor
            except asyncio.CancelledError:
                pass
        try:
            if self.state != ClientState.ENDED:
                await stop_session(self._http, self.base_url, self.session_id)
        except httpx.HTTPError:
            pass  # the server may already be gone; closing the peer still ends it
        finally:
            await self.peer.close()
            await self._http.aclose()
            if self.state != ClientState.ENDED:
                self.end_reason = "client_closed"
                self._set_state(ClientState.ENDED, reason="client_closed", message=None)


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
    on_state: StateCallback | None = None,
    reconnect: ReconnectPolicy | bool = True,
) -> ReactorClient:
    """Start a session with the model served at `base_url` and connect to it.

    `inputs` maps input track names to a frame, or an iterable / async iterable of
    frames, sent at `input_fps`; any input track can also be fed later with
    `send_frame`. `loopback_only` (default: whether `base_url` is on this machine)
    keeps WebRTC on 127.0.0.1. Raises SessionRefused with the server's reason.

    `on_state(state, detail)` is called on each change of `client.state`:
    connecting, streaming, reconnecting (`{"attempt", "reason"}`), streaming again
    (`{"reconnects"}`), ended (`{"reason", "message"}`). `reconnect`: a
    ReconnectPolicy, True for the default one, False to end on the first loss.
    """
    host_candidates = host_candidates_for(base_url, loopback_only)
    if isinstance(reconnect, bool):
        policy = ReconnectPolicy(enabled=reconnect)
    else:
        policy = reconnect
    if on_state is not None:
        on_state(ClientState.CONNECTING, {})
    http = http_client(token)
    session_id: str | None = None
    peer: ClientPeer | None = None
    try:
        descriptor = await start_session(http, base_url, extra_args)
        session_id = descriptor["session_id"]
        ice = await fetch_ice_servers(http, base_url, descriptor["session_id"])
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice, inputs=inputs,
                          host_candidates=host_candidates,
                          input_fps=input_fps)
        client = ReactorClient(base_url, peer, descriptor, http, reconnect=policy,
                               on_state=on_state, on_queue=on_queue)
        await peer.connect(client._signal("POST", timeout), timeout=timeout,
                           still_on=client._still_on)
        client._start_supervisor()
        return client
    except BaseException:
        # Given up (failed, timed out or cancelled): the server would hold what this
        # started (a seat, or a place in the queue) until its own timeouts ran out.
        giving_up = asyncio.ensure_future(_give_up(http, base_url, session_id, peer))
        try:
            await asyncio.shield(giving_up)
        except asyncio.CancelledError:
            pass  # it goes on by itself; the caller's own exception is what it gets
        raise


# How long a client that gave up on connecting waits for the server to take its stop.
GIVE_UP_STOP_S = 5.0


async def _give_up(
    http: httpx.AsyncClient, base_url: str, session_id: str | None, peer: ClientPeer | None
) -> None:
    try:
        if session_id is not None:
            await stop_session(http, base_url, session_id, timeout=GIVE_UP_STOP_S)
    except httpx.HTTPError:
        pass  # the server is gone or slow: its own timeouts end the session
    finally:
        if peer is not None:
            await peer.close()
        await http.aclose()

