# The run-loop page's ReactorModel patterns: blocking forward pass inside run(),
# compute_time, batches, dynamic fps and messages.
import time
from dataclasses import dataclass

import torch

from reactor_runtime.interface import (
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    event,
)


@dataclass
class MyOutput(Output):
    main_video: Video


@dataclass
class Progress(ModelMessage):
    step: int
    total: int


class Pipe:
    def forward(self, prompt, step=0):
        x = torch.full((10, 24, 32, 3), float(len(prompt) * 10 + step % 5), dtype=torch.float32)
        time.sleep(0.01)
        return x.clamp(0, 255).to(torch.uint8)


class MyModel(ReactorModel):
    fps = 30
    buffer_size = 20  # model emits ~10 frames at a time

    def load(self, config):
        self.pipe = Pipe()
        self.prompt = config.get("prompt", "cat")
        self._step = 0

    @event(name="set_prompt", description="Set the prompt")
    def set_prompt(self, prompt: str = InputField(default="cat", min_length=1, max_length=20)):
        self.prompt = prompt

    @event(name="slow_down", description="Halve the frame rate")
    def slow_down(self):
        self.output_buffer.set_fps(15)

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                prompt = self.prompt
                step = self._step
                t0 = time.perf_counter()
                frames = self.pipe.forward(prompt=prompt, step=step)
                compute_time = time.perf_counter() - t0
                await self.emit(MyOutput(main_video=frames), compute_time=compute_time)
                await self.send(Progress(step=self._step, total=100))
                self._step += 1
