# The emit-block page's patterns on the older API (legacy-api.md).
import time

import numpy as np
from pydantic import Field

from reactor_runtime import VideoModel, command, get_ctx, model


@model(name="legacy-blocks", config="config.yml")
class BlockModel(VideoModel):
    def __init__(self, config):
        self.block = config.get("block", 4)
        self.size = config["size"]
        self.prompt = None
        self.frame_index = 0

    @command("set_prompt", description="What to draw")
    def set_prompt(self, prompt: str = Field(..., min_length=1, description="Prompt")):
        self.prompt = prompt

    @command("set_speed", description="Frames per step")
    def set_speed(self, speed: int = Field(1, ge=1, le=10)):
        self.speed = speed

    def has_input(self):
        return self.prompt is not None

    def generate_block(self):
        h, w = self.size
        frames = np.empty((self.block, h, w, 3), dtype=np.uint8)
        for i in range(self.block):
            self.frame_index += 1
            frames[i] = (self.frame_index * 10) % 250 + 1
        time.sleep(0.02)
        return frames

    def start_session(self):
        try:
            get_ctx().emit_block(None)
            frame_count = 0
            while not get_ctx().should_stop():
                while not self.has_input():
                    if get_ctx().should_stop():
                        return
                    get_ctx().disable_monitoring()
                    time.sleep(0.01)
                get_ctx().enable_monitoring()
                frames = self.generate_block()
                get_ctx().emit_block(frames)
                frame_count += len(frames)
                get_ctx().send({"type": "progress", "data": {"frames_generated": frame_count}})
                if self.prompt == "stop":
                    return
        finally:
            self.prompt = None
            self.frame_index = 0
