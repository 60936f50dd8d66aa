"""A model that stamps each frame's emit time into its pixels, for end-to-end latency.

The time is time.monotonic() in microseconds (mod 2**40), written as 40 black or
white 16x16 blocks along the top edge, which survive VP8/H264 at any usable bitrate.
CLOCK_MONOTONIC is system-wide, so a client on the same machine can read latency
directly off each decoded frame.
"""

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import Output, ReactorModel, Video

BITS = 40
BLOCK = 16


@dataclass
class StampedOutput(Output):
    main_video: Video


def stamp(image: np.ndarray, micros: int) -> None:
    for bit in range(BITS):
        on = (micros >> (BITS - 1 - bit)) & 1
        image[:BLOCK, bit * BLOCK : (bit + 1) * BLOCK] = 255 if on else 0


def read_stamp(image: np.ndarray) -> int:
    """The inverse of `stamp`, from the centre of each block."""
    value = 0
    half = BLOCK // 2
    for bit in range(BITS):
        level = image[half - 2 : half + 2, bit * BLOCK + half - 2 : bit * BLOCK + half + 2].mean()
        value = (value << 1) | int(level > 127)
    return value


class StampedModel(ReactorModel):
    fps = 30
    buffer_size = 4

    def load(self, config):
        self.width = int(config.get("width", 640))
        self.height = int(config.get("height", 480))
        y, x = np.mgrid[0 : self.height, 0 : self.width]
        self.background = np.stack(
            [(x * 255 // self.width), (y * 255 // self.height), np.full_like(x, 96)], axis=-1
        ).astype(np.uint8)

    async def run(self):
        while True:
            await self.connected.wait()
            deadline = time.monotonic()
            index = 0
            while self.connected.is_set():
                frame = self.background.copy()
                # Something moving, so the encoder has real work every frame.
                x = (index * 8) % max(1, self.width - 64)
                frame[self.height // 2 : self.height // 2 + 64, x : x + 64] = 255
                stamp(frame, int(time.monotonic() * 1e6) % (1 << BITS))
                await self.emit(StampedOutput(main_video=frame))
                index += 1
                deadline += 1 / self.fps
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
