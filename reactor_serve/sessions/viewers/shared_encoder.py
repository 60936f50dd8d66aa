"""One video encode per codec for every viewer of a session, instead of one per viewer.

aiortc gives every sender its own encoder, so N viewers would cost N encodes of the
same frame. A track's `recv()` may instead return an `av.Packet` that is already
encoded: the sender then only packetizes it (`Vp8Encoder.pack` / `H264Encoder.pack`),
and never makes an encoder of its own. So:

- `SharedEncoder`: one PyAV encoder (libvpx for VP8, libx264 constrained baseline
  for H264, Annex B output as aiortc's H264 packer expects) for one output video track
  in one codec. Fed with every presented frame (`present`, on the media loop), it
  encodes on a thread of its own, keeping only the newest frame while it is busy, and
  hands each packet to its subscribers on the loop.
- `SharedVideoTrack`: one viewer's sender track. Its `recv()` returns the shared
  packets (pts in the 90 kHz clock), in order, starting at a keyframe.

What a packet path gives up, and how it is made up for:

- A viewer's PLI (picture loss) cannot reach a shared encoder (aiortc drops
  `force_keyframe` for packets). So a keyframe is forced when a viewer joins (its
  first packet must be one) and every `keyframe_interval_s` (2 s by default): a viewer
  that lost packets recovers within that time.
- The receivers' REMB cannot steer one encoder for several viewers, so the bitrate is
  fixed at the model's `bitrate_kbps` (constant bitrate). The owner keeps its own
  adaptive encoder (REMB and PLI).
- A viewer that falls behind (its sender stopped reading) is not allowed to hold
  packets: past `SharedVideoTrack.MAX_QUEUED` its queue is dropped and it waits for
  the next keyframe, asking for one at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fractions
import logging
import threading
import time
from typing import Any

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from reactor_serve.runtime.pacing.emission_clock import VIDEO_CLOCK_RATE

__all__ = ["CODECS", "SharedEncoder", "SharedVideoTrack"]

log = logging.getLogger(__name__)

CODECS = ("vp8", "h264")
_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_RATE)


class SharedVideoTrack(MediaStreamTrack):
    """One viewer's video sender: the shared encoder's packets, from a keyframe on."""

    kind = "video"
    # About a second of video at 30 fps: a sender further behind than that is stuck.
    MAX_QUEUED = 30

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.encoder: SharedEncoder | None = None
        # Each packet with the bytes the model attached to its frame (None: none).
        self._queue: asyncio.Queue[tuple[av.Packet, bytes | None] | None] = asyncio.Queue()
        self._waiting_for_key = True
        self.packets = 0
        self.resyncs = 0

    def deliver(self, packet: av.Packet, keyframe: bool, metadata: bytes | None = None) -> None:
        """Called on the media loop with each shared packet (and its frame's metadata)."""
        if self._waiting_for_key and not keyframe:
            return
        if self._queue.qsize() >= self.MAX_QUEUED:
            # Dropping one packet of a stream breaks every packet up to the next
            # keyframe: drop them all and start again at one.
            while not self._queue.empty():
                self._queue.get_nowait()
            self._waiting_for_key = True
            self.resyncs += 1
            if self.encoder is not None:
                self.encoder.request_keyframe()
            if not keyframe:
                return
        self._waiting_for_key = False
        self._queue.put_nowait((packet, metadata))

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        queued = await self._queue.get()
        if queued is None or self.readyState != "live":
            raise MediaStreamError
        self.packets += 1
        return self.finish(*queued)

    def finish(self, packet: av.Packet, metadata: bytes | None) -> av.Packet:
        """The packet as it goes to the sender: viewers' go as encoded."""
        return packet

    def stop(self) -> None:
        super().stop()
        if self.encoder is not None:
            self.encoder.unsubscribe(self)
        self._queue.put_nowait(None)  # wake a pending recv() so it can raise


class SharedEncoder:
    """Encodes one output video track in one codec for every subscribed viewer.

    Create and call it on the media loop; the encoding runs on its own thread. It
    encodes only while it has subscribers (the session feeds it only then)."""

    def __init__(
        self,
        codec: str,
        bitrate_kbps: int,
        *,
        keyframe_interval_s: float = 2.0,
        fps_hint: float = 30.0,
    ) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
        self.codec = codec
        self.bitrate = int(bitrate_kbps) * 1000
        self.keyframe_interval_s = keyframe_interval_s
        self.fps_hint = max(1.0, float(fps_hint))
        self._subscribers: list[SharedVideoTrack] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._busy = False
        self._pending: tuple[np.ndarray, int, bytes | None] | None = None
        self._want_keyframe = True
        self._last_keyframe = float("-inf")
        self._context: Any = None
        self._closed = False
        self._lock = threading.Lock()
        # What it did, for stats and tests: frames offered, frames encoded, frames
        # skipped because the encoder was still busy, thread CPU time spent encoding.
        self.presented = 0
        self.encode_calls = 0
        self.superseded = 0
        self.keyframes = 0
        self.cpu_s = 0.0

    # ---- subscribers (media loop) ---------------------------------------------------

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self, track: SharedVideoTrack) -> None:
        """Send this encoder's packets to `track`, from the next keyframe (forced now)."""
        self._loop = asyncio.get_running_loop()
        track.encoder = self
        if track not in self._subscribers:
            self._subscribers.append(track)
        self.request_keyframe()

    def unsubscribe(self, track: SharedVideoTrack) -> None:
        if track in self._subscribers:
            self._subscribers.remove(track)

    def request_keyframe(self) -> None:
        self._want_keyframe = True

    def set_bitrate(self, bps: int) -> None:
        """Encode at `bps` from the next frame on. A change of over a tenth starts the
        encoder afresh, at a keyframe (as aiortc's encoders do): libvpx and x264, as
        PyAV opens them, take a bitrate only when opened."""
        self.bitrate = int(bps)

    # ---- frames (media loop) --------------------------------------------------------

    def present(self, image: np.ndarray, pts: int, metadata: bytes | None = None) -> None:
        """Encode `image` ((H, W, 3) uint8 RGB) stamped `pts` (90 kHz) for the
        subscribers, who get `metadata` with its packets. Never blocks: while the
        thread is busy only the newest frame waits, and older ones are skipped."""
        if self._closed or not self._subscribers:
            return
        self._loop = asyncio.get_running_loop()
        self.presented += 1
        if self._busy:
            if self._pending is not None:
                self.superseded += 1
            self._pending = (image, pts, metadata)
            return
        self._start(image, pts, metadata)

    def _start(self, image: np.ndarray, pts: int, metadata: bytes | None) -> None:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"reactor-viewers-{self.codec}"
            )
        now = time.monotonic()
        keyframe = self._want_keyframe or now - self._last_keyframe >= self.keyframe_interval_s
        if keyframe:
            self._want_keyframe = False
            self._last_keyframe = now
        self._busy = True
        future = self._executor.submit(self._encode, image, pts, keyframe)
        future.add_done_callback(lambda done: self._encoded(done, metadata))

    def _encoded(
        self, future: concurrent.futures.Future[list[tuple[av.Packet, bool]]], metadata: bytes | None
    ) -> None:
        # On the encoder thread: hand the result to the loop.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._distribute, future, metadata)
            except RuntimeError:
                pass  # the loop closed meanwhile

    def _distribute(
        self, future: concurrent.futures.Future[list[tuple[av.Packet, bool]]], metadata: bytes | None
    ) -> None:
        self._busy = False
        if self._closed:
            return
        try:
            packets = future.result()
        except Exception:
            log.exception("the shared %s encoder failed; starting it again", self.codec)
            self._context = None
            self._want_keyframe = True
            packets = []
        for packet, keyframe in packets:
            if keyframe:
                self.keyframes += 1
            for track in list(self._subscribers):
                track.deliver(packet, keyframe, metadata)
        pending, self._pending = self._pending, None
        if pending is not None and self._subscribers:
            self._start(*pending)

    # ---- encoding (its own thread) ----------------------------------------------------

    def _encode(self, image: np.ndarray, pts: int, keyframe: bool) -> list[tuple[av.Packet, bool]]:
        started = time.thread_time()
        with self._lock:
            try:
                return self._encode_locked(image, pts, keyframe)
            finally:
                self.encode_calls += 1
                self.cpu_s += time.thread_time() - started

    def _encode_locked(self, image: np.ndarray, pts: int, keyframe: bool) -> list[tuple[av.Packet, bool]]:
        height, width = image.shape[:2]
        # Both codecs want even dimensions in 4:2:0.
        width, height = width - width % 2, height - height % 2
        context = self._context
        if context is not None and (
            context.width != width or context.height != height
            or abs(context.bit_rate - self.bitrate) > 0.1 * context.bit_rate
        ):
            context = None
        if context is None:
            context = self._context = self._make_context(width, height)
            keyframe = True
        frame = av.VideoFrame.from_ndarray(
            np.ascontiguousarray(image[:height, :width]), format="rgb24"
        ).reformat(format="yuv420p")
        frame.pts = pts
        frame.time_base = _TIME_BASE
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        out: list[tuple[av.Packet, bool]] = []
        for encoded in context.encode(frame):
            data = bytes(encoded)
            if not data:
                continue
            packet = av.Packet(data)
            packet.pts = pts
            packet.time_base = _TIME_BASE
            out.append((packet, bool(encoded.is_keyframe)))
        return out

    def _make_context(self, width: int, height: int) -> Any:
        if self.codec == "vp8":
            context = av.CodecContext.create("libvpx", "w")
            context.options = {
                # Realtime, constant bitrate, no lookahead: the same as aiortc's own
                # VP8 encoder, so viewers see what the owner would at that bitrate.
                "deadline": "realtime",
                "cpu-used": "-6",
                "lag-in-frames": "0",
                "minrate": str(self.bitrate),
                "maxrate": str(self.bitrate),
                "bufsize": str(self.bitrate),
                "undershoot-pct": "100",
                "overshoot-pct": "15",
                "static-thresh": "1",
                "partitions": "0",
            }
            context.qmin, context.qmax = 2, 56
        else:
            context = av.CodecContext.create("libx264", "w")
            # Constrained baseline, level 3.1: what the offer's 42e01f asks for. Without
            # a global header, x264 writes Annex B with SPS/PPS before every keyframe,
            # which is what aiortc's H264 packer splits on.
            context.options = {"tune": "zerolatency", "preset": "veryfast", "level": "31"}
            context.profile = "Baseline"
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.bit_rate = self.bitrate
        context.time_base = _TIME_BASE
        context.framerate = fractions.Fraction(round(self.fps_hint), 1)
        # Keyframes come when forced (viewer joins, every keyframe_interval_s).
        context.gop_size = 100_000
        # One thread up to 720p (fast enough at 30 fps, and its CPU time is what
        # `cpu_ms` measures: time.thread_time sees the calling thread only).
        context.thread_count = 1 if width * height <= 1280 * 720 else 2
        return context

    # ---- end ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop encoding and end every subscriber's track."""
        self._closed = True
        self._pending = None
        for track in list(self._subscribers):
            track.stop()
        self._subscribers.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "viewers": len(self._subscribers),
            "presented": self.presented,
            "encodes": self.encode_calls,
            "superseded": self.superseded,
            "keyframes": self.keyframes,
            "cpu_ms": round(self.cpu_s * 1000.0, 1),
        }
