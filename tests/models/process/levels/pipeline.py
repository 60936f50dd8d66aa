# A pipeline that makes frames far faster than it is shown (2 frames every 20 ms,
# shown at 10 fps), so its output buffer stays full of frames made from the current
# state; every pixel of a frame is the state's `level`. Levels drops those queued
# frames when a command changes the level (the pipeline default); LevelsKeepAll
# shows them all first.
import time
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import InputField, InputState, ReactorPipeline


@dataclass
class LevelState(InputState):
    level: int = InputField(default=40, ge=0, le=255, description="Pixel value")


class Levels(ReactorPipeline):
    state: LevelState
    fps = 10
    buffer_size = 24

    def inference(self):
        while True:
            time.sleep(0.02)
            yield np.full((2, 24, 32, 3), self.state.level, np.uint8)


class LevelsKeepAll(Levels):
    drop_stale_frames = False
