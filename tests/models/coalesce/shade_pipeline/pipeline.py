# A pipeline that tells its client every brightness it starts a block with, so a test
# can see which of a flood of set_brightness values the model ended on.
import time
from dataclasses import dataclass

import numpy as np
from reactor_runtime.interface import InputField, InputState, ReactorPipeline, get_ctx


@dataclass
class Shade(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness")


class ShadePipeline(ReactorPipeline):
    state: Shade
    fps = 10
    buffer_size = 4

    def inference(self):
        told = None
        while True:
            if self.state.brightness != told:
                told = self.state.brightness
                get_ctx().send({"type": "shade", "brightness": told})
            time.sleep(0.1)
            yield np.full((1, 32, 32, 3), int(told * 100), np.uint8)
