# Every frame carries its number as ten big black or white blocks across its top half
# (bit i of the counter in block i), which survive H.264 at any quality, so a test can
# read back which frame a recording holds. Each frame comes with 1/fps of a 440 Hz
# tone. `set_tint` (0..255) greys the bottom half; `poke` is an event with no effect.
import asyncio
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
    Audio,
    InputField,
    Output,
    ReactorModel,
    Video,
    event,
)

WIDTH, HEIGHT, BITS = 160, 128, 10
BLOCK = WIDTH // BITS
FPS = 15
SAMPLES = 48000 // FPS


@dataclass
class Picture(Output):
    main_video: Video
    main_audio: Audio


def stamp(counter: int, tint: int) -> np.ndarray:
    frame = np.empty((HEIGHT, WIDTH, 3), np.uint8)
    frame[HEIGHT // 2:] = tint
    for bit in range(BITS):
        frame[:HEIGHT // 2, bit * BLOCK:(bit + 1) * BLOCK] = 255 if counter >> bit & 1 else 0
    return frame


def read_stamp(image: np.ndarray) -> int:
    """The counter stamped into `image`, from the middle of each block."""
    value = 0
    for bit in range(BITS):
        block = image[8:HEIGHT // 2 - 8, bit * BLOCK + 3:(bit + 1) * BLOCK - 3]
        if block.mean() > 128:
            value |= 1 << bit
    return value


def tone(counter: int) -> np.ndarray:
    t = (np.arange(SAMPLES) + counter * SAMPLES) / 48000.0
    return (np.sin(2 * np.pi * 440.0 * t) * 8000).astype(np.int16)[None, :]


class StampedAV(ReactorModel):
    fps = FPS

    def load(self, config):
        self.tint = 128

    @event(name="set_tint", description="Grey level of the bottom half")
    async def set_tint(self, tint: int = InputField(default=128, ge=0, le=255)):
        self.tint = tint

    @event(name="poke", description="Does nothing")
    async def poke(self):
        pass

    async def run(self):
        counter = 0
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                await self.emit(Picture(main_video=stamp(counter, self.tint), main_audio=tone(counter)))
                counter = (counter + 1) % (1 << BITS)
                await asyncio.sleep(0)
