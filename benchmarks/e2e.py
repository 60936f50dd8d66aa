"""End-to-end WebRTC benchmark: prints one JSON line per case.

Runs `reactor run` (a separate process) on a model that stamps each frame's emit time
into its pixels, connects the Python client over WebRTC on 127.0.0.1, decodes every
frame and reads the stamp back:

  ttff_ms              start_session request -> first decoded frame
  fps                  decoded frames per second (after a 1 s warm-up)
  interval_ms_std      spacing of decoded frames
  latency_ms_p50/p95   emit (model) -> decoded at the client
  cpu_ms_per_frame     server process CPU (pacing, RGB->YUV, encoding, RTP) per frame

Cases: 640x480 and 1280x720, VP8 and H264, 30 fps. Targets (issue #3): ttff <= 500 ms;
640x480 VP8 holds 30 fps with latency_ms_p95 <= 80 and interval_ms_std <= 5;
1280x720 VP8 holds at least 28 fps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
from _local import cpu_seconds, reactor_run_of

from reactor_serve.client import connect
from reactor_serve.client.peer import ReceivedVideo

MODEL = Path(__file__).parent / "models" / "stamped"
sys.path.insert(0, str(MODEL))
from pipeline import BITS, read_stamp  # noqa: E402

CASES = [
    ("640x480-vp8", 640, 480, "vp8"),
    ("640x480-h264", 640, 480, "h264"),
    ("1280x720-vp8", 1280, 720, "vp8"),
    ("1280x720-h264", 1280, 720, "h264"),
]
WARMUP_S = 1.0


async def run_case(name: str, width: int, height: int, codec: str, seconds: float) -> dict:
    config = {"width": width, "height": height, "webrtc": {"codec": codec, "bitrate_kbps": 2500}}
    frames: list[tuple[float, int]] = []
    async with reactor_run_of(MODEL, config) as server:

        def on_video(frame: ReceivedVideo) -> None:
            frames.append((frame.arrived_at, read_stamp(frame.image)))

        started = time.monotonic()
        client = await connect(server.base)
        client.peer.on_video = on_video
        await client.peer.wait_for(lambda: frames, 10, "the first frame")
        ttff = frames[0][0] - started
        await asyncio.sleep(WARMUP_S)
        cpu0, mark = cpu_seconds(server.pid), len(frames)
        await asyncio.sleep(seconds)
        cpu = cpu_seconds(server.pid) - cpu0
        window = frames[mark:]
        await client.close()
    arrivals = np.array([a for a, _ in window])
    intervals = np.diff(arrivals) * 1000
    modulus = 1 << BITS
    latency = np.array(
        [((int(a * 1e6) % modulus - s) % modulus) / 1000 for a, s in window]
    )
    return {
        "case": name,
        "ttff_ms": round(ttff * 1000, 1),
        "fps": round((len(window) - 1) / (arrivals[-1] - arrivals[0]), 2),
        "interval_ms_std": round(float(intervals.std()), 2),
        "latency_ms_p50": round(float(np.percentile(latency, 50)), 1),
        "latency_ms_p95": round(float(np.percentile(latency, 95)), 1),
        "cpu_ms_per_frame": round(cpu * 1000 / max(1, len(window)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per case")
    parser.add_argument("--case", action="append", help="run only these cases (by name)")
    args = parser.parse_args()
    for name, width, height, codec in CASES:
        if args.case and name not in args.case:
            continue
        print(json.dumps(asyncio.run(run_case(name, width, height, codec, args.seconds))), flush=True)


if __name__ == "__main__":
    main()
