"""Viewer encode cost: prints one JSON line.

Runs `reactor run` (a separate process) on the stamped model, connects an owner and
N viewers with the Python client, and measures the server process's CPU time per
presented frame (pacing, RGB->YUV, encoding, RTP; the model runs in a process of its
own and is not counted) for N = 0, 1, 2 and 4 viewers. The owner has its own adaptive
encoder; all viewers share one encode per codec (sessions/viewers/shared_encoder.py), so the
first viewer adds one encode and each further viewer only packetizing and sending:

  cpu_ms_per_frame[N]        server CPU per frame with N viewers
  shared_encode_ms           the shared encoder's own thread CPU per encode
  extra_viewer_ms            (cpu[4] - cpu[1]) / 3: what one more viewer costs
  extra_viewer_encodes       extra_viewer_ms / shared_encode_ms: issue 13 asks < 0.5

On a shared 2-core machine the per-run noise is about 1 ms per frame, larger than a
viewer's packetizing, so extra_viewer_ms may come out slightly negative; the
deterministic check (one shared encode per frame whatever N) is tests/e2e/sessions/test_viewers.py.

`viewer_encode_cpu(viewers, seconds)` is the one measurement, for benchmarks/latency.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from _local import cpu_seconds, reactor_run_of

from reactor_serve.client import connect, watch

MODEL = Path(__file__).parent / "models" / "stamped"
WARMUP_S = 1.5


async def viewer_encode_cpu(
    viewers: int,
    seconds: float,
    *,
    width: int = 640,
    height: int = 480,
    codec: str = "vp8",
) -> dict[str, Any]:
    """Server CPU per presented frame with an owner and `viewers` viewers watching."""
    config = {"width": width, "height": height,
              "webrtc": {"codec": codec, "bitrate_kbps": 1500, "max_viewers": max(4, viewers)}}
    async with reactor_run_of(MODEL, config) as server:
        owner = await connect(server.base)
        watching = []
        try:
            await owner.next_frame(timeout=20)
            if viewers:
                token = (await owner.viewer_link())["viewer_token"]
                for _ in range(viewers):
                    watching.append(await watch(server.base, token))
                for viewer in watching:
                    await viewer.next_frame(timeout=20)
            await asyncio.sleep(WARMUP_S)
            before, cpu0 = await _stats(owner), cpu_seconds(server.pid)
            started = time.monotonic()
            await asyncio.sleep(seconds)
            cpu = cpu_seconds(server.pid) - cpu0
            elapsed = time.monotonic() - started
            after = await _stats(owner)
        finally:
            for viewer in watching:
                await viewer.close()
            await owner.close()
    presented = max(1, int(after.get("presented", 0)) - int(before.get("presented", 0)))
    shared = after.get("viewer_encoding") or {}
    shared_before = before.get("viewer_encoding") or {}
    encodes = int(shared.get("encodes", 0)) - int(shared_before.get("encodes", 0))
    encode_cpu = float(shared.get("cpu_ms", 0.0)) - float(shared_before.get("cpu_ms", 0.0))
    return {
        "viewers": viewers,
        "codec": codec,
        "size": f"{width}x{height}",
        "fps": round(presented / elapsed, 1),
        "cpu_ms_per_frame": round(cpu * 1000 / presented, 2),
        "shared_encodes_per_frame": round(encodes / presented, 2),
        "shared_encode_ms": round(encode_cpu / encodes, 2) if encodes else None,
    }


async def _stats(owner: Any) -> dict[str, Any]:
    # The session's stats come once a second; take a fresh one.
    mark = len(owner.peer.messages)
    reply = await owner.next_message("stats", scope="runtime", after=mark, timeout=5)
    return dict(reply.get("data") or {})


async def measure(seconds: float, width: int, height: int, codec: str) -> dict[str, Any]:
    runs = {}
    for count in (0, 1, 2, 4):
        runs[count] = await viewer_encode_cpu(count, seconds, width=width, height=height, codec=codec)
    cpu = {count: run["cpu_ms_per_frame"] for count, run in runs.items()}
    encode_ms = runs[4]["shared_encode_ms"] or runs[1]["shared_encode_ms"]
    extra = (cpu[4] - cpu[1]) / 3
    return {
        "benchmark": "viewer_encode_cpu",
        "codec": codec,
        "size": f"{width}x{height}",
        "cpu_ms_per_frame": {str(k): v for k, v in cpu.items()},
        "shared_encodes_per_frame": {str(k): runs[k]["shared_encodes_per_frame"] for k in runs},
        "fps": {str(k): runs[k]["fps"] for k in runs},
        "shared_encode_ms": encode_ms,
        "extra_viewer_ms": round(extra, 2),
        "extra_viewer_encodes": round(extra / encode_ms, 2) if encode_ms else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per run")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--codec", choices=["vp8", "h264"], default="vp8")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.seconds, args.width, args.height, args.codec))),
          flush=True)


if __name__ == "__main__":
    main()
