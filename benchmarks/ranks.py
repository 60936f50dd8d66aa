"""One model over several ranks: prints one JSON line per rank count (R = 1, 2).

The split painter example (examples/split_painter: a network whose hidden layer is
split over the ranks, summed by an all-reduce) runs as `reactor run` and Serve run it,
in its own model process with R rank processes, watched by an in-process client
(`LocalClient`) on this process's event loop. In the same run, for each R:

  ranks                  R
  step_ms_p50            the model's time per step (one `runner.generate`: fan-out,
                         every rank's share, the all-reduce, gather), from the session's
                         stats, sampled every 100 ms
  step_ms_p50_single     the same network on one rank (R = 1), measured first, the
                         baseline
  fps                    new frames per second at the client; `target_fps` the model's
  interval_ms_std        the std of the intervals between new frames (judder)
  command_fanout_us_p50  the runner's own cost per call, no model compute: a call to R
                         ranks of a worker that returns at once, sent and gathered
  input_fanout_ms_p50    the same for a call whose input is a 1280x720 RGB frame
                         (`input_mb`), which reaches each rank through shared memory;
                         `input_fanout_ms_p50_pickled` with shared memory off (the frame
                         pickled into every rank's message), in the same run
  model_mode_step_us_p50 the runtime's own cost per step of a model whose own class
                         runs on every rank (`rank_mode: model`): one step of a stepped
                         session of a model that makes an 8x8 frame at once, from the
                         media side through the model process's conductor to every
                         rank and back with the output rank's frame;
                         `model_mode_step_us_p50_single` the same model in one process
                         (no ranks, no conductor), in the same run
  restart_s              from SIGKILL of the last rank in a live session to the first
                         frame of the next session, on fresh ranks (the model process's
                         restart, its load and every rank's included)
  device                 where the ranks ran (`--device cuda`: a GPU each, NCCL)

`--seconds` sets the measured window (default 6), `--warmup` the warm-up (default 2),
`--width`, `--height`, `--hidden` size the network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reactor_serve.runtime.isolation.model_process import ModelProcess  # noqa: E402
from reactor_serve.runtime.local_client import LocalClient, ReceivedFrame  # noqa: E402
from reactor_serve.runtime.ranks import DistributedRunner  # noqa: E402
from reactor_serve.runtime.ranks.rank_census import ranks_under  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAINTER = ROOT / "examples" / "split_painter"
FANOUT_CALLS = 2000
MODEL_MODE_STEPS = 1000
# A model whose every rank makes an 8x8 frame at once: a step's cost is the runtime's.
NULL_MODEL = """
import numpy as np
from dataclasses import dataclass
from reactor_runtime.interface import Output, ReactorPipeline, Video


@dataclass
class NullOutput(Output):
    main_video: Video


class Null(ReactorPipeline):
    def load(self, config):
        self.frame = np.zeros((1, 8, 8, 3), np.uint8)

    def inference(self):
        while True:
            yield NullOutput(main_video=self.frame)
"""
INPUT_CALLS = 300
INPUT_FRAME_SHAPE = (720, 1280, 3)


class Immediate:
    """A worker that does nothing: what a call costs is the runner's alone."""

    def load(self) -> None:
        pass

    def generate(self, step):
        # Rank 0 answers with nothing large: only the way in is measured.
        return len(step)

    def reset(self) -> None:
        pass


def fanout_us_p50(ranks: int, step: dict, calls: int, **runner_options) -> float:
    """The median time of one call of `step` to `ranks` ranks of `Immediate`."""
    with DistributedRunner(Immediate, world_size=ranks, **runner_options) as runner:
        for _ in range(min(200, calls)):
            runner.generate(step)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            runner.generate(step)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


class _Quiet:
    def message(self, envelope) -> None:
        pass

    def ended(self, reason, detail) -> None:
        pass


async def model_mode_step_us_p50(root: Path, ranks: int, env: dict[str, str]) -> float:
    """The median time of one step of a stepped session on `NULL_MODEL`, run on `ranks`
    ranks with `rank_mode: model` (1: in its model process alone)."""
    target = root / f"null-{ranks}"
    target.mkdir()
    (target / "model.py").write_text(NULL_MODEL)
    (target / "reactor.yaml").write_text("model: model:Null\nname: null\nconfig: config.yml\n")
    (target / "config.yml").write_text(yaml.safe_dump({"ranks": ranks, "rank_mode": "model"}))
    process = ModelProcess(target, env=env)
    await asyncio.to_thread(process.start)
    try:
        session = await process.open_session(_Quiet(), stepped=True)
        times = []
        for index in range(MODEL_MODE_STEPS + 100):
            started = time.perf_counter()
            outcome = await process.step(session, {}, [])
            if outcome.failure is not None:
                raise RuntimeError(f"a step failed: {outcome.message}")
            if index >= 100:
                times.append(time.perf_counter() - started)
            list(process.output_buffer.drain())
        await session.close()
        return statistics.median(times) * 1e6
    finally:
        await asyncio.to_thread(process.shutdown)


def painter_copy(root: Path, ranks: int, config: dict) -> Path:
    target = root / f"painter-{ranks}"
    shutil.copytree(PAINTER, target)
    base = yaml.safe_load((PAINTER / "config.yml").read_text())
    (target / "config.yml").write_text(yaml.safe_dump({**base, **config, "ranks": ranks}))
    return target


async def first_painted(client: LocalClient, shape: tuple[int, ...], timeout: float) -> float:
    """When the first frame the model painted arrived (before it: black, another size)."""
    deadline = time.monotonic() + timeout
    while True:
        frame = await client.next_frame(timeout=max(0.1, deadline - time.monotonic()))
        if frame.image.shape == shape:
            return time.monotonic()


async def run_case(root: Path, ranks: int, seconds: float, warmup: float, config: dict,
                   env: dict[str, str]) -> dict:
    process = ModelProcess(painter_copy(root, ranks, config), env=env)
    await asyncio.to_thread(process.start)
    shape = (config["height"], config["width"], 3)
    try:
        client = LocalClient(process)
        await client.connect()
        times: list[float] = []

        def on_frame(frame: ReceivedFrame) -> None:
            if frame.is_new:
                times.append(frame.presented_at)

        client.on_frame = on_frame
        await first_painted(client, shape, 60)
        await asyncio.sleep(warmup)
        start = time.monotonic()
        steps: list[float] = []
        while time.monotonic() - start < seconds:
            await asyncio.sleep(0.1)
            assert client.session is not None
            step = client.session.stats().get("step_ms")
            if step is not None:
                steps.append(step)
        end = time.monotonic()
        window = [t for t in times if start <= t < end]
        gaps = [(b - a) * 1000 for a, b in zip(window, window[1:])]
        if client.end_reason is not None:
            raise RuntimeError(f"the session ended during the benchmark: {client.end_detail}")
        # A rank killed in a live session: everything back, a new session's first frame.
        running = process.rank_processes()
        if len(running) != ranks:
            raise RuntimeError(f"{len(running)} rank processes run, not {ranks}")
        killed = time.monotonic()
        os.kill(running[-1].pid, signal.SIGKILL)
        await client.wait_closed()
        await client.close()
        again = LocalClient(process)
        await again.connect()
        restarted = await first_painted(again, shape, 120)
        fresh = {r.pid for r in ranks_under(process.pid or -1)}
        await again.close()
        if fresh & {r.pid for r in running}:
            raise RuntimeError("the next session ran on a rank of the failed group")
        return {
            "ranks": ranks,
            "step_ms_p50": round(statistics.median(steps), 2) if steps else None,
            "fps": round(len(window) / (end - start), 2),
            "interval_ms_std": round(statistics.pstdev(gaps), 2) if len(gaps) > 1 else None,
            "restart_s": round(restarted - killed, 2),
            "target_fps": process.spec.fps,
        }
    finally:
        await asyncio.to_thread(process.shutdown)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--hidden", type=int, default=96)
    args = parser.parse_args()
    config = {"width": args.width, "height": args.height, "hidden": args.hidden,
              "rank_log_dir": ""}
    # Where the ranks run: no GPU visible for the CPU rows, even on a GPU machine.
    env = {} if args.device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if args.device != "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the fan-out runners here, likewise
    try:
        single = single_step = None
        with tempfile.TemporaryDirectory(prefix="reactor-ranks-bench-") as root:
            for ranks in sorted(args.ranks):
                line = await run_case(Path(root), ranks, args.seconds, args.warmup, config, env)
                if ranks == 1:
                    single = line["step_ms_p50"]
                line["step_ms_p50_single"] = single
                # What the painter's steps carry.
                line["command_fanout_us_p50"] = round(
                    fanout_us_p50(ranks, {"t": 0.0, "hue": 0.0}, FANOUT_CALLS), 1)
                frame = {"frame": np.random.default_rng(0).integers(
                    0, 255, INPUT_FRAME_SHAPE, dtype=np.uint8)}
                line["input_mb"] = round(frame["frame"].nbytes / 1e6, 2)
                line["input_fanout_ms_p50"] = round(
                    fanout_us_p50(ranks, frame, INPUT_CALLS) / 1000, 3)
                line["input_fanout_ms_p50_pickled"] = round(
                    fanout_us_p50(ranks, frame, INPUT_CALLS, shared_memory_bytes=0) / 1000, 3)
                line["model_mode_step_us_p50"] = round(
                    await model_mode_step_us_p50(Path(root), ranks, env), 1)
                if ranks == 1:
                    single_step = line["model_mode_step_us_p50"]
                line["model_mode_step_us_p50_single"] = single_step
                line["device"] = args.device
                print(json.dumps({"benchmark": "ranks", **line}), flush=True)
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


if __name__ == "__main__":
    asyncio.run(main())
