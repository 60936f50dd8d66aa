"""`ReactorClient`: an async Python client for a reactor-serve model (docs/protocol.md).

    client = await connect("http://127.0.0.1:8080")
    client.send_command("set_brightness", {"brightness": 1.5})
    frame = await client.next_frame()          # ReceivedVideo: .image, .pts, .arrived_at
    schema = await client.request_schema()
    async for message in client.messages():    # model and runtime messages
        ...
    await client.close()

The client survives a lost transport (a network drop, a suspended laptop): when its
peer connection fails or closes without `close()`, or the data channel goes quiet
while the server's once-a-second `stats` are expected, it offers again on the same
session (PUT .../sdp_params) with exponential backoff, and the model keeps its state.
When the session is over it says why, always: the server's `sessionEnded`, or, when
the server could not send one (a replica that died), a `sessionEnded` runtime message
built from what the server answers about the session (or from the server being gone).
`client.state` is connecting | streaming | reconnecting | ended.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import httpx
import numpy as np

from reactor_serve.client.input_latency import LatencyRecord
from reactor_serve.client.peer import ClientPeer, ReceivedAudio, ReceivedVideo, Signal
from reactor_serve.rtc.host_candidates import HostCandidatePolicy, is_loopback_host

__all__ = [
    "ClientState",
    "ReactorClient",
    "ReconnectPolicy",
    "RecordingRefused",
    "SessionRefused",
    "checked_json",
    "connect",
    "fetch_ice_servers",
    "join_url",
    "offer_signal",
    "start_session",
]

log = logging.getLogger("reactor_serve.client")


class RecordingRefused(RuntimeError):
    """The server answered a recording request with `recordingError`; `data` is it
    (`{"command", "message", "errors": [{"field", "rule", "value"}]}`)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(str(data.get("message") or data))
        self.data = data


class SessionRefused(RuntimeError):
    """The server would not start or negotiate the session (busy, bad token, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ClientState:
    """`ReactorClient.state` values, in the order a session goes through them."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"  # the transport was lost; offering again
    ENDED = "ended"


@dataclass(frozen=True)
class ReconnectPolicy:
    """When the client decides its transport is lost, and how it tries again.

    The server keeps a session whose transport was lost for its reconnect grace
    (30 s by default), so `give_up_after_s` matches that.
    """

    enabled: bool = True
    # No data-channel message for this long, while the server's `stats` (about once a
    # second) are expected, means the transport is gone even if ICE has not noticed
    # (it takes ~30 s to). Before the first `stats` nothing is expected.
    silence_timeout_s: float = 2.0
    # Backoff between attempts: first_delay_s, doubling, at most max_delay_s.
    first_delay_s: float = 0.2
    max_delay_s: float = 2.0
    # Give up (and report the session ended) after trying for this long in all ...
    give_up_after_s: float = 30.0
    # ... or once the server has refused connections for this long: nothing listens
    # there any more (a killed `reactor run`), and nobody will tell us why.
    unreachable_after_s: float = 3.0
    # How long one attempt waits for the answer to its offer.
    attempt_timeout_s: float = 10.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (1-based)."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1))


class _SessionOver(Exception):
    """The server says the session has ended (`reason`, `message`)."""

    def __init__(self, reason: str, message: str | None) -> None:
        super().__init__(message or reason)
        self.reason = reason
        self.message = message


StateCallback = Callable[[str, dict[str, Any]], None]


class ReactorClient:
    """One session with a model. Use `connect()` to make one."""

    # Without `stats` to watch, how often to ask the server whether the session lives.
    WATCH_INTERVAL_S = 2.0
    # How often the supervisor looks at the connection's liveness.
    TICK_S = 0.1

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
        # Successful reconnects so far (each one a new peer connection, same session).
        self.reconnects = 0
        # Why the session ended, once it has: the `sessionEnded` reason and message.
        self.end_reason: str | None = None
        self.end_message: str | None = None
        self._lost = asyncio.Event()
        self._lost_why = ""
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._scanned = 0
        self._server_end: dict[str, Any] | None = None

    # ---- state ------------------------------------------------------------------

    def _set_state(self, state: str, **detail: Any) -> None:
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state, detail)
            except Exception:
                log.exception("on_state callback failed")

    def _start_supervisor(self) -> None:
        self.peer.on_lost = self._on_lost
        self._set_state(ClientState.STREAMING)
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"reactor-client-{self.session_id[:6]}"
        )

    def _on_lost(self, why: str) -> None:
        self._lost_why = why
        self._lost.set()
        self.peer._changed.set()

    async def _supervise(self) -> None:
        """Watch the connection; reconnect when it is lost; end when the session is."""
        next_watch = time.monotonic() + self.WATCH_INTERVAL_S
        try:
            while self.state != ClientState.ENDED:
                try:
                    await asyncio.wait_for(self._lost.wait(), self.TICK_S)
                except asyncio.TimeoutError:
                    pass
                ended = self._server_sent_end()
                if ended is not None:
                    # The server said so itself: no reconnect, whatever the transport does.
                    await self._end(ended.get("reason") or "unknown", ended.get("message"))
                    return
                why = None
                if self._lost.is_set():
                    why = self._lost_why
                elif self.peer.stats_seen and (
                    time.monotonic() - self.peer.last_inbound > self.policy.silence_timeout_s
                ):
                    why = f"no message from the server for {self.policy.silence_timeout_s:g} s"
                elif not self.peer.stats_seen and time.monotonic() >= next_watch:
                    # A server that sends no stats: ask it now and then instead.
                    next_watch = time.monotonic() + self.WATCH_INTERVAL_S
                    if await self._end_if_server_ended():
                        return
                if why is not None:
                    await self._reconnect(why)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave the client hanging
            log.exception("session %s: the connection supervisor failed", self._masked())
            await self._end("error", f"the client's connection supervisor failed: {exc!r}")

    def _server_sent_end(self) -> dict[str, Any] | None:
        """The server's `sessionEnded`, if it has come (scanned incrementally: this
        runs ten times a second and the message list only grows)."""
        messages = self.peer.messages
        while self._server_end is None and self._scanned < len(messages):
            envelope = messages[self._scanned]
            self._scanned += 1
            data = envelope.get("data") or {}
            if envelope.get("scope") == "runtime" and data.get("type") == "sessionEnded":
                self._server_end = data.get("data") or {}
        return self._server_end

    async def _check_session(self) -> dict[str, Any]:
        """The session's descriptor; raises _SessionOver when the server says it ended
        (or no longer knows it). Always names the session: the server tells nothing
        about sessions to a request that does not."""
        reply = await self._http.get(
            join_url(self.base_url, "session"), params={"session_id": self.session_id}
        )
        body = _json(reply)
        if reply.status_code == 404:
            raise _SessionOver("error", _detail(reply, body))
        if reply.status_code == 200 and body.get("state") == "ended":
            raise _SessionOver(body.get("end_reason") or "unknown", body.get("end_message"))
        return body

    async def _reconnect(self, why: str) -> None:
        """Offer again on the same session until it works, the server says the session
        is over, or the policy gives up. The model keeps its state on the server."""
        log.info("session %s: transport lost (%s)", self._masked(), why)
        if not self.policy.enabled:
            await self._end_after_loss(why, "reconnecting is disabled")
            return
        started = time.monotonic()
        refused_since: float | None = None
        last_error = why
        attempt = 0
        while True:
            attempt += 1
            log.info("session %s: reconnecting (attempt %d)", self._masked(), attempt)
            self._set_state(ClientState.RECONNECTING, attempt=attempt, reason=why)
            # A short pause first, doubling per failure: the server may need a moment
            # to notice the loss, and a dead network should not be hammered.
            await asyncio.sleep(self.policy.delay(attempt))
            self._lost.clear()
            try:
                await self._check_session()
                remaining = self.policy.give_up_after_s - (time.monotonic() - started)
                timeout = max(1.0, min(self.policy.attempt_timeout_s, remaining))
                await self.peer.connect(self._signal("PUT", timeout), timeout=timeout)
            except _SessionOver as over:
                await self._end(over.reason, over.message)
                return
            except SessionRefused as exc:
                if exc.status == 404:
                    await self._end_after_404(str(exc))
                    return
                refused_since, last_error = None, str(exc)
            except httpx.HTTPError as exc:
                if _refused(exc):
                    refused_since = refused_since or time.monotonic()
                    if time.monotonic() - refused_since >= self.policy.unreachable_after_s:
                        await self._end(
                            "error",
                            f"lost the connection ({why}) and the server at {self.base_url} "
                            f"refuses connections: it is gone, and the session with it",
                        )
                        return
                else:
                    refused_since = None
                last_error = f"{type(exc).__name__}: {exc}"
            except (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError) as exc:
                refused_since, last_error = None, f"{type(exc).__name__}: {exc}"
            else:
                self.reconnects += 1
                log.info("session %s: reconnected after %d attempt(s)", self._masked(), attempt)
                self._set_state(ClientState.STREAMING, reconnects=self.reconnects)
                return
            log.info("session %s: reconnect attempt %d failed: %s",
                     self._masked(), attempt, last_error)
            if time.monotonic() - started >= self.policy.give_up_after_s:
                await self._end_after_loss(
                    why, f"could not reconnect within {self.policy.give_up_after_s:g} s "
                    f"({last_error})")
                return

    async def _end_after_404(self, detail: str) -> None:
        # The offer's 404 says in words that the session ended; the descriptor says why
        # in fields, when the server still remembers it.
        try:
            await self._check_session()
        except _SessionOver as over:
            if over.reason not in ("error", "unknown") or over.message:
                await self._end(over.reason, over.message)
                return
        except httpx.HTTPError:
            pass
        await self._end("error", detail)

    async def _end_after_loss(self, why: str, what: str) -> None:
        if await self._end_if_server_ended():
            return
        await self._end("timeout", f"lost the connection ({why}) and {what}")

    async def _end_if_server_ended(self) -> bool:
        """Ask the server whether the session lives; if it ended, end here with the
        server's reason. An unreachable server tells nothing: False."""
        try:
            await self._check_session()
        except _SessionOver as over:
            await self._end(over.reason, over.message)
            return True
        except httpx.HTTPError:
            pass
        return False

    async def _end(self, reason: str, message: str | None) -> None:
        """The session is over: say why (as the server's own `sessionEnded` would) and
        close our side. The server's own message, when it came, is not repeated."""
        if self.state == ClientState.ENDED:
            return
        self.end_reason, self.end_message = reason, message
        if self._server_sent_end() is None:
            data: dict[str, Any] = {"reason": reason, "detected_by": "client"}
            if message:
                data["message"] = message
            self.peer.messages.append(
                {"scope": "runtime", "data": {"type": "sessionEnded", "data": data}}
            )
            self.peer._changed.set()
        log.info("session %s ended: %s%s", self._masked(), reason,
                 f" ({message})" if message else "")
        self._set_state(ClientState.ENDED, reason=reason, message=message)
        await self.peer.close()

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
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and not supervisor.done():
            supervisor.cancel()
            try:
                await supervisor
            except asyncio.CancelledError:
                pass
        try:
            if self.state != ClientState.ENDED:
                await self._http.post(
                    join_url(self.base_url, "stop_session"), json={"session_id": self.session_id}
                )
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
    if loopback_only is None:
        loopback_only = _is_loopback(base_url)
    host_candidates = HostCandidatePolicy(loopback_only=True) if loopback_only else None
    if isinstance(reconnect, bool):
        policy = ReconnectPolicy(enabled=reconnect)
    else:
        policy = reconnect
    if on_state is not None:
        on_state(ClientState.CONNECTING, {})
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0))
    try:
        descriptor = await start_session(http, base_url, extra_args)
        ice = await fetch_ice_servers(http, base_url, descriptor["session_id"])
        peer = ClientPeer(descriptor["capabilities"], ice_servers=ice, inputs=inputs,
                          host_candidates=host_candidates,
                          input_fps=input_fps)
        client = ReactorClient(base_url, peer, descriptor, http, reconnect=policy,
                               on_state=on_state, on_queue=on_queue)
        await peer.connect(client._signal("POST", timeout), timeout=timeout)
        client._start_supervisor()
        return client
    except BaseException:
        await http.aclose()
        raise


def offer_signal(
    http: httpx.AsyncClient,
    base_url: str,
    session_id: str,
    method: str,
    timeout: float,
    *,
    on_queue: Callable[[dict[str, Any]], None] | None = None,
) -> Signal:
    """A `Signal` for `ClientPeer.connect`: deliver the offer to session `session_id`
    with `method` (POST: the session's first offer, PUT: a new connection for it) and
    poll for its answer for up to `timeout` seconds. `on_queue` gets the body of each
    202 while the answer is pending (the queue position, when queued)."""
    transport = join_url(base_url, f"sessions/{session_id}/transport/webrtc")

    async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
        reply = checked_json(
            await http.request(
                method,
                f"{transport}/sdp_params",
                json={"sdp_offer": sdp_offer, "client_info": {"sdk": "reactor-serve-python"},
                      "track_mapping": track_mapping},
            ),
            202,
        )
        connection_id = reply.get("connection_id")
        deadline = time.monotonic() + timeout
        # Fast at first (an answer is usually ready within a few tens of ms),
        # then backing off: the page polls the same way.
        delay = 0.02
        while time.monotonic() < deadline:
            poll = await http.get(f"{transport}/sdp_params")
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
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        raise SessionRefused(f"no SDP answer within {timeout:g} s")

    return signal


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


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _detail(response: httpx.Response, body: dict[str, Any]) -> str:
    detail = body.get("detail")
    return detail if isinstance(detail, str) else f"{response.status_code} {response.text}"


def _refused(exc: BaseException) -> bool:
    """Whether a connection attempt was refused: nothing listens there any more. httpx
    keeps the OSError deep in the exception chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or (
            isinstance(current, OSError) and current.errno == errno.ECONNREFUSED
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def join_url(base_url: str, path: str) -> str:
    """`path` under `base_url`, with exactly one slash between them."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def _is_loopback(base_url: str) -> bool:
    return is_loopback_host(urllib.parse.urlparse(base_url).hostname or "")
