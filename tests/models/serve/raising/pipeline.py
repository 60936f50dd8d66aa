# A model whose run() raises during its first session only, to show the replica
# ends that session cleanly and serves the next one.
import asyncio
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import Output, ReactorModel, Video


@dataclass
class Out(Output):
    main_video: Video


class Raising(ReactorModel):
    def load(self, config):
        self.sessions = 0

    async def run(self):
        while True:
            await self.connected.wait()
            self.sessions += 1
            frame = np.full((48, 64, 3), 80, np.uint8)
            for _ in range(10):
                await self.emit(Out(main_video=frame))
                await asyncio.sleep(0.03)
            if self.sessions == 1:
                raise RuntimeError("simulated CUDA error in the forward pass")
            while self.connected.is_set():
                await self.emit(Out(main_video=frame))
                await asyncio.sleep(0.03)
