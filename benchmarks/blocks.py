"""Block-producing model benchmark: prints one JSON line per case.

The workload of issue #12: a ReactorPipeline (benchmarks/models/blocks) makes 12
frames of 640x480 at once every 500 ms (24 fps). Case "sleeping": the 500 ms forward
pass sleeps, releasing the GIL as native code does. Case "gil": it holds the GIL with
pure-Python work, as Python-heavy pipelines (and GPU models launching thousands of
small kernels) do. Each case runs against `reactor run` (a separate process) and, as
a peer baseline, against a minimal plain-aiortc server written here (the same model
driven on a thread, a track that paces frames at 24 fps from a queue, VP8); the
`server` field says which. The Python client decodes every frame on 127.0.0.1 and
reads the model's stamps back (clocks on one machine):

  ttff_ms                        session start -> first decoded model frame
  connect_ms                     session start -> connected (data channel open); the
                                 model's first block takes 500 ms from about then
  fps                            new frames decoded per second (after a 2 s warm-up;
                                 a repeated frame counts once)
  fps_produced                   the model's own rate, from the blocks' stamps
  interval_ms_std / _p99         spacing of the new frames at the client
  latency_ms_first_in_block_p50  the block's yield in the model -> its first frame
                                 decoded; what a viewer waits for a block's response
  latency_ms_p50                 the same over every frame (a block's later frames
                                 also wait for their slots: about 11/2 intervals more)
  repeats                        decoded frames that repeat the previous one
  skipped                        frames the model made that never reached the client
  cpu_ms_per_frame               server process CPU per new frame (the model runs in
                                 it: the gil case's busy forward pass counts too)

Targets (issue #12): fps >= 23.8 of 24 and interval_ms_std <= 3 in both cases,
latency_ms_first_in_block_p50 <= 30 for the sleeping model (the official runtime:
29 ms), ttff_ms <= 700. `reactor run` runs the model in a process of its own, so the
"gil" case holds only the model's GIL; the plain-aiortc server runs it on a thread
beside its media loop, as a single-process server does.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import fractions
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import yaml
from _local import cpu_seconds, reactor_run_of, stop_process
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from av import VideoFrame

from reactor_serve.client import connect
from reactor_serve.client.peer import ClientPeer, ReceivedVideo
from reactor_serve.rtc.host_candidates import HostCandidatePolicy

MODEL = Path(__file__).parent / "models" / "blocks"
WARMUP_S = 2.0
CASES = {"sleeping": "sleep", "gil": "gil"}
SERVERS = ("reactor", "aiortc")


def _load_model_module() -> Any:
    # By path, under its own name: benchmarks/models/*/ all call their module pipeline.
    spec = importlib.util.spec_from_file_location("blocks_pipeline", MODEL / "pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


blocks_model = _load_model_module()


# ---- the measurement, the same for both servers ------------------------------------


class _Recorder:
    """Reads each decoded frame's stamp as it arrives."""

    def __init__(self) -> None:
        # (arrived, emitted µs, block, index) per decoded model frame.
        self.frames: list[tuple[float, int, int, int]] = []

    def on_video(self, frame: ReceivedVideo) -> None:
        read = blocks_model.read_frame(frame.image)
        if read is not None:
            self.frames.append((frame.arrived_at, *read))


def _figures(
    recorder: _Recorder, started: float, mark: float, end: float
) -> dict[str, Any]:
    frames = recorder.frames
    ttff = frames[0][0] - started
    window = [f for f in frames if mark <= f[0] < end]
    new: list[tuple[float, int, int, int]] = []
    seen: set[tuple[int, int]] = set()
    for frame in window:
        key = (frame[2], frame[3])
        if key not in seen:
            seen.add(key)
            new.append(frame)
    arrivals = np.array([f[0] for f in new])
    intervals = np.diff(arrivals) * 1000.0
    modulus = 1 << blocks_model.BITS
    latency = np.array([((int(a * 1e6) % modulus - e) % modulus) / 1000.0 for a, e, _, _ in new])
    first = np.array([lat for lat, f in zip(latency, new) if f[3] == 0])
    emits: dict[int, int] = {}
    for _, emitted, block, _ in new:
        emits.setdefault(block, emitted)
    blocks = sorted(emits)
    produced_span = ((emits[blocks[-1]] - emits[blocks[0]]) % modulus) / 1e6
    made = (new[-1][2] - new[0][2]) * blocks_model.BLOCK_FRAMES + new[-1][3] - new[0][3] + 1
    return {
        "ttff_ms": round(ttff * 1000.0, 1),
        "fps": round((len(new) - 1) / (arrivals[-1] - arrivals[0]), 2),
        "fps_produced": round(
            (blocks[-1] - blocks[0]) * blocks_model.BLOCK_FRAMES / produced_span, 2
        )
        if produced_span > 0
        else None,
        "interval_ms_std": round(float(intervals.std()), 2),
        "interval_ms_p99": round(float(np.percentile(intervals, 99)), 1),
        "interval_ms_max": round(float(intervals.max()), 1),
        "latency_ms_first_in_block_p50": round(float(np.percentile(first, 50)), 1)
        if len(first)
        else None,
        "latency_ms_p50": round(float(np.percentile(latency, 50)), 1),
        "frames": len(new),
        "repeats": len(window) - len(new),
        "skipped": made - len(new),
        "duration_s": round(float(arrivals[-1] - arrivals[0]), 2),
    }


async def _measure(
    recorder: _Recorder,
    start: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
    server_pid: int,
    seconds: float,
) -> dict[str, Any]:
    """`start()` opens the session and returns how to close it."""
    started = time.monotonic()
    close = await start()
    connected = time.monotonic()
    try:
        deadline = time.monotonic() + 15.0
        while not recorder.frames:
            if time.monotonic() > deadline:
                raise TimeoutError("no model frame within 15 s")
            await asyncio.sleep(0.01)
        await asyncio.sleep(WARMUP_S)
        mark = time.monotonic()
        cpu0, frames0 = cpu_seconds(server_pid), len(recorder.frames)
        await asyncio.sleep(seconds)
        cpu = cpu_seconds(server_pid) - cpu0
        end = time.monotonic()
        measured = len({(f[2], f[3]) for f in recorder.frames[frames0:]})
    finally:
        await close()
    figures = _figures(recorder, started, mark, end)
    figures["connect_ms"] = round((connected - started) * 1000.0, 1)
    figures["cpu_ms_per_frame"] = round(cpu * 1000.0 / max(1, measured), 2)
    return figures


# ---- against reactor run -------------------------------------------------------------


async def run_reactor(forward: str, seconds: float) -> dict[str, Any]:
    config = yaml.safe_load((MODEL / "config.yml").read_text())
    config["forward"] = forward
    recorder = _Recorder()
    async with reactor_run_of(MODEL, config) as server:

        async def start() -> Callable[[], Awaitable[None]]:
            client = await connect(server.base)
            # connect() returns once the data channel is open, and frames may have
            # come before that: read those from the peer's history first.
            for frame in client.peer.video.get("main_video", ()):
                recorder.on_video(frame)
            client.peer.on_video = recorder.on_video
            return client.close

        return await _measure(recorder, start, server.pid, seconds)


# ---- against a minimal plain-aiortc server (the peer baseline) -----------------------

# The server is this script run with --aiortc-server: it reads the client's SDP offer
# as one JSON line on stdin and writes its answer as one on stdout; closing stdin
# ends it. No HTTP, so signalling costs nothing either side would not pay.


async def run_aiortc(forward: str, seconds: float) -> dict[str, Any]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--aiortc-server", forward],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None
    loop = asyncio.get_running_loop()
    ready = await loop.run_in_executor(None, server.stdout.readline)
    if not ready.strip():
        stop_process(server)
        raise RuntimeError("the aiortc server did not start")
    recorder = _Recorder()
    capabilities = {"tracks": [{"name": "main_video", "kind": "video", "direction": "recvonly"}]}
    peer = ClientPeer(capabilities, host_candidates=HostCandidatePolicy(loopback_only=True))
    peer.on_video = recorder.on_video

    async def signal(sdp: str, _mapping: list[dict[str, Any]]) -> str:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write((json.dumps(sdp) + "\n").encode())
        server.stdin.flush()
        return json.loads(await loop.run_in_executor(None, server.stdout.readline))

    async def start() -> Callable[[], Awaitable[None]]:
        await peer.connect(signal)
        return peer.close

    try:
        return await _measure(recorder, start, server.pid, seconds)
    finally:
        server.stdin.close()  # the server's signal to close its connection and exit
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            stop_process(server)


class _QueuedVideoTrack(MediaStreamTrack):
    """Sends queued frames at 24 fps from the first one on, repeating the last frame
    when the queue is empty: the pacing a plain aiortc server writes."""

    kind = "video"

    def __init__(self, fps: float) -> None:
        super().__init__()
        self.fps = fps
        # Filled by the model's thread (deque appends and pops are atomic).
        self.queue: collections.deque[np.ndarray] = collections.deque()
        self.first = asyncio.Event()
        self._start: float | None = None
        self._sent = 0
        self._last: np.ndarray | None = None

    async def recv(self) -> VideoFrame:
        await self.first.wait()
        if self._start is None:
            self._start = time.monotonic()
        else:
            delay = self._start + self._sent / self.fps - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        if self.queue:
            self._last = self.queue.popleft()
        assert self._last is not None
        frame = VideoFrame.from_ndarray(self._last, format="rgb24")
        frame.pts = round(self._sent * 90_000 / self.fps)
        frame.time_base = fractions.Fraction(1, 90_000)
        self._sent += 1
        return frame


def _drive_model(model: Any, sink: _QueuedVideoTrack, loop: asyncio.AbstractEventLoop,
                 stop: threading.Event) -> None:
    for output in model.inference():
        if stop.is_set():
            return
        for frame in output.main_video:
            sink.queue.append(frame)
        loop.call_soon_threadsafe(sink.first.set)
        # Backpressure, as a bounded buffer gives: at most two blocks queued.
        while len(sink.queue) > 2 * blocks_model.BLOCK_FRAMES and not stop.is_set():
            time.sleep(0.005)


async def serve_aiortc(forward: str) -> None:
    loop = asyncio.get_running_loop()
    model = blocks_model.BlocksModel()
    config = yaml.safe_load((MODEL / "config.yml").read_text())
    config["forward"] = forward
    model.load(config)  # before the client comes, as reactor run loads before /health
    sink = _QueuedVideoTrack(blocks_model.BLOCK_FRAMES / blocks_model.PERIOD_S)
    stop = threading.Event()
    model_thread = threading.Thread(
        target=_drive_model, args=(model, sink, loop, stop), daemon=True
    )
    print("ready", flush=True)
    offer = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    pc = RTCPeerConnection()
    HostCandidatePolicy(loopback_only=True).apply(pc)

    @pc.on("connectionstatechange")
    def on_state() -> None:
        # The model starts for a connected viewer, as reactor's does.
        if pc.connectionState == "connected" and model_thread.ident is None:
            model_thread.start()

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    pc.addTrack(sink)
    vp8 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType == "video/VP8"]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "video":
            transceiver.setCodecPreferences(vp8)
    await pc.setLocalDescription(await pc.createAnswer())
    print(json.dumps(pc.localDescription.sdp), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the benchmark closes stdin
    stop.set()
    await pc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per case")
    parser.add_argument("--case", action="append", choices=list(CASES), help="only these cases")
    parser.add_argument("--server", action="append", choices=SERVERS, help="only these servers")
    parser.add_argument("--aiortc-server", choices=list(CASES.values()), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.aiortc_server:
        asyncio.run(serve_aiortc(args.aiortc_server))
        return
    for server in args.server or SERVERS:
        for case, forward in CASES.items():
            if args.case and case not in args.case:
                continue
            run = run_reactor if server == "reactor" else run_aiortc
            figures = asyncio.run(run(forward, args.seconds))
            print(json.dumps({"case": case, "server": server, **figures}), flush=True)


if __name__ == "__main__":
    main()
