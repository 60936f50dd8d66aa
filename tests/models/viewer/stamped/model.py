# Every frame carries its number as ten big black or white blocks across its top half
# (bit i of the counter in block i), which survive VP8 and H264 at any bitrate, so a
# test can tell which frame a client saw and compare two clients' copies of it. The
# bottom half is grey at the `tint` level. Every command the model applies is echoed
# back as an `applied` message: a command that never shows up there never reached it.
import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import (
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    event,
)

WIDTH, HEIGHT, BITS = 160, 128, 10
BLOCK = WIDTH // BITS


@dataclass
class Picture(Output):
    main_video: Video


@dataclass
class Applied(ModelMessage):
    command: str
    args: dict[str, Any]


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


class Stamped(ReactorModel):
    fps = 15

    def load(self, config):
        self.tint = 128

    @event(name="set_tint", description="Grey level of the bottom half")
    async def set_tint(self, tint: int = InputField(default=128, ge=0, le=255)):
        self.tint = tint
        await self.send(Applied(command="set_tint", args={"tint": tint}))

    async def run(self):
        counter = 0
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                await self.emit(Picture(main_video=stamp(counter, self.tint)))
                counter = (counter + 1) % (1 << BITS)
                await asyncio.sleep(0)
