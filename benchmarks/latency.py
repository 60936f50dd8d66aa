"""Input-to-frame latency and the cost of viewers: prints one JSON line.

Input-to-frame latency is what a player waits from pressing a key (or a user from
changing a prompt) until the first frame made after the model applied it is on their
screen. Each case runs `reactor run` on a copy of a model, connects the Python client
on 127.0.0.1 and sends commands at a steady pace; the runtime marks the frame that
answers each command and the client reports when it arrived (see docs/latency.md). Cases:

  world_b{1,4,12}           the world example (examples/world, a run-loop model) at
                            block sizes 1, 4 and 12: `key_down` / `key_up` of "w",
                            alternating every 0.6 s
  prompt                    benchmarks/models/prompt_blocks, a pipeline shaped like
                            streaming diffusion (blocks of 12 frames) on a GPU 1.5
                            times faster than real time, so its output buffer is
                            full and backpressure paces it: `set_prompt` with a new
                            prompt every 1.5 s

each with stale-frame dropping off (`_keep`) and on (`_drop`): with it on, a command
that changes the model's state drops the frames queued before it (docs/latency.md,
"Stale frames"). Per case: `p50` / `p95` in ms over the commands answered after a warm-up,
and `n`, how many. The prompt model also stamps, in its pixels, how many prompts it
had applied, so its latency is measured a second way without trusting the runtime's
marks (`prompt_*_stamp_p50`): the two must agree within a frame (41.7 ms).

`viewers`: what watching viewers cost the server process (benchmarks/viewers.py runs
an owner with 0, 1, 2 and 4 viewers of a 640x480 VP8 stream, in this run):
`viewers_{1,2,4}_cpu_ms_per_frame_per_viewer` is the CPU per presented frame they add
over the owner alone, divided by their number (the first viewer starts the shared
encode, so this falls as viewers are added); `viewers_extra_viewer_encodes` is what
one more viewer costs beyond the first, in shared encodes (the issue asks < 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _local import reactor_run_of  # noqa: E402

from reactor_serve.client import ReactorClient, connect  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORLD = ROOT / "examples" / "world"
PROMPT = Path(__file__).parent / "models" / "prompt_blocks"
FRAME_MS = 1000.0 / 24
WARMUP_S = 3.0


def _world_dropping(copy: Path) -> None:
    """The world example with stale-frame dropping on (a run-loop model's default is off)."""
    source = copy / "pipeline.py"
    source.write_text(
        source.read_text()
        + "\n\nclass WorldDropping(WorldModel):\n    drop_stale_frames = True\n"
    )
    manifest = copy / "reactor.yaml"
    manifest.write_text(manifest.read_text().replace("pipeline:WorldModel", "pipeline:WorldDropping"))


def _prompt_keeping(copy: Path) -> None:
    """The prompt pipeline with stale frames kept (a pipeline's default is to drop them)."""
    manifest = copy / "reactor.yaml"
    manifest.write_text(manifest.read_text().replace("pipeline:PromptBlocks", "pipeline:PromptBlocksKeepAll"))


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    array = np.array(values)
    return {
        "p50": round(float(np.percentile(array, 50)), 1),
        "p95": round(float(np.percentile(array, 95)), 1),
        "n": len(values),
    }


async def _drive(
    base: str,
    seconds: float,
    commands: Callable[[int], tuple[str, dict[str, Any]]],
    every_s: float,
    on_frame: Callable[[Any], None] | None = None,
) -> tuple[ReactorClient, list[dict[str, Any]], list[tuple[str, float]]]:
    """Connect, warm up, send `commands(i)` every `every_s` for `seconds`, wait for the
    last answers; returns the client's latency records and what was sent when."""
    client = await connect(base)
    sent: list[tuple[str, float]] = []
    reader: asyncio.Task[None] | None = None
    if on_frame is not None:

        async def read() -> None:
            async for frame in client.frames():
                on_frame(frame)

        reader = asyncio.create_task(read())
    try:
        await client.next_frame(timeout=30.0)
        await asyncio.sleep(WARMUP_S)
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            name, data = commands(i)
            sent.append((client.send_command(name, data), time.monotonic()))
            i += 1
            await asyncio.sleep(every_s)
        await asyncio.sleep(2.0)  # the last answers
        records = client.input_latency()
    finally:
        if reader is not None:
            reader.cancel()
        await client.close()
    return client, records, sent


async def world_case(block_size: int, drop: bool, seconds: float) -> dict[str, Any]:
    config = {"block_size": block_size, "width": 480, "height": 360, "device": "cpu"}

    def keys(i: int) -> tuple[str, dict[str, Any]]:
        return ("key_down" if i % 2 == 0 else "key_up", {"key": "w"})

    async with reactor_run_of(WORLD, config, _world_dropping if drop else None) as server:
        _, records, _ = await _drive(server.base, seconds, keys, 0.6)
    return _percentiles([r.latency_ms for r in records if r.latency_ms is not None])


async def prompt_case(drop: bool, seconds: float) -> dict[str, Any]:
    from models.prompt_blocks.pipeline import (
        read_generation,  # the benchmark's own model
    )

    config = {"block_size": 12, "speed": 1.5, "width": 512, "height": 384, "webrtc": {"codec": "vp8"}}
    # The independent measure: when the first frame stamped with each new generation
    # arrived (generation g answers the g-th prompt).
    first_seen: dict[int, float] = {}

    def on_frame(frame: Any) -> None:
        generation = read_generation(frame.image)
        first_seen.setdefault(generation, frame.arrived_at)

    def prompts(i: int) -> tuple[str, dict[str, Any]]:
        return ("set_prompt", {"prompt": f"scene number {i}"})

    async with reactor_run_of(PROMPT, config, None if drop else _prompt_keeping) as server:
        _, records, sent = await _drive(server.base, seconds, prompts, 1.5, on_frame)
    figures = _percentiles([r.latency_ms for r in records if r.latency_ms is not None])
    stamped = [
        (first_seen[g] - at) * 1000.0
        for g, (_, at) in enumerate(sent, start=1)
        if g in first_seen
    ]
    figures["stamp"] = _percentiles(stamped)
    return figures


async def viewers_case(seconds: float) -> dict[str, Any]:
    from viewers import measure  # benchmarks/viewers.py

    return await measure(seconds, 640, 480, "vp8")


async def main(seconds: float, only: set[str] | None) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def wanted(case: str) -> bool:
        return only is None or any(case.startswith(o) for o in only)

    for block_size in (1, 4, 12):
        for drop in (False, True):
            case = f"world_b{block_size}_{'drop' if drop else 'keep'}"
            if wanted(case):
                figures = await world_case(block_size, drop, seconds)
                result[f"{case}_p50"], result[f"{case}_p95"] = figures["p50"], figures["p95"]
                result[f"{case}_n"] = figures["n"]
    for drop in (False, True):
        case = f"prompt_{'drop' if drop else 'keep'}"
        if wanted(case):
            figures = await prompt_case(drop, seconds)
            result[f"{case}_p50"], result[f"{case}_p95"] = figures["p50"], figures["p95"]
            result[f"{case}_n"] = figures["n"]
            result[f"{case}_stamp_p50"] = figures["stamp"]["p50"]
            result[f"{case}_stamp_p95"] = figures["stamp"]["p95"]
    if wanted("viewers"):
        figures = await viewers_case(min(seconds, 8.0))
        cpu = figures["cpu_ms_per_frame"]
        for viewers in (1, 2, 4):
            added = cpu[str(viewers)] - cpu["0"]
            result[f"viewers_{viewers}_cpu_ms_per_frame_per_viewer"] = round(added / viewers, 2)
        result["viewers_owner_alone_cpu_ms_per_frame"] = cpu["0"]
        result["viewers_shared_encode_ms"] = figures["shared_encode_ms"]
        result["viewers_extra_viewer_encodes"] = figures["extra_viewer_encodes"]
    result["frame_ms"] = round(FRAME_MS, 1)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="commands sent per case, in seconds")
    parser.add_argument("--only", nargs="*", help="case name prefixes, e.g. world_b4 prompt viewers")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.seconds, set(args.only) if args.only else None))))
