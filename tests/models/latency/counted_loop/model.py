# A run-loop model that stamps into every frame how many `bump` events it had handled
# when it made the frame (see ../counted_blocks), one frame at a time at 24 fps.
import asyncio
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reactor_runtime.interface import Output, ReactorModel, Video, event

_spec = importlib.util.spec_from_file_location(
    "counted_blocks_pipeline", Path(__file__).parent.parent / "counted_blocks" / "pipeline.py"
)
_blocks = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _blocks  # before running it: @dataclass looks its module up
_spec.loader.exec_module(_blocks)
stamped = _blocks.stamped


@dataclass
class Picture(Output):
    main_video: Video


class CountedLoop(ReactorModel):
    fps = 24
    buffer_size = 8

    def load(self, config):
        self.bumps = 0

    @event(name="bump", description="Count one more")
    def bump(self):
        self.bumps += 1

    async def run(self):
        while True:
            await self.connected.wait()
            deadline = time.monotonic()
            while self.connected.is_set():
                await self.emit(Picture(main_video=stamped(self.bumps, 1)[0]))
                deadline += 1 / self.fps
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
