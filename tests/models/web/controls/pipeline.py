# A model with one command of every kind the web page builds a control for, each
# echoed back as a model message, so the browser tests can see what the page sent;
# and two output tracks: its grey level, and the negative of it.
import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import (
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    connected,
    event,
)


@dataclass
class Picture(Output):
    main_video: Video
    negative: Video


@dataclass
class Echo(ModelMessage):
    command: str
    args: dict[str, Any]


class ControlsModel(ReactorModel):
    fps = 15

    def load(self, config):
        self.level = 0.5

    @connected
    async def on_connect(self):
        self.level = 0.5

    async def echo(self, command, **args):
        await self.send(Echo(command=command, args=args))

    @event(name="set_level", description="Grey level of the picture")
    async def set_level(self, level: float = InputField(default=0.5, ge=0.0, le=1.0)):
        self.level = level
        await self.echo("set_level", level=level)

    @event(name="set_seed", description="A seed: any whole number from 0 up")
    async def set_seed(self, seed: int = InputField(default=0, ge=0)):
        await self.echo("set_seed", seed=seed)

    @event(name="set_label", description="A short label")
    async def set_label(self, label: str = InputField(default="hello", max_length=20)):
        await self.echo("set_label", label=label)

    @event(name="set_mode", description="One of two modes")
    async def set_mode(self, mode: str = InputField(default="calm", choices=["calm", "wild"])):
        await self.echo("set_mode", mode=mode)

    @event(name="set_invert", description="Invert the picture")
    async def set_invert(self, invert: bool = InputField(default=False)):
        await self.echo("set_invert", invert=invert)

    @event(name="reset", description="Back to the start")
    async def reset(self):
        await self.echo("reset")

    @event(name="place", description="Put a marker somewhere")
    async def place(self, x: float = InputField(ge=0.0, le=1.0, description="From the left"),
                    y: float = InputField(default=0.5, description="From the top")):
        await self.echo("place", x=x, y=y)

    @event(name="key_down", description="A key was pressed")
    async def key_down(self, key: str):
        await self.echo("key_down", key=key)

    @event(name="key_up", description="A key was released")
    async def key_up(self, key: str):
        await self.echo("key_up", key=key)

    async def run(self):
        while True:
            await self.connected.wait()
            while self.connected.is_set():
                value = int(round(self.level * 255))
                await self.emit(Picture(
                    main_video=np.full((120, 160, 3), value, np.uint8),
                    negative=np.full((120, 160, 3), 255 - value, np.uint8),
                ))
                await asyncio.sleep(0)
