"""A prompt-driven pipeline in the shape of streaming diffusion, for benchmarks/latency.py.

Each forward pass makes `block_size` frames from the current prompt and lasts
block_size / fps / `speed` seconds. At `speed` 1 the model runs exactly at real time
and the emission clock keeps about one block queued. Above 1 (a GPU faster than the
frames play) the output buffer fills and backpressure holds the model back, so up to
`buffer_size` frames made from the old prompt wait in front of every change: the
queue Scope's users see after a prompt change. A new prompt (`set_prompt`) is applied
between blocks, as a pipeline's commands are; dropping stale frames removes what was
queued before it.

Every frame carries, on its top row, the number of prompts the model had applied
when it made the frame (as 16x16 black or white cells that survive VP8), so a client
can find the first frame made after each change without trusting the runtime.
"""

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import InputField, InputState, ReactorPipeline

BITS = 16
CELL = 16


@dataclass
class PromptState(InputState):
    prompt: str = InputField(default="a quiet lake", max_length=200, description="What to show")


def read_generation(image: np.ndarray) -> int:
    """How many prompts the model had applied when it made `image`."""
    value = 0
    half = CELL // 2
    for bit in range(BITS):
        level = image[half - 2 : half + 2, bit * CELL + half - 2 : bit * CELL + half + 2].mean()
        value = (value << 1) | int(level > 127)
    return value


class PromptBlocks(ReactorPipeline):
    state: PromptState
    fps = 24
    buffer_size = 36

    def load(self, config: dict[str, Any]) -> None:
        self.block_size = int(config.get("block_size", 12))
        self.speed = float(config.get("speed", 1.0))
        if not 0.1 <= self.speed <= 100:
            raise ValueError(f"speed must be 0.1..100, got {self.speed}")
        self.width = int(config.get("width", 512))
        self.height = int(config.get("height", 384))
        y, x = np.mgrid[0 : self.height, 0 : self.width]
        self.shade = ((x + y) * 255 // (self.width + self.height)).astype(np.uint8)

    def _block(self, prompt: str, generation: int, start: int) -> np.ndarray:
        # A colour per prompt, and a box moving across it so the encoder has work.
        seed = sum(prompt.encode()) * 2654435761
        colour = np.array([(seed >> 8) & 255, (seed >> 16) & 255, (seed >> 24) & 255], np.uint8)
        frames = np.empty((self.block_size, self.height, self.width, 3), np.uint8)
        frames[:] = (self.shade[..., None].astype(np.uint16) * colour // 255).astype(np.uint8)
        for i in range(self.block_size):
            x0 = ((start + i) * 12) % max(1, self.width - 64)
            frames[i, self.height // 2 : self.height // 2 + 64, x0 : x0 + 64] = 255
            for bit in range(BITS):
                on = (generation >> (BITS - 1 - bit)) & 1
                frames[i, :CELL, bit * CELL : (bit + 1) * CELL] = 255 if on else 0
        return frames

    def inference(self):
        deadline = time.monotonic()
        generation, prompt, made = 0, self.state.prompt, 0
        while True:
            if self.state.prompt != prompt:
                generation, prompt = generation + 1, self.state.prompt
            # On a schedule from the end of the last yield: backpressure pauses the
            # model, it does not make it catch up afterwards.
            deadline = max(deadline, time.monotonic()) + self.block_size / self.fps / self.speed
            time.sleep(max(0.0, deadline - time.monotonic()))  # the forward pass
            yield self._block(prompt, generation, made)
            made += self.block_size


class PromptBlocksKeepAll(PromptBlocks):
    """The same model with stale frames kept: the baseline of the saving."""

    drop_stale_frames = False
