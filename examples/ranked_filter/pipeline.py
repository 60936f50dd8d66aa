"""A camera filter whose own class runs on every rank (`rank_mode: model`).

Each rank loads the same `RankedFilter`, reads its place from `get_rank()`, and keeps a
slice of a per-pixel network's hidden layer (tensor parallel). Every step, every rank
gets the same camera frame, state and events, computes its share of every pixel, and an
all-reduce sums the shares; the output rank's frame is the one the client sees. The
weights are drawn whole from one seed and sliced, so the picture is the same for any
number of ranks.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reactor_runtime.interface import (
    Input,
    InputField,
    InputState,
    Output,
    ReactorPipeline,
    Video,
    event,
    get_rank,
)

FEATURES = 8  # per pixel: its colour, its position, and two waves of the time


@dataclass
class FilterInput(Input):
    camera: Video


@dataclass
class FilterOutput(Output):
    main_video: Video


@dataclass
class FilterState(InputState):
    strength: float = InputField(default=1.0, ge=0.0, le=1.0,
                                 description="Blend between the camera (0) and the filter (1)")
    speed: float = InputField(default=1.0, ge=0.0, le=4.0, description="How fast it ripples")


class RankedFilter(ReactorPipeline):
    state: FilterState
    input: FilterInput
    buffer_size = 8

    def load(self, config: dict[str, Any]) -> None:
        me = get_rank()
        self.rank, self.world_size, self.device = me.rank, me.world_size, me.device
        self.leader = me.is_output_rank
        hidden = config.get("hidden", 48)
        if hidden % self.world_size:
            raise ValueError(f"hidden ({hidden}) must split evenly over {self.world_size} ranks")
        if self.device == "cpu":
            # Ranks on CPUs share the machine's cores: each takes its share.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        generator = torch.Generator().manual_seed(0)
        first = torch.randn(FEATURES, hidden, generator=generator) * 1.5
        second = torch.randn(hidden, 3, generator=generator) / math.sqrt(hidden)
        share = hidden // self.world_size
        cut = slice(self.rank * share, (self.rank + 1) * share)
        self.first = first[:, cut].contiguous().to(self.device)
        self.second = second[cut].contiguous().to(self.device)
        self.size = (config.get("height", 96), config.get("width", 128))
        # Without a camera the filter works on a test card; with `wait_for_camera` it
        # waits for the client's first frame instead.
        self.wait_for_camera = bool(config.get("wait_for_camera", False))
        log_dir = config.get("rank_log_dir", "")
        self.log = Path(log_dir) / f"rank-{self.rank}.log" if log_dir else None
        if self.log is not None:
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
            self.log.write_text(f"rank {self.rank} of {self.world_size} pid {os.getpid()} "
                                f"device {self.device} gpu {gpu}\n")

    @event(name="flash", description="Flash the picture white for a few frames")
    def flash(self, frames: int = InputField(default=3, ge=1, le=30)):
        self.flash_left = frames
        self._log(f"flash {frames}")

    async def inference(self):
        t = 0.0
        self.flash_left = 0
        camera = None
        while True:
            if self.wait_for_camera:
                # Every rank waits for the same frame: the runtime feeds them together.
                camera = (await self.input.camera.read())[-1]
            else:
                got = self.input.camera.try_read()
                if got is not None:
                    camera = got[-1]
            t += self.state.speed / 30
            picture = self._card() if camera is None else _fit(camera, self.size)
            self._log(f"step {t:.4f} strength {self.state.strength:.4f} "
                      f"camera {int(picture.sum()) if camera is not None else -1}")
            frame = self._filter(picture, t)
            if self.flash_left:
                self.flash_left -= 1
                frame = np.full_like(frame, 255)
            # Every rank yields; the output rank's frame is the one the client sees.
            yield FilterOutput(main_video=frame[None])

    def _filter(self, picture: np.ndarray, t: float) -> np.ndarray:
        height, width = self.size
        rgb = torch.from_numpy(picture).to(self.device).float().reshape(-1, 3) / 255
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height, device=self.device),
                                torch.linspace(-1, 1, width, device=self.device), indexing="ij")
        where = torch.stack([xs, ys], -1).reshape(-1, 2)
        waves = torch.stack([torch.sin(where[:, 0] * 4 + t), torch.cos(where[:, 1] * 4 - t),
                             torch.sin((where[:, 0] + where[:, 1]) * 3 + 2 * t)], 1)
        features = torch.cat([rgb, where, waves], 1)  # (pixels, FEATURES)
        part = torch.relu(features @ self.first) @ self.second
        if self.world_size > 1:
            dist.all_reduce(part)  # every rank's share of each pixel, summed
        filtered = torch.sigmoid(part * 2)
        mixed = rgb + (filtered - rgb) * self.state.strength
        return (mixed.reshape(height, width, 3) * 255).to(torch.uint8).cpu().numpy()

    def _card(self) -> np.ndarray:
        height, width = self.size
        ys, xs = np.mgrid[0:height, 0:width]
        return np.stack([xs * 255 // max(1, width - 1), ys * 255 // max(1, height - 1),
                         np.full_like(xs, 128)], -1).astype(np.uint8)

    def _log(self, line: str) -> None:
        if self.log is not None:
            with self.log.open("a") as log:
                log.write(line + "\n")


def _fit(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`frame` cut or padded to `size` (nearest rows and columns)."""
    height, width = size
    rows = np.linspace(0, frame.shape[0] - 1, height).astype(int)
    cols = np.linspace(0, frame.shape[1] - 1, width).astype(int)
    return np.ascontiguousarray(frame[rows][:, cols, :3])
