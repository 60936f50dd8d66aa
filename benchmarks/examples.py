"""Example models benchmark: prints one JSON line.

Every model in examples/ at its default resolution, on this machine's CPU (`--device`
picks another torch device for the torch examples), loaded from its directory:

  <example>_fps               frames per second of generation
  world_delay_ms_block_<n>    the world model's input-to-frame delay at block size n
                              (1, 4, 12): key_down "w" -> the first frame the client is
                              shown whose picture differs from the still one (median)

How generation speed is measured:

- gradient, legacy_blocks, world: run through the in-process session driver
  (`ModelHost` + `LocalClient`; legacy_blocks is sent a prompt) and read the session's
  measured production rate, `stats()["production_fps"]`, after a warm-up. It counts
  the model's own time per frame (its reported `compute_time`, or else the time since
  its previous emit returned), never time spent waiting for buffer space.
- webcam_style and audio_tone: timed directly, calling the model's own generation code
  on the loaded model in a loop. Through a session their rate would measure their
  input instead: webcam_style makes one frame per camera frame it is sent (and waiting
  for the camera counts as its time), and audio_tone paces itself to real time with a
  sleep. webcam_style is timed per style on a 640x480 camera frame;
  `webcam_style_fps` is its slowest style (its default, "none", is only a copy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

from reactor_serve.runtime import LocalClient, ModelHost, load_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WARMUP_S = 1.0
MEASURE_S = 3.0
DIRECT_S = 2.0
BLOCK_SIZES = (1, 4, 12)
DELAY_REPEATS = 15


def start_host(name: str, **overrides: object) -> ModelHost:
    """The example's model with its config.yml, plus `overrides`, loaded."""
    manifest = load_manifest(EXAMPLES / name)
    config = {**manifest.config, **overrides}
    host = ModelHost(manifest.load_class(), config, name=manifest.name)
    host.start(timeout=60)
    return host


async def session_fps(name: str, commands: dict[str, dict] | None = None, **overrides: object) -> float:
    """Production rate measured by the session engine after a warm-up."""
    host = start_host(name, **overrides)
    try:
        async with LocalClient(host, keep_frames=8) as client:
            for command, args in (commands or {}).items():
                client.send_command(command, args)
            await asyncio.sleep(WARMUP_S + MEASURE_S)
            rate = client.session.stats()["production_fps"]
    finally:
        host.shutdown()
    if rate is None:
        raise RuntimeError(f"{name}: no production rate measured")
    return rate


def timed_fps(generate, frames_per_call: int, seconds: float = DIRECT_S) -> float:
    """Frames per second of `generate()` called in a loop (after two warm-up calls)."""
    generate()
    generate()
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        generate()
        calls += 1
    return calls * frames_per_call / elapsed


def webcam_style_fps(device: str) -> dict[str, float]:
    host = start_host("webcam_style", device=device)
    try:
        pipe = host.model.pipe
        rng = np.random.default_rng(0)
        camera = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        styles = {
            f"webcam_style_{style}_fps": timed_fps(
                lambda style=style: pipe.apply(camera, style=style, strength=1.0), 1
            )
            for style in ("oil_paint", "sketch", "thermal")
        }
        return {"webcam_style_fps": min(styles.values()), **styles}
    finally:
        host.shutdown()


def audio_tone_fps() -> float:
    host = start_host("audio_tone")
    try:
        model = host.model
        n = model.frames_per_emit

        def generate():  # what one iteration of ToneModel.run() computes before emit
            audio = model.oscillator.render(440.0, 0.5, n * model.samples_per_frame)
            model.scope.draw(audio[0], 440.0, n)

        return timed_fps(generate, n)
    finally:
        host.shutdown()


async def world_delays(block_size: int, device: str) -> tuple[list[float], float]:
    """Input-to-frame delays (ms) at `block_size`, and the production rate meanwhile."""
    host = start_host("world", block_size=block_size, device=device)
    fps = host.spec.fps
    rng = random.Random(block_size)
    seen = {
        "last": None,         # the picture of the latest new frame
        "unchanged": 0,       # how many new frames in a row showed that same picture
        "reference": None,    # the still picture when the key went down
        "changed_at": None,   # when the first frame unlike it was shown
    }

    def on_frame(frame) -> None:
        if not frame.is_new:
            return
        image = frame.image
        same = seen["last"] is not None and np.array_equal(seen["last"], image)
        seen["unchanged"] = seen["unchanged"] + 1 if same else 0
        seen["last"] = image
        reference = seen["reference"]
        if (reference is not None and seen["changed_at"] is None
                and not np.array_equal(reference, image)):
            seen["changed_at"] = frame.presented_at

    delays = []
    try:
        async with LocalClient(host, keep_frames=8) as client:
            client.on_frame = on_frame
            await asyncio.sleep(WARMUP_S)
            # Press at moments spread evenly over a block's time, in random order.
            phases = [(i + 0.5) / DELAY_REPEATS for i in range(DELAY_REPEATS)]
            rng.shuffle(phases)
            for phase in phases:
                # Still for longer than a block and the frames queued ahead of it.
                while seen["unchanged"] < 2 * block_size + 2:
                    await asyncio.sleep(1 / fps)
                await asyncio.sleep(phase * block_size / fps)
                seen["reference"], seen["changed_at"] = seen["last"], None
                pressed = time.monotonic()
                client.send_command("key_down", {"key": "w"})
                while seen["changed_at"] is None:
                    if time.monotonic() - pressed > 10:
                        raise RuntimeError(f"world at block size {block_size}: no change in 10 s")
                    await asyncio.sleep(0.002)
                delays.append((seen["changed_at"] - pressed) * 1000.0)
                seen["reference"] = None
                await asyncio.sleep(0.2)  # hold the key a moment
                client.send_command("key_up", {"key": "w"})
            rate = client.session.stats()["production_fps"]
    finally:
        host.shutdown()
    return delays, rate


async def measure(device: str) -> dict[str, float]:
    result: dict[str, float] = {}
    result["gradient_fps"] = await session_fps("gradient")
    result.update(webcam_style_fps(device))
    result["audio_tone_fps"] = audio_tone_fps()
    result["legacy_blocks_fps"] = await session_fps(
        "legacy_blocks", {"set_prompt": {"prompt": "a forest at dawn"}}, device=device
    )
    result["world_fps"] = await session_fps("world", device=device)
    for block_size in BLOCK_SIZES:
        delays, rate = await world_delays(block_size, device)
        result[f"world_fps_block_{block_size}"] = rate
        result[f"world_delay_ms_block_{block_size}"] = statistics.median(delays)
    return {key: round(value, 1) for key, value in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="torch device for the torch examples")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.device))))


if __name__ == "__main__":
    main()
