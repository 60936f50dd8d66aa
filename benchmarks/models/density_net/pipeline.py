# The density benchmark's model: a decoder of stacked wide linear layers, whose
# batch-1 forward pass takes tens of milliseconds on a CPU and is bound by reading
# the weights, as a large network's step is on a GPU at batch 1: a batch of B reads
# them once for all B. `DensityNet` makes each session's frames with its own
# inference() (a forward pass per session); `BatchedDensityNet` steps the ready
# sessions together in one pass. Each frame carries the session's `level` in its
# top-left corner, so a session's frames are its own.
from dataclasses import dataclass

import torch
from torch import nn

from reactor_runtime.interface import InputField, InputState, ReactorPipeline, batched

HEIGHT, WIDTH = 48, 64


@dataclass
class Level(InputState):
    level: int = InputField(default=100, ge=0, le=255, description="Corner value")


def decoder(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    layers += [nn.Linear(width, HEIGHT * WIDTH * 3), nn.Sigmoid()]
    return nn.Sequential(*layers).eval()


class DensityNet(ReactorPipeline):
    state: Level
    fps = 12
    buffer_size = 4

    def load(self, config):
        torch.manual_seed(0)
        torch.set_num_threads(int(config.get("threads", 1)))
        device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        width = int(config.get("width", 2048))
        self.net = decoder(width, int(config.get("depth", 6))).to(self.device)
        self.latent = torch.rand(1, width, device=self.device)

    @torch.inference_mode()
    def forward(self, levels):
        """(B, H, W, 3) uint8 frames, on the model's device (the runtime copies a
        CUDA frame to the host itself)."""
        x = self.latent.expand(len(levels), -1)
        out = self.net(x).mul(255).to(torch.uint8).view(len(levels), HEIGHT, WIDTH, 3)
        marks = torch.tensor(levels, dtype=torch.uint8, device=self.device)
        out[:, :8, :8, :] = marks[:, None, None, None]
        return out

    def inference(self):
        while True:
            yield self.forward([self.state.level])


class BatchedDensityNet(DensityNet):
    @batched(max_size=8)
    def step(self, steps):
        return list(self.forward([s.model.state.level for s in steps]))
