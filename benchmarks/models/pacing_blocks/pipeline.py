"""A model that yields 12-frame blocks of 1280x720 every 500 ms, for benchmarks/pacing.py.

A ReactorModel (fps 30, buffer_size 24) whose run loop, while a client is connected,
does a forward pass, emits a 12-frame block and sleeps until the block's slot on a
fixed 500 ms schedule, so the model produces 24 fps. Config:

  forward       none: no forward pass; torch: torch CPU matrix products, which release
                the GIL while they compute; gil: pure-Python arithmetic, which holds
                the GIL except at the interpreter's switch interval, as Python-heavy
                pipelines do
  forward_s     the forward pass's length: it works in small units (a 512x512 matrix
                product; 10,000 Python multiply-adds) until that long has passed

After each emit it sends the client `{"block", "emit_cpu_s", "emit_s", "forward_s"}`:
`emit_cpu_s` is the CPU its thread spent inside `await self.emit(...)`
(`time.thread_time()`, so the time the emit waits for the media side is not counted),
the model side's share of the runtime's per-frame cost (in a model process: writing
the frames into shared memory); `emit_s` the same emit's wall time (backpressure
included) and `forward_s` the forward pass's, to tell a slow model from a slow runtime.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from reactor_runtime.interface import Output, ReactorModel, Video

BLOCK_FRAMES = 12
PERIOD_S = 0.5
HEIGHT, WIDTH = 720, 1280
FORWARD_KINDS = ("none", "torch", "gil")
_GIL_CHUNK = 10_000


@dataclass
class PacingBlocksOutput(Output):
    main_video: Video


def _gil_unit() -> Callable[[], None]:
    def work() -> None:
        # Pure-Python arithmetic: never releases the GIL on its own.
        total = 0
        for i in range(_GIL_CHUNK):
            total += i * i

    return work


def _torch_unit() -> Callable[[], None]:
    import torch  # only the torch case pays for the import

    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    return lambda: torch.mm(a, b)


def _unit(kind: str) -> Callable[[], None]:
    return _torch_unit() if kind == "torch" else _gil_unit()


class PacingBlocksModel(ReactorModel):
    fps = 30
    buffer_size = 2 * BLOCK_FRAMES

    def load(self, config: dict[str, Any]) -> None:
        kind = config.get("forward", "none")
        if kind not in FORWARD_KINDS:
            raise ValueError(f"forward must be one of {FORWARD_KINDS}, got {kind!r}")
        self.forward: Callable[[], None] | None = None
        if kind != "none":
            unit, length_s = _unit(kind), float(config.get("forward_s", 0.3))

            def forward() -> None:
                # Work units until the pass has lasted length_s: a fixed amount of work
                # would stretch whenever this shared machine is busy, the model would
                # produce irregularly, and the pacer would rightly follow it; the
                # benchmark measures the pacer, so the model keeps its schedule.
                end = time.perf_counter() + length_s
                while time.perf_counter() < end:
                    unit()

            self.forward = forward
        # Two blocks made once: emitting never overwrites a frame the media side holds.
        self.blocks = [
            np.full((BLOCK_FRAMES, HEIGHT, WIDTH, 3), (i * 9 + j) % 256, np.uint8)
            for i, j in ((0, 0), (1, 3))
        ]

    async def run(self) -> None:
        block = 0
        while True:
            await self.connected.wait()
            deadline = time.monotonic()
            while self.connected.is_set():
                started = time.perf_counter()
                if self.forward is not None:
                    self.forward()  # blocks the model's loop, as real forward passes do
                emitting = time.perf_counter()
                cpu = time.thread_time()
                await self.emit(PacingBlocksOutput(main_video=self.blocks[block % 2]))
                emit_cpu_s = time.thread_time() - cpu
                await self.send(
                    {
                        "block": block,
                        "emit_cpu_s": emit_cpu_s,
                        "emit_s": time.perf_counter() - emitting,
                        "forward_s": emitting - started,
                    }
                )
                block += 1
                deadline += PERIOD_S
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
