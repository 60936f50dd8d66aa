"""`ClientPeer`: the WebRTC side of a client, independent of how the offer is delivered.

It builds the offer the way the Reactor clients do (one transceiver per capability
track, in order; the data channel "data" created before the offer), receives video as
numpy frames stamped with their arrival time, receives audio, sends frames into input
tracks, and speaks the data-channel protocol.
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import VideoFrame

from reactor_serve.client.jitter import release_frames_on_marker
from reactor_serve.webrtc import protocol

__all__ = ["ClientPeer", "ReceivedAudio", "ReceivedVideo"]

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

    def __init__(
        self,
        capabilities: dict[str, Any],
        *,
        ice_servers: list[dict[str, Any]] | None = None,
        keep_frames: int = 256,
        inputs: dict[str, Any] | None = None,
        input_fps: float = 30.0,
    ) -> None:
        self.capabilities = capabilities
        self.tracks = capabilities.get("tracks", [])
        self.ice_servers = ice_servers or []
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

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def connect(self, signal: Signal, timeout: float = 20.0) -> None:
        """Offer, have `signal(sdp_offer, track_mapping)` return the answer, and wait
        until the data channel is open."""
        pc = RTCPeerConnection(
            RTCConfiguration(
                iceServers=[
                    RTCIceServer(
                        urls=s["uris"],
                        username=(s.get("credentials") or {}).get("username"),
                        credential=(s.get("credentials") or {}).get("password"),
                    )
                    for s in self.ice_servers
                ]
            )
        )
        self._pc = pc
        mapping: list[dict[str, Any]] = []
        receivers: list[tuple[Any, dict[str, Any]]] = []
        for track in self.tracks:
            if track["direction"] == "recvonly":
                transceiver = pc.addTransceiver(track["kind"], direction="recvonly")
                receivers.append((transceiver, track))
            elif track["kind"] == "video":
                frames = self._inputs.get(track["name"])
                if isinstance(frames, np.ndarray):
                    frames = [frames]
                source = _FrameSource(frames, self._input_fps)
                self.sources[track["name"]] = source
                transceiver = pc.addTransceiver(source, direction="sendonly")
            else:
                transceiver = pc.addTransceiver(track["kind"], direction="sendonly")
            mapping.append({"track": track, "transceiver": transceiver})
        self._channel = pc.createDataChannel("data")
        self._channel.on("open", self._open.set)
        self._channel.on("message", self._on_message)

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._closed.set()
                self._changed.set()

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
        loop = asyncio.get_running_loop()
        for transceiver, track in receivers:
            if track["kind"] == "video":
                release_frames_on_marker(transceiver.receiver)
            self._tasks.append(loop.create_task(self._receive(transceiver.receiver.track, track)))
        await asyncio.wait_for(self._open.wait(), timeout)
        self._ping_task = loop.create_task(self._ping())

    async def _receive(self, track: MediaStreamTrack, info: dict[str, Any]) -> None:
        name = info["name"]
        loop = asyncio.get_running_loop()
        index = 0
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            arrived = time.monotonic()
            if info["kind"] == "video":
                image = await loop.run_in_executor(None, _to_rgb, frame)
                received = ReceivedVideo(name, image, int(frame.pts or 0), arrived, index)
                index += 1
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

    def _on_message(self, raw: str | bytes) -> None:
        try:
            message = json.loads(raw)
        except (TypeError, ValueError):
            log.warning("ignored a non-JSON data-channel frame")
            return
        data = message.get("data") or {}
        if message.get("scope") == "runtime" and data.get("type") == "stats":
            self.stats = data.get("data") or {}
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

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> None:
        self.send_raw(protocol.encode("application", name, data or {}))

    def send_runtime(self, type_: str, data: dict[str, Any]) -> None:
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(protocol.runtime(type_, data))

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
        if self._pc is not None:
            await self._pc.close()
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
