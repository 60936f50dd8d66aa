"""`ClientPeer`: the WebRTC side of a client, independent of how the offer is delivered.

It builds the offer the way the Reactor clients do (one transceiver per capability
track, in order; the data channel "data" created before the offer), receives video as
numpy frames stamped with their arrival time, receives audio, sends frames into input
tracks, and speaks the data-channel protocol.

`connect()` may be called again on the same peer: the new RTCPeerConnection replaces
the old one (a reconnect to the same session), and what was received so far (frames,
their indices, messages, stats) carries on across it. A peer used on its own treats a
failed or closed connection as the end; `ReactorClient` sets `on_lost` instead and
reconnects (client/reconnect.py).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import itertools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable

import numpy as np
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import VideoFrame

from reactor_serve.client.input_latency import InputLatencyTracker
from reactor_serve.client.jitter import release_frames_on_marker
from reactor_serve.protocol import channel_codec
from reactor_serve.rtc.host_candidates import HostCandidatePolicy
from reactor_serve.rtc.transport_states import describe_transport

__all__ = ["ClientPeer", "ReceivedAudio", "ReceivedVideo", "Signal"]

log = logging.getLogger("reactor_serve.client")

Signal = Callable[[str, list[dict[str, Any]]], Awaitable[str]]


@dataclass(slots=True)
class ReceivedVideo:
    track: str
    image: np.ndarray  # (H, W, 3) uint8 RGB
    pts: int  # 90 kHz, from the server's emission clock
    arrived_at: float  # time.monotonic() when the decoded frame came out of aiortc
    index: int


@dataclass(slots=True)
class ReceivedAudio:
    track: str
    samples: np.ndarray  # int16 (channels, samples), 48 kHz
    pts: int
    arrived_at: float


def _to_rgb(frame: VideoFrame) -> np.ndarray:
    return frame.to_ndarray(format="rgb24")


class _FrameSource(MediaStreamTrack):
    """Sends numpy frames into an input track at a fixed rate: from an iterable while
    it lasts, and otherwise the latest frame given to `push()` (a still camera)."""

    kind = "video"

    def __init__(
        self, frames: Iterable[np.ndarray] | AsyncIterable[np.ndarray] | None, fps: float
    ) -> None:
        super().__init__()
        self._iterator: Any = (
            None
            if frames is None
            else frames.__aiter__() if hasattr(frames, "__aiter__") else iter(frames)  # type: ignore[union-attr]
        )
        self._fps = fps
        self._start: float | None = None
        self._index = 0
        self._current: np.ndarray | None = None
        self._pushed = asyncio.Event()

    def push(self, image: np.ndarray) -> None:
        self._iterator = None
        self._current = _rgb(image)
        self._pushed.set()

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        image = await self._next()
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            wait = self._start + self._index / self._fps - now
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -1.0:
                self._start, self._index = now, 0  # paused for a while: restart the clock
        frame = VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = round(self._index * 90000 / self._fps)
        frame.time_base = fractions.Fraction(1, 90000)
        self._index += 1
        return frame

    async def _next(self) -> np.ndarray:
        if self._iterator is not None:
            try:
                if hasattr(self._iterator, "__anext__"):
                    image = await self._iterator.__anext__()
                else:
                    image = next(self._iterator)
                self._current = _rgb(image)
            except (StopIteration, StopAsyncIteration):
                self._iterator = None  # keep the last frame up, as a paused camera does
        while self._current is None:
            self._pushed.clear()
            await self._pushed.wait()
            if self.readyState != "live":
                raise MediaStreamError
        return self._current

    def stop(self) -> None:
        super().stop()
        self._pushed.set()


def _rgb(image: Any) -> np.ndarray:
    array = np.ascontiguousarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(
            f"input frames must be (H, W, 3) uint8 RGB, got {array.dtype} {array.shape}"
        )
    return array


class ClientPeer:
    """One WebRTC connection to a reactor-serve session."""

    # How often `connect(still_on=...)` asks whether the session is still on while its
    # channel is not open yet.
    STILL_ON_INTERVAL_S = 1.0

    def __init__(
        self,
        capabilities: dict[str, Any],
        *,
        ice_servers: list[dict[str, Any]] | None = None,
        keep_frames: int = 256,
        inputs: dict[str, Any] | None = None,
        input_fps: float = 30.0,
        ice_transport_policy: str = "all",
        host_candidates: HostCandidatePolicy | None = None,
    ) -> None:
        self.capabilities = capabilities
        # Which host candidates each connection offers (loopback only for a server on
        # this machine); None: every interface, as aioice gathers them.
        self.host_candidates = host_candidates
        self.tracks = capabilities.get("tracks", [])
        # Both are read at each `connect()`: a later connection may use others (the
        # connectivity check tries one path per connection).
        self.ice_servers = ice_servers or []
        self.ice_transport_policy = ice_transport_policy  # "all" | "relay"
        self.video: dict[str, collections.deque[ReceivedVideo]] = {}
        self.audio: dict[str, collections.deque[ReceivedAudio]] = {}
        self.messages: list[dict[str, Any]] = []
        self.stats: dict[str, Any] = {}
        self.keep_frames = keep_frames
        self.frames_received = 0
        self._inputs = inputs or {}
        self._input_fps = input_fps
        self.sources: dict[str, _FrameSource] = {}
        self._pc: RTCPeerConnection | None = None
        self._channel: Any = None
        self._open = asyncio.Event()
        self._closed = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._ping_task: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self.on_video: Callable[[ReceivedVideo], None] | None = None
        # Input-to-frame latency of the commands sent (client/input_latency.py); each
        # one answered is reported back to the server.
        self.latency = InputLatencyTracker(
            report=lambda command_id, ms: self.send_runtime(
                "inputLatency", {"id": command_id, "latency_ms": ms}
            )
        )
        self._command_ids = itertools.count(1)
        # The current connection's receiving tracks: only their frames are matched
        # (a replaced connection's senders had other RTP timestamp origins).
        self._current_tracks: set[MediaStreamTrack] = set()
        # Called (with a short why) when the current connection fails or closes without
        # `close()`: the transport is lost but the session may live on. Unset, the
        # peer ends instead, as a one-connection client should.
        self.on_lost: Callable[[str], None] | None = None
        # Every connection made and not yet closed: a reconnect keeps the old one until
        # the new one is answered, and `close()` must close both.
        self._pcs: set[RTCPeerConnection] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        # Per output track, the index the next received frame gets: indices keep
        # growing across reconnects so `next_frame()` never mistakes an old frame.
        self._next_index: dict[str, int] = {}
        # When the current connection last received a data-channel message; -inf until
        # its channel opens. `stats_seen`: the server sends periodic `stats`, so a
        # silent channel means a lost transport (see ReactorClient).
        self.last_inbound = float("-inf")
        self.stats_seen = False
        # The first `sessionEnded`'s data, once one is among `messages`: the session is
        # over, whatever the transport does.
        self.session_end: dict[str, Any] | None = None

    @property
    def closed(self) -> bool:
        """The peer is finished for good (not merely between connections)."""
        return self._closed.is_set()

    @property
    def pc(self) -> RTCPeerConnection | None:
        """The current RTCPeerConnection (for diagnostics and tests)."""
        return self._pc

    @property
    def channel_open(self) -> bool:
        return self._channel is not None and self._channel.readyState == "open"

    async def connect(
        self, signal: Signal, timeout: float = 20.0,
        still_on: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        """Offer, have `signal(sdp_offer, track_mapping)` return the answer, and wait
        until the data channel is open. Called again, it replaces the current
        connection once the new one is answered (the old one is closed then: a server
        may end a session whose only connection closes). `still_on()` is awaited every
        `STILL_ON_INTERVAL_S` while the channel is not open yet; whatever it raises
        (the session ended meanwhile) ends the attempt. A connection that fails before
        its channel opens raises ConnectionError, one still not open after `timeout`
        TimeoutError; both name how far it got (ICE, DTLS, SCTP)."""
        if self.closed:
            raise ConnectionError("the peer is closed")
        pc = RTCPeerConnection(
            RTCConfiguration(
                iceServers=[
                    RTCIceServer(
                        urls=s["uris"],
                        username=(s.get("credentials") or {}).get("username"),
                        credential=(s.get("credentials") or {}).get("password"),
                    )
                    for s in self.ice_servers
                ],
                iceTransportPolicy=RTCIceTransportPolicy(self.ice_transport_policy),
            )
        )
        self._pcs.add(pc)
        try:
            await self._negotiate(pc, signal, timeout, still_on)
        except BaseException:
            # A failed or cancelled attempt must not leave its connection behind.
            self._pcs.discard(pc)
            if self._pc is pc:
                self._pc, self._channel = None, None
            await asyncio.shield(pc.close())
            raise

    async def _negotiate(
        self, pc: RTCPeerConnection, signal: Signal, timeout: float,
        still_on: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        mapping: list[dict[str, Any]] = []
        receivers: list[tuple[Any, dict[str, Any]]] = []
        for track in self.tracks:
            if track["direction"] == "recvonly":
                transceiver = pc.addTransceiver(track["kind"], direction="recvonly")
                receivers.append((transceiver, track))
            elif track["kind"] == "video":
                # One source per input track for the peer's life: a reconnect goes on
                # sending what the last connection sent.
                source = self.sources.get(track["name"])
                if source is None:
                    frames = self._inputs.get(track["name"])
                    if isinstance(frames, np.ndarray):
                        frames = [frames]
                    source = _FrameSource(frames, self._input_fps)
                    self.sources[track["name"]] = source
                transceiver = pc.addTransceiver(source, direction="sendonly")
            else:
                transceiver = pc.addTransceiver(track["kind"], direction="sendonly")
            mapping.append({"track": track, "transceiver": transceiver})
        channel = pc.createDataChannel("data")
        opened = asyncio.Event()
        broke = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", lambda raw: self._on_message(raw, channel))

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState not in ("failed", "closed"):
                return
            if not opened.is_set():
                # Never up: this attempt failed, and says so itself (a reconnect's
                # attempt too), rather than a connection being lost.
                broke.set()
                return
            # Only the current connection matters: a replaced one closing, or one
            # being closed by `close()`, is expected.
            if pc is not self._pc or self._closing is not None:
                return
            if self.on_lost is not None:
                self.on_lost(f"peer connection {pc.connectionState}")
            else:
                self._closed.set()
            self._changed.set()

        if self.host_candidates is not None:
            # Every transport exists now; setLocalDescription gathers.
            self.host_candidates.apply(pc)
        # The mids exist only once the local description is set.
        await pc.setLocalDescription(await pc.createOffer())
        track_mapping = [
            {
                "mid": entry["transceiver"].mid,
                "name": entry["track"]["name"],
                "kind": entry["track"]["kind"],
                "direction": entry["track"]["direction"],
            }
            for entry in mapping
        ]
        answer = await signal(pc.localDescription.sdp, track_mapping)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        previous = self._pc
        self._pc, self._channel = pc, channel
        self.last_inbound = float("-inf")
        self.latency.new_connection()
        self._current_tracks = {transceiver.receiver.track for transceiver, _ in receivers}
        loop = asyncio.get_running_loop()
        for transceiver, track in receivers:
            if track["kind"] == "video":
                release_frames_on_marker(transceiver.receiver)
            self._tasks.append(loop.create_task(self._receive(transceiver.receiver.track, track)))
        self._tasks = [t for t in self._tasks if not t.done()]
        if previous is not None:
            # Closed in the background: the new connection must not wait for it.
            closing = loop.create_task(self._retire(previous))
            self._retiring.add(closing)
            closing.add_done_callback(self._retiring.discard)
        try:
            await asyncio.wait_for(self._until_open(opened, broke, still_on), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"the data channel did not open within {timeout:g} s of the answer "
                f"({describe_transport(pc)})"
            ) from None
        if not opened.is_set():
            if self._closing is not None:
                raise ConnectionError("the peer was closed while it connected")
            raise ConnectionError(
                f"the connection failed before its data channel opened ({describe_transport(pc)})"
            )
        self.last_inbound = time.monotonic()
        self._open.set()
        if self._ping_task is None:
            self._ping_task = loop.create_task(self._ping())

    async def _until_open(
        self, opened: asyncio.Event, broke: asyncio.Event,
        still_on: Callable[[], Awaitable[Any]] | None,
    ) -> None:
        """Until the channel opens or the connection fails. A session can also end
        before its channel opens (its model failed at once): the server then closes a
        connection that never came up, and only asking it says so; waiting alone
        would last the whole timeout."""
        while not (opened.is_set() or broke.is_set()):
            waits = {asyncio.ensure_future(opened.wait()), asyncio.ensure_future(broke.wait())}
            try:
                done, _ = await asyncio.wait(waits, timeout=self.STILL_ON_INTERVAL_S,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if not done and still_on is not None:
                await still_on()

    async def _retire(self, pc: RTCPeerConnection) -> None:
        await pc.close()
        self._pcs.discard(pc)

    async def _receive(self, track: MediaStreamTrack, info: dict[str, Any]) -> None:
        name = info["name"]
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            arrived = time.monotonic()
            if info["kind"] == "video":
                image = await loop.run_in_executor(None, _to_rgb, frame)
                index = self._next_index.get(name, 0)
                self._next_index[name] = index + 1
                received = ReceivedVideo(name, image, int(frame.pts or 0), arrived, index)
                if track in self._current_tracks:
                    self.latency.frame(name, received.pts, arrived)
                self.frames_received += 1
                self.video.setdefault(name, collections.deque(maxlen=self.keep_frames)).append(received)
                if self.on_video is not None:
                    self.on_video(received)
            else:
                data = frame.to_ndarray()
                channels = len(frame.layout.channels)
                samples = data.reshape(-1, channels).T.copy() if data.shape[0] == 1 else data
                self.audio.setdefault(name, collections.deque(maxlen=self.keep_frames * 4)).append(
                    ReceivedAudio(name, samples.astype(np.int16), int(frame.pts or 0), arrived)
                )
            self._changed.set()

    def _on_message(self, raw: str | bytes, channel: Any = None) -> None:
        if channel is None or channel is self._channel:
            self.last_inbound = time.monotonic()  # any frame, even a bad one, is liveness
        try:
            message = json.loads(raw)
        except (TypeError, ValueError):
            log.warning("ignored a non-JSON data-channel frame")
            return
        self.add_message(message)

    def add_message(self, message: dict[str, Any]) -> None:
        """Take a message envelope in as if it came from the server: the data channel's,
        or one the client makes itself (its own `sessionEnded` when the server could
        not send one); whoever waits for messages sees it."""
        data = message.get("data") or {}
        if message.get("scope") == "runtime" and data.get("type") == "stats":
            self.stats = data.get("data") or {}
            self.stats_seen = True
        elif message.get("scope") == "runtime" and data.get("type") == "inputFrame":
            self.latency.answer(data.get("data"))
        elif (message.get("scope") == "runtime" and data.get("type") == "sessionEnded"
              and self.session_end is None):
            self.session_end = data.get("data") or {}
        self.messages.append(message)
        self._changed.set()

    async def _ping(self) -> None:
        while not self.closed:
            self.send_runtime("ping", {})
            await asyncio.sleep(5.0)

    def send_frame(self, track: str, image: np.ndarray) -> None:
        """Show `image` on input track `track` until the next one."""
        source = self.sources.get(track)
        if source is None:
            known = ", ".join(self.sources) or "none"
            raise KeyError(f"no input video track {track!r} (input tracks: {known})")
        source.push(image)

    def send_raw(self, text: str | bytes) -> None:
        if self._channel is None or self._channel.readyState != "open":
            raise ConnectionError("the data channel is not open")
        self._channel.send(text)

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> str:
        """Send a command with a fresh id (`c<N>`); returns the id."""
        command_id = f"c{next(self._command_ids)}"
        self.send_raw(channel_codec.command(name, data or {}, command_id))
        self.latency.sent(command_id, name)
        return command_id

    def send_runtime(self, type_: str, data: dict[str, Any]) -> None:
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(channel_codec.runtime(type_, data))

    def default_video(self) -> str:
        """The model's first output video track (what a client shows by default)."""
        for track in self.tracks:
            if track["direction"] == "recvonly" and track["kind"] == "video":
                return track["name"]
        raise LookupError("the model has no output video track")

    async def next_frame(self, track: str, timeout: float = 10.0) -> ReceivedVideo:
        """The next video frame received on output `track` from now on."""
        seen = self.video.get(track)
        start = seen[-1].index + 1 if seen else 0
        return await self.wait_for(
            lambda: next((f for f in self.video.get(track, ()) if f.index >= start), None),
            timeout,
            f"video frame on {track!r}",
        )

    async def next_message(
        self, type: str | None = None, *, scope: str | None = None, timeout: float = 10.0,
        after: int | None = None,
    ) -> dict[str, Any]:
        """The next message (an envelope's `data`: `{"type", "data"}`) of this type and
        scope received after index `after` (default: from now)."""
        start = len(self.messages) if after is None else after

        def find() -> dict[str, Any] | None:
            for envelope in self.messages[start:]:
                data = envelope.get("data") or {}
                if (type is None or data.get("type") == type) and (
                    scope is None or envelope.get("scope") == scope
                ):
                    return data
            return None

        return await self.wait_for(find, timeout, f"message {type or '(any)'}")

    async def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = predicate()
            if found:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {what} within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        """Close the connection. Safe to call again, and from several tasks: they all
        wait for the one close (aiortc's close must not be cancelled half-way)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._ping_task is not None:
            self._ping_task.cancel()
        for task in self._tasks:
            task.cancel()
        pcs = set(self._pcs)
        if self._pc is not None:
            pcs.add(self._pc)
        self._pcs.clear()
        for pc in pcs:
            await pc.close()  # closing twice (one being retired) just waits for it
        if self._retiring:
            await asyncio.wait(set(self._retiring))
        for source in self.sources.values():
            source.stop()
        self._closed.set()
        self._changed.set()  # wake anyone waiting for frames or for the end

    async def iter_video(self, track: str) -> AsyncIterator[ReceivedVideo]:
        seen = 0
        while not self.closed:
            frames = list(self.video.get(track, ()))
            fresh = [f for f in frames if f.index >= seen]
            for frame in fresh:
                seen = frame.index + 1
                yield frame
            if not fresh:
                self._changed.clear()
                await self._changed.wait()
