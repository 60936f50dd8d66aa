# The input-tracks page's full video-to-video example, verbatim, with the two names
# it leaves to the author (`load_style_model` and the pipe's `apply`) filled in.
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
    BufferClosed,
    Input,
    InputField,
    Output,
    ReactorModel,
    Video,
    connected,
    disconnected,
    event,
)


class _StylePipe:
    def apply(self, frame, style):
        if style == "none":
            return frame
        if style == "oil_paint":
            return (frame // 64 * 64).astype(np.uint8)
        return (255 - frame).astype(np.uint8)


def load_style_model(checkpoint):
    assert checkpoint == "style.ckpt"
    return _StylePipe()


@dataclass
class V2VInput(Input):
    camera: Video

@dataclass
class V2VOutput(Output):
    main_video: Video

class V2VModel(ReactorModel):
    input: V2VInput
    fps = 30

    def load(self, config):
        self.pipe = load_style_model(config["checkpoint"])

    @connected
    async def on_connect(self):
        self.input.camera.reset()
        self.style = "none"

    @disconnected
    async def on_disconnect(self):
        self.input.camera.close()
        self.output_buffer.flush()

    @event(name="set_style", description="Change the style filter")
    def set_style(self, style: str = InputField(
        default="none", choices=["none", "oil_paint", "sketch"]
    )):
        self.style = style

    async def run(self):
        while True:
            await self.connected.wait()
            try:
                while self.connected.is_set():
                    [frame] = await self.input.camera.read(1)
                    result = self.pipe.apply(frame, style=self.style)
                    await self.emit(V2VOutput(main_video=result))
            except BufferClosed:
                pass
