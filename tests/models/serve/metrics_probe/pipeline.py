# A model that makes every session metric move, for the Grafana dashboard's test: it
# emits faster than its buffer drains with drop=True (dropped frames), its run raises
# when a session sends `fail` (a model error, a session ended by "error"), and its
# first model process exits as soon as it is loaded (a model process restart).
# `poke` changes nothing; the frame after it answers it (input-to-frame latency).
import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reactor_runtime.interface import Output, ReactorModel, Video, event


@dataclass
class Out(Output):
    main_video: Video


class MetricsProbe(ReactorModel):
    fps = 30

    def load(self, config):
        self.failing = False

    @event(name="poke", description="Does nothing: a command to measure")
    def poke(self):
        pass

    @event(name="fail", description="Make run() raise: a model error")
    def fail(self):
        self.failing = True

    async def run(self):
        # Once per replica (the replica names itself to its model process).
        marker = Path(tempfile.gettempdir()) / f"metrics-probe-{os.environ['REACTOR_REPLICA_ID']}"
        if not marker.exists():
            marker.write_text("crashed once")
            os._exit(1)
        frame = np.full((48, 64, 3), 80, np.uint8)
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                # Twice what the buffer holds: the half that does not fit is dropped.
                for _ in range(2 * self.buffer_size):
                    await self.emit(Out(main_video=frame), drop=True)
                await asyncio.sleep(1 / self.fps)
                if self.failing:
                    self.failing = False  # the session after it runs
                    raise RuntimeError("metrics probe: a model error for the dashboard")
