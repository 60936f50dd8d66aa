# The inference-generator page's patterns: async generator, Idle until a prompt,
# batch yields, messages between yields, state read with self.state.
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
    Idle,
    InputField,
    InputState,
    ModelMessage,
    Output,
    ReactorPipeline,
    Video,
)


@dataclass
class MyOutput(Output):
    main_video: Video


@dataclass
class MyState(InputState):
    prompt: str = InputField(default="", max_length=50, description="Prompt")


@dataclass
class Progress(ModelMessage):
    step: int


class Pipe:
    def forward(self, prompt):
        return np.full((3, 10, 10, 3), len(prompt) * 20, dtype=np.uint8)


class MyModel(ReactorPipeline):
    state: MyState

    def load(self, config):
        self.pipe = Pipe()
        self._step = 0

    async def inference(self):
        while not self.state.prompt:
            yield Idle
        while True:
            frames = self.pipe.forward(prompt=self.state.prompt)
            await self.send(Progress(step=self._step))
            self._step += 1
            yield MyOutput(main_video=frames)
