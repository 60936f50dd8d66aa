"""Sessions per replica: prints one JSON line per case.

One replica (the model in its own process, `ModelProcess`, as Serve and `reactor run`
run it) serves N = 1, 2, 4 and 8 sessions at once on its one loaded model
(`sessions_per_replica`), each session steered to its own level, and each watched by an
in-process client (`LocalClient`) on this process's event loop, the media loop. The
model (benchmarks/models/density_net) is a decoder whose batch-1 forward pass takes
tens of milliseconds on this CPU: unbatched, each session runs its own forward pass
per frame; batched, one `@batched` step runs every ready session's frame in one pass.

Each line, after a warm-up, over the measured window:

  sessions, batched
  fps_per_session_min     new frames per second of the slowest session
  interval_ms_std_max     the std of the intervals between a session's new frames,
                          the worst session's (what a viewer sees as judder)
  frames_per_s_total      new frames per second, all sessions together
  step_ms_p50             the model's time per step (a batch's, when batched), as the
                          sessions' stats report it, sampled every 100 ms
  cpu_ms_per_frame        this process's and the model process's CPU per new frame
  target_fps              the model's frame rate, each session's target
  step_ms_batch1          one forward pass at batch 1, timed alone here first
  device                  where the model ran (`--device cuda` for a GPU; `--width` and
                          `--depth` size the decoder)

`--seconds` sets the window (default 8), `--warmup` the warm-up (default 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _local import cpu_seconds  # noqa: E402

from reactor_serve.runtime.isolation.model_process import ModelProcess  # noqa: E402
from reactor_serve.runtime.loading.manifest import load_manifest  # noqa: E402
from reactor_serve.runtime.local_client import LocalClient, ReceivedFrame  # noqa: E402

MODEL = Path(__file__).resolve().parent / "models" / "density_net"
SESSIONS = (1, 2, 4, 8)


def model_copy(root: Path, batched: bool, seats: int, config: dict) -> Path:
    """The model directory with this case's class, seats and `config`."""
    target = root / f"{'batched' if batched else 'unbatched'}-{seats}"
    shutil.copytree(MODEL, target)
    cls = "BatchedDensityNet" if batched else "DensityNet"
    (target / "reactor.yaml").write_text(yaml.safe_dump({
        "model": f"pipeline:{cls}", "name": "density-net",
        "config": {"sessions_per_replica": seats, **config},
    }))
    return target


def batch1_step_ms(config: dict) -> float:
    """One forward pass at batch 1, timed here (the model's own code, no runtime)."""
    manifest = load_manifest(MODEL)
    model = manifest.load_class()()
    model.load(config)
    model.forward([1]).cpu()
    started = time.perf_counter()
    for _ in range(10):
        model.forward([1]).cpu()  # .cpu(): waits for a GPU's work, as an emit does
    return (time.perf_counter() - started) / 10 * 1000


class Watch:
    """One session's new frames and when they were presented."""

    def __init__(self, client: LocalClient, level: int) -> None:
        self.client = client
        self.level = level
        self.times: list[float] = []
        self.foreign = 0
        client.on_frame = self._on_frame

    def _on_frame(self, frame: ReceivedFrame) -> None:
        if not frame.is_new:
            return
        self.times.append(frame.presented_at)
        corner = int(frame.image[2, 2, 0])
        if corner != self.level:
            self.foreign += 1

    def window(self, start: float, end: float) -> list[float]:
        return [t for t in self.times if start <= t < end]


async def run_case(root: Path, sessions: int, batched: bool, seconds: float,
                   warmup: float, config: dict) -> dict:
    process = ModelProcess(model_copy(root, batched, sessions, config))
    await asyncio.to_thread(process.start)
    watches: list[Watch] = []
    try:
        assert len(process.seats) == sessions
        for index, seat in enumerate(process.seats):
            client = LocalClient(seat)
            await client.connect()
            level = 10 + 20 * index
            client.send_command("set_level", {"level": level})
            watches.append(Watch(client, level))
        await asyncio.sleep(warmup)
        for watch in watches:
            watch.foreign = 0  # frames made before its level applied
        start = time.monotonic()
        cpu_start = cpu_seconds(os.getpid()) + cpu_seconds(process.pid)
        steps: list[float] = []
        while time.monotonic() - start < seconds:
            await asyncio.sleep(0.1)
            for watch in watches:
                assert watch.client.session is not None
                step = watch.client.session.stats().get("step_ms")
                if step is not None:
                    steps.append(step)
        end = time.monotonic()
        cpu = cpu_seconds(os.getpid()) + cpu_seconds(process.pid) - cpu_start
        ended = [w.client.end_detail for w in watches if w.client.end_reason is not None]
        if ended:
            raise RuntimeError(f"a session ended during the benchmark: {ended[0]}")
        if any(w.foreign for w in watches):
            raise RuntimeError("a session was shown another session's frame")
        fps, stds, total = [], [], 0
        for watch in watches:
            times = watch.window(start, end)
            total += len(times)
            fps.append(len(times) / (end - start))
            gaps = [(b - a) * 1000 for a, b in zip(times, times[1:])]
            stds.append(statistics.pstdev(gaps) if len(gaps) > 1 else float("nan"))
        return {
            "sessions": sessions,
            "batched": batched,
            "fps_per_session_min": round(min(fps), 2),
            "interval_ms_std_max": round(max(stds), 2),
            "frames_per_s_total": round(total / (end - start), 2),
            "step_ms_p50": round(statistics.median(steps), 1) if steps else None,
            "cpu_ms_per_frame": round(cpu * 1000 / total, 2) if total else None,
            "target_fps": process.spec.fps,
        }
    finally:
        for watch in watches:
            await watch.client.close()
        await asyncio.to_thread(process.shutdown)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, nargs="*", default=list(SESSIONS))
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--width", type=int, default=2048, help="the decoder's width")
    parser.add_argument("--depth", type=int, default=6, help="the decoder's hidden layers")
    args = parser.parse_args()
    config = {"threads": 1, "device": args.device, "width": args.width, "depth": args.depth}
    batch1 = round(batch1_step_ms(config), 1)
    with tempfile.TemporaryDirectory(prefix="reactor-density-") as tmp:
        for batched in (False, True):
            for sessions in args.sessions:
                line = await run_case(Path(tmp), sessions, batched, args.seconds, args.warmup,
                                      config)
                line.update(step_ms_batch1=batch1, device=args.device)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
