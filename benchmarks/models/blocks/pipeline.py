"""A model that makes 12 frames at once every 500 ms (24 fps), for benchmarks/blocks.py.

Each forward pass lasts until the block's deadline on a fixed 500 ms schedule, so the
model produces exactly 24 fps however long yielding takes. `forward: sleep` sleeps
through it (the GIL is released, as in native or CUDA code); `forward: gil` spends it
in pure-Python arithmetic, which holds the GIL except at the interpreter's switch
interval, as Python-heavy pipelines do.

Every frame of a block carries the block's yield time (time.monotonic() in
microseconds, as benchmarks/models/stamped writes it) on its top row, and on the row
below a tag: a signature, the block's number and the frame's index in the block, so
the client can tell model frames from black ones, repeats from new frames, and the
first frame of each block from the rest.
"""

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import Output, ReactorPipeline, Video

BITS = 40
CELL = 16
BLOCK_FRAMES = 12
PERIOD_S = 0.5
SIGNATURE = 0xA5  # the tag's top 8 bits: black or garbled frames fail it


@dataclass
class BlocksOutput(Output):
    main_video: Video


def _write_bits(rows: np.ndarray, value: int) -> None:
    for bit in range(BITS):
        on = (value >> (BITS - 1 - bit)) & 1
        rows[:CELL, bit * CELL : (bit + 1) * CELL] = 255 if on else 0


def _read_bits(rows: np.ndarray) -> int:
    value = 0
    half = CELL // 2
    for bit in range(BITS):
        level = rows[half - 2 : half + 2, bit * CELL + half - 2 : bit * CELL + half + 2].mean()
        value = (value << 1) | int(level > 127)
    return value


def encode_tag(block: int, index: int) -> int:
    return (SIGNATURE << 32) | ((block % (1 << 28)) << 4) | index


def read_frame(image: np.ndarray) -> tuple[int, int, int] | None:
    """(emit time in µs mod 2**40, block number, index in block), or None for a frame
    the model did not make."""
    tag = _read_bits(image[CELL : 2 * CELL])
    if tag >> 32 != SIGNATURE or (tag & 0xF) >= BLOCK_FRAMES:
        return None
    return _read_bits(image[:CELL]), (tag >> 4) & ((1 << 28) - 1), tag & 0xF


def _burn_python(until: float) -> None:
    # Pure-Python arithmetic: never releases the GIL on its own.
    total = 0
    while time.monotonic() < until:
        for i in range(2000):
            total += i * i


class BlocksModel(ReactorPipeline):
    fps = 24
    buffer_size = 2 * BLOCK_FRAMES

    def load(self, config: dict[str, Any]) -> None:
        self.width = int(config.get("width", 640))
        self.height = int(config.get("height", 480))
        self.forward_kind = config.get("forward", "sleep")
        if self.forward_kind not in ("sleep", "gil"):
            raise ValueError(f"forward must be 'sleep' or 'gil', got {self.forward_kind!r}")
        y, x = np.mgrid[0 : self.height, 0 : self.width]
        background = np.stack(
            [(x * 255 // self.width), (y * 255 // self.height), np.full_like(x, 96)], axis=-1
        ).astype(np.uint8)
        # Two blocks made once: a box moves across them, so the encoder has real work.
        self.blocks = np.repeat(background[None], 2 * BLOCK_FRAMES, axis=0)
        for n in range(2 * BLOCK_FRAMES):
            x0 = (n * 24) % max(1, self.width - 64)
            self.blocks[n, self.height // 2 : self.height // 2 + 64, x0 : x0 + 64] = 255

    def _forward(self, until: float) -> None:
        if self.forward_kind == "gil":
            _burn_python(until)
        else:
            time.sleep(max(0.0, until - time.monotonic()))

    def inference(self):
        deadline = time.monotonic()
        block = 0
        while True:
            deadline += PERIOD_S
            self._forward(deadline)
            # After a stall longer than a period (no client watching), start afresh
            # rather than making blocks back to back to catch up.
            deadline = max(deadline, time.monotonic() - PERIOD_S)
            first = (block % 2) * BLOCK_FRAMES
            frames = self.blocks[first : first + BLOCK_FRAMES].copy()
            emitted = int(time.monotonic() * 1e6) % (1 << BITS)
            for index in range(BLOCK_FRAMES):
                _write_bits(frames[index], emitted)
                _write_bits(frames[index, CELL : 2 * CELL], encode_tag(block, index))
            block += 1
            yield BlocksOutput(main_video=frames)
