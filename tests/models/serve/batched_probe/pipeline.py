# A batched pipeline for the Grafana dashboard's test: two seats stepped together,
# each frame the session's `level`, so the batch size and step time panels have data.
import time
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import InputField, InputState, ReactorPipeline, batched


@dataclass
class Level(InputState):
    level: int = InputField(default=60, ge=0, le=255, description="Pixel value")


class BatchedProbe(ReactorPipeline):
    state: Level
    fps = 20

    def load(self, config):
        self.shape = (48, 64, 3)

    @batched(max_size=4)
    def step(self, steps):
        time.sleep(0.005)  # a forward pass's worth of time, shared by the batch
        return [np.full(self.shape, s.model.state.level, np.uint8) for s in steps]
