"""A network split over ranks (tensor parallel): each rank holds a slice of the hidden
layer, computes its share of every pixel, and an all-reduce sums the shares into the
frame that rank 0 returns. The picture is the same for any number of ranks: the
weights are drawn whole, from one seed, and each rank keeps its slice."""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reactor_runtime.distributed import DistributedRunner, DistributedWorker
from reactor_runtime.interface import (
    InputField,
    InputState,
    Output,
    ReactorPipeline,
    Video,
)

FEATURES = 16  # per pixel: its position at a few frequencies, and the time


@dataclass
class PainterOutput(Output):
    main_video: Video


@dataclass
class PainterState(InputState):
    speed: float = InputField(default=1.0, ge=0.0, le=4.0, description="How fast the picture moves")
    hue: float = InputField(default=0.0, ge=0.0, le=1.0, description="Colour wheel turn")


class PainterShard(DistributedWorker):
    """One rank's slice of the painter's hidden layer."""

    def load(self, width: int, height: int, hidden: int, log_dir: str = "") -> None:
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
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width),
                                indexing="ij")
        self.grid = torch.stack([xs, ys], -1).reshape(-1, 2).to(self.device)
        self.size = (height, width)
        self.log = Path(log_dir) / f"rank-{self.rank}.log" if log_dir else None
        if self.log is not None:
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
            self.log.write_text(f"rank {self.rank} of {self.world_size} pid {os.getpid()} "
                                f"device {self.device} gpu {gpu}\n")

    def generate(self, step: dict[str, float]) -> np.ndarray:
        if self.log is not None:
            with self.log.open("a") as log:
                log.write(f"{step['t']:.4f} {step['hue']:.4f}\n")
        t = torch.full((self.grid.shape[0], 1), step["t"], device=self.device)
        waves = [torch.sin(self.grid * f + t * f) for f in (1.0, 2.0, 4.0, 8.0)]
        waves += [torch.cos(self.grid * f - t) for f in (1.0, 3.0, 5.0)]
        features = torch.cat([*waves, torch.sin(t), torch.cos(t)], dim=1)  # (pixels, 16)
        part = torch.relu(features @ self.first) @ self.second
        if self.world_size > 1:
            dist.all_reduce(part)  # every rank's share of each pixel, summed
        if not self.is_leader:
            return None
        turn = step["hue"] * 2 * math.pi
        rgb = torch.sigmoid(part + torch.tensor([math.sin(turn), math.sin(turn + 2.1),
                                                 math.sin(turn + 4.2)], device=self.device))
        return (rgb.reshape(*self.size, 3) * 255).to(torch.uint8).cpu().numpy()

    def reset(self) -> None:
        pass


class SplitPainter(ReactorPipeline):
    state: PainterState
    buffer_size = 8

    def load(self, config: dict[str, Any]) -> None:
        # world_size is the model's `ranks` setting: one process per GPU of the replica.
        self.runner = DistributedRunner(PainterShard, load_kwargs={
            "width": config.get("width", 128), "height": config.get("height", 96),
            "hidden": config.get("hidden", 48), "log_dir": config.get("rank_log_dir", ""),
        }, call_timeout=config.get("step_timeout_s", 10.0))
        self.runner.start()

    def inference(self):
        t = 0.0
        self.runner.reset()
        while True:
            t += self.state.speed / 30
            frame = self.runner.generate({"t": t, "hue": self.state.hue})
            yield PainterOutput(main_video=frame[None])
