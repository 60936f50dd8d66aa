# A model with an input audio track: it shows how loud the microphone is as the
# brightness of its picture, and reports the level and the chunks it receives.
import time
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
    Audio,
    BufferClosed,
    Input,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    connected,
    disconnected,
)


@dataclass
class Ears(Input):
    microphone: Audio


@dataclass
class Meter(Output):
    main_video: Video


@dataclass
class Level(ModelMessage):
    rms: float
    chunk_shape: list[int]  # (channels, samples) of the latest chunk


class LevelMeter(ReactorModel):
    input: Ears
    fps = 15

    @connected
    async def on_connect(self):
        self.input.microphone.reset()

    @disconnected
    async def on_disconnect(self):
        self.input.microphone.close()

    async def run(self):
        while True:
            await self.connected.wait()
            since = time.monotonic()
            try:
                while self.connected.is_set():
                    [chunk] = await self.input.microphone.read(1)
                    rms = float(np.sqrt(np.mean(chunk.astype(np.float64) ** 2)))
                    level = int(min(255, rms / 32768 * 255 * 4))
                    await self.emit(Meter(main_video=np.full((60, 80, 3), level, np.uint8)),
                                    drop=True)
                    if time.monotonic() - since >= 0.5:
                        await self.send(Level(rms=round(rms, 1), chunk_shape=list(chunk.shape)))
                        since = time.monotonic()
            except BufferClosed:
                pass
