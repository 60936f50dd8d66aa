"""A model whose own class runs on every rank, for the conductor's tests: each frame
is filled with `level + steps` in its red channel and the rank that made it in its
green one; `boom` raises on every rank, `boom_on` on one; `wait_for_input` makes every
step wait for a frame on `frames` and add its red value; `stall_on` makes one rank
alone wait for a frame."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import (
    Input,
    InputField,
    InputState,
    Output,
    ReactorPipeline,
    Video,
    connected,
    event,
    get_ctx,
    get_rank,
)


@dataclass
class EchoInput(Input):
    frames: Video


@dataclass
class EchoOutput(Output):
    main_video: Video


@dataclass
class EchoState(InputState):
    level: int = InputField(default=0, ge=0, le=100)


class RankedEcho(ReactorPipeline):
    state: EchoState
    input: EchoInput
    buffer_size = 4

    def load(self, config: dict[str, Any]) -> None:
        self.me = get_rank()
        self.wait_for_input = bool(config.get("wait_for_input", False))
        self.bumps = 0
        self.stall = False

    @connected
    def hello(self) -> None:
        ctx = get_ctx()
        ctx.send({"type": "hello", "rank": ctx.rank, "world_size": ctx.world_size,
                  "device": ctx.device})

    @event(name="bump")
    def bump(self, by: int = InputField(default=1, ge=1, le=10)) -> None:
        self.bumps += by

    @event(name="boom")
    def boom(self) -> None:
        raise ValueError(f"boom on rank {self.me.rank}")

    @event(name="boom_on")
    def boom_on(self, rank: int = InputField(ge=0, le=15)) -> None:
        if rank == self.me.rank:
            raise ValueError(f"boom on rank {rank} alone")

    @event(name="stall_on")
    def stall_on(self, rank: int = InputField(ge=0, le=15)) -> None:
        # That rank alone waits for input at its next step: the ranks part ways.
        self.stall = rank == self.me.rank

    async def inference(self):
        steps = 0
        while True:
            extra = 0
            if self.stall:
                self.stall = False
                await self.input.frames.read()
            if self.wait_for_input:
                [frame] = await self.input.frames.read()
                extra = int(frame[0, 0, 0])
            steps += 1
            frame = np.zeros((8, 8, 3), np.uint8)
            frame[..., 0] = min(255, self.state.level + self.bumps + extra)
            frame[..., 1] = self.me.rank
            frame[..., 2] = min(255, steps)
            yield EchoOutput(main_video=frame[None])
