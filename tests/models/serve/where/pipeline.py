"""Tells its client where it runs: the file its code was loaded from, the working dir,
the Ray node and the GPUs Ray gave its replica. The cluster tests read it to prove that the
model's code travelled with the application and that it landed on a GPU worker node."""

import asyncio
import os
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import Output, ReactorModel, Video, connected


@dataclass
class Frames(Output):
    main_video: Video


class Where(ReactorModel):
    def load(self, config):
        self.frame = np.full((96, 128, 3), 90, np.uint8)

    async def run(self):
        while True:
            await self.emit(Frames(main_video=self.frame))
            await asyncio.sleep(1 / 30)

    @connected
    async def on_connect(self):
        await self.send({
            "type": "where",
            "file": os.path.abspath(__file__),
            "cwd": os.getcwd(),
            # The replica tells its model process which Ray node it is on.
            "node_id": os.environ["REACTOR_RAY_NODE_ID"],
            "gpu_ids": [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g],
        })
