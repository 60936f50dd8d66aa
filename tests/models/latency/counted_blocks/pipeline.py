# A pipeline that stamps into every frame how many `bump` commands it had applied when
# it made the frame (12 big black or white cells across the top, which survive VP8),
# so a test can find the first frame made after each command without the runtime's
# help. Blocks of 4 frames at 24 fps, made a little faster than they play, so the
# output buffer holds frames from before each command (dropped: the pipeline default).
import time
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import InputField, InputState, ReactorPipeline

WIDTH, HEIGHT, BITS = 192, 96, 12
CELL = WIDTH // BITS


@dataclass
class Counter(InputState):
    bumps: int = InputField(default=0, ge=0, le=4095, description="Commands applied")


def stamped(count: int, frames: int) -> np.ndarray:
    block = np.full((frames, HEIGHT, WIDTH, 3), 90, np.uint8)
    for bit in range(BITS):
        block[:, : HEIGHT // 2, bit * CELL : (bit + 1) * CELL] = 255 if count >> bit & 1 else 0
    return block


def read_count(image: np.ndarray) -> int:
    value = 0
    for bit in range(BITS):
        if image[8 : HEIGHT // 2 - 8, bit * CELL + 3 : (bit + 1) * CELL - 3].mean() > 128:
            value |= 1 << bit
    return value


class CountedBlocks(ReactorPipeline):
    state: Counter
    fps = 24
    buffer_size = 16

    def inference(self):
        while True:
            time.sleep(4 / 24 / 1.3)
            yield stamped(self.state.bumps, 4)
