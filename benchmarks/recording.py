"""What a recording costs the server: CPU per presented frame of the recorder's one
H.264 (+ AAC) encode, at a few sizes and presets. Prints one JSON line.

    python benchmarks/recording.py

Frames are a moving gradient with noise (harder to compress than most model output);
each is handed to `SessionRecordings` as the session's fanout would, and the encode
runs on its own thread, as in a session. `cpu_ms_per_frame` is that thread's CPU time.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from typing import Any, Callable

import numpy as np

from reactor_serve.interface.tracks import Audio, TrackDecl, Video
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.recording.recorder import SessionRecordings

FRAMES = 150
FPS = 30.0


class _Fanout:
    def __init__(self) -> None:
        self.observers: list[Callable[[PresentedFrame], None]] = []

    def observe(self, fn: Callable[[PresentedFrame], None]) -> Callable[[], None]:
        self.observers.append(fn)
        return lambda: self.observers.remove(fn)


def _frames(width: int, height: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    out = []
    for i in range(30):
        base = (x + y + i * 8) % 256 + rng.normal(0, 6, (height, width, 1))
        out.append(np.clip(np.repeat(base, 3, axis=2), 0, 255).astype(np.uint8))
    return out


async def _measure(width: int, height: int, preset: str) -> dict[str, Any]:
    fanout = _Fanout()
    with tempfile.TemporaryDirectory() as directory:
        recordings = SessionRecordings.for_session(
            model="bench", session_id="bench", send=lambda *_: None,
            config={"recording": {"enabled": True, "destination": directory, "preset": preset,
                                  "clip_seconds": 10, "queue_frames": FRAMES + 10}},
            outputs=(TrackDecl("main_video", "video", Video), TrackDecl("main_audio", "audio", Audio)),
        )
        recordings.attach(fanout, True)
        images = _frames(width, height)
        tone = (np.sin(np.arange(1600) / 8.0) * 8000).astype(np.int16)[None, :]
        start = time.monotonic()
        for i in range(FRAMES):
            pts = round(i * 90000 / FPS)
            presented = PresentedFrame(
                video={"main_video": images[i % len(images)]}, audio={"main_audio": tone},
                pts=pts, audio_pts=i * 1600, slot=start + i / FPS, is_new=True,
                emitted_at=None, seq=i, fps=FPS,
            )
            for observer in list(fanout.observers):
                observer(presented)
        await recordings.close("benchmark")
        stats = recordings.stats()
    return {
        "size": f"{width}x{height}", "preset": preset,
        "cpu_ms_per_frame": round(stats["recording_encode_cpu_ms"] / FRAMES, 2),
        "dropped": stats["recording_dropped_frames"],
    }


async def main() -> None:
    results = []
    for width, height in ((640, 480), (1280, 720)):
        for preset in ("ultrafast", "veryfast"):
            results.append(await _measure(width, height, preset))
    print(json.dumps({"benchmark": "recording", "frames": FRAMES, "results": results}))


if __name__ == "__main__":
    asyncio.run(main())
