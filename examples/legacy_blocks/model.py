# A model on Reactor's older API (VideoModel, @model, @command, get_ctx), following the
# emit-block page: black until the client sends a prompt, then blocks of frames of a
# procedural animation that the prompt seeds (its hash picks the pattern, the colours
# and the motion), with progress messages after each block.
import hashlib
import math
import time

import numpy as np
import torch
from pydantic import Field
from reactor_runtime import VideoModel, model, command, get_ctx

PATTERNS = ("plasma", "rings", "ripples")


@model(name="legacy-blocks", config="config.yml")
class PromptAnimation(VideoModel):
    def __init__(self, config):
        self.block_size = int(config.get("block_size", 8))
        self.width = int(config.get("width", 640))
        self.height = int(config.get("height", 480))
        device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        self.renderer = Renderer(self.width, self.height, torch.device(device))
        # Per-session state, reset in start_session()'s finally.
        self.prompt = None
        self.frame_index = 0

    @command("set_prompt", description="What to animate: each prompt seeds its own animation")
    def set_prompt(
        self,
        prompt: str = Field(..., min_length=1, max_length=200, description="Prompt"),
    ):
        self.prompt = prompt

    def has_input(self):
        return self.prompt is not None

    def generate_block(self):
        """The next `block_size` frames as (N, H, W, 3) uint8 RGB numpy."""
        prompt = self.prompt  # one prompt per block: a change applies to the next block
        scene = scene_for(prompt)
        frames = self.renderer.render(scene, self.frame_index, self.block_size)
        self.frame_index += self.block_size
        return frames

    def start_session(self):
        try:
            get_ctx().emit_block(None)  # black: no content until there is a prompt
            frame_count = 0
            while not get_ctx().should_stop():
                # Wait for the user to set a prompt
                while not self.has_input():
                    if get_ctx().should_stop():
                        return
                    get_ctx().disable_monitoring()  # an intentional pause, not slowness
                    time.sleep(0.1)

                get_ctx().enable_monitoring()  # Resume tracking

                frames = self.generate_block()
                get_ctx().emit_block(frames)

                frame_count += len(frames)
                get_ctx().send({
                    "type": "progress",
                    "data": {"frames_generated": frame_count},
                })
        finally:
            # The next client starts clean: no prompt, animation time back at zero.
            self.prompt = None
            self.frame_index = 0


# --------------------------------------------------------------------------- animation


def scene_for(prompt):
    """The animation parameters a prompt stands for: the same prompt, the same scene."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    return {
        "pattern": PATTERNS[int(rng.integers(len(PATTERNS)))],
        # Spatial frequencies (per unit of screen height) and speeds (radians per s).
        "k": rng.uniform(2.0, 7.0, size=4),
        "speed": rng.uniform(0.6, 2.0, size=4) * rng.choice([-1.0, 1.0], size=4),
        "centre": rng.uniform(-0.5, 0.5, size=2),
        # A cosine palette, colour(v) = a + b * cos(2 pi (c * v + d)), per channel.
        "a": rng.uniform(0.35, 0.65, size=3),
        "b": rng.uniform(0.30, 0.50, size=3),
        "c": rng.uniform(0.5, 1.5, size=3),
        "d": rng.uniform(0.0, 1.0, size=3),
        "drift": rng.uniform(0.02, 0.1),  # palette cycling, turns per second
    }


class Renderer:
    """Renders blocks of frames of a scene on one device, all frames at once."""

    FPS = 30.0  # animation time step per frame

    def __init__(self, width, height, device):
        self.device = device
        aspect = width / height
        # Pixel centres: y in [-1, 1] downwards, x in [-aspect, aspect].
        ys = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) / height * 2 - 1
        xs = ((torch.arange(width, device=device, dtype=torch.float32) + 0.5) / width * 2 - 1) * aspect
        self.y = ys.view(1, height, 1)
        self.x = xs.view(1, 1, width)

    @torch.inference_mode()
    def render(self, scene, start, count):
        dev = self.device
        t = (torch.arange(start, start + count, device=dev, dtype=torch.float32) / self.FPS)
        t = t.view(count, 1, 1)
        k = [float(v) for v in scene["k"]]
        s = [float(v) for v in scene["speed"]]
        cx, cy = (float(v) for v in scene["centre"])
        x, y = self.x, self.y
        # The centre of the radial term wanders slowly on a Lissajous path.
        px = cx + 0.4 * torch.sin(t * 0.7 * s[0])
        py = cy + 0.3 * torch.cos(t * 0.5 * s[1])
        r = torch.sqrt((x - px) ** 2 + (y - py) ** 2)            # (N, H, W)
        pattern = scene["pattern"]
        if pattern == "plasma":
            v = (torch.sin(k[0] * x + s[0] * t) + torch.sin(k[1] * y + s[1] * t)
                 + torch.sin(k[2] * (x + y) + s[2] * t) + torch.sin(k[3] * r + s[3] * t)) / 4
        elif pattern == "rings":
            angle = torch.atan2(y - py, x - px)
            v = torch.sin(k[3] * 2 * r - s[3] * 2 * t + torch.sin(3 * angle + s[2] * t))
        else:  # ripples: two interfering wave sources
            r2 = torch.sqrt((x + px) ** 2 + (y + py) ** 2)
            v = (torch.sin(k[0] * 2 * r - s[0] * 3 * t) + torch.sin(k[1] * 2 * r2 - s[1] * 3 * t)) / 2
        # v in [-1, 1] -> palette position, slowly cycling with time.
        u = (0.5 * v + 0.5 + float(scene["drift"]) * t).unsqueeze(-1)  # (N, H, W, 1)
        a, b, c, d = (torch.tensor(scene[key], device=dev, dtype=torch.float32) for key in "abcd")
        rgb = a + b * torch.cos(2 * math.pi * (c * u + d))                # (N, H, W, 3)
        return (rgb * 255.0).clamp(0, 255).to(torch.uint8).cpu().numpy()
