# A run-loop model that tells its client every brightness it makes a frame with (see
# ../shade_pipeline).
import asyncio
from dataclasses import dataclass

import numpy as np
from reactor_runtime.interface import (
    InputField,
    InputState,
    Output,
    ReactorModel,
    Video,
    get_ctx,
)


@dataclass
class Shade(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness")


@dataclass
class Picture(Output):
    main_video: Video


class ShadeLoop(ReactorModel):
    state: Shade
    fps = 20

    async def run(self):
        while True:
            await self.connected.wait()
            told = None
            while self.connected.is_set():
                if self.state.brightness != told:
                    told = self.state.brightness
                    get_ctx().send({"type": "shade", "brightness": told})
                image = np.full((32, 32, 3), int(told * 100), np.uint8)
                await self.emit(Picture(main_video=image))
                await asyncio.sleep(1 / self.fps)
