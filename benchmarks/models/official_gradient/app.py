"""examples/gradient, ported to the official reactor-runtime 3.10's API, for
benchmarks/official_clients.py. The frames come from the example's own
`render_batch`, which the benchmark copies beside this file (gradient_render.py) when
it sets the model up, so both servers draw the same pictures at the same rate."""

from pathlib import Path
from typing import Any

import yaml
from gradient_render import render_batch
from reactor_runtime import InputField, InputState, Output, ReactorApp, Video, session_started


class GradientOutput(Output):
    main_video: Video


class GradientState(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness multiplier")


class Gradient(ReactorApp):
    state: GradientState
    # The example's rate: without it the runtime paces by the measured generate() time.
    fps = 30.0

    def load(self, config_path: Path | None) -> None:
        # 3.10 hands load() the config's path, not its contents.
        config: dict[str, Any] = {}
        if config_path is not None:
            config = yaml.safe_load(Path(config_path).read_text()) or {}
        self.width = int(config.get("width", 640))
        self.height = int(config.get("height", 480))
        self.chunk_size = int(config.get("chunk_size", 4))
        self.frame_idx = 0

    @session_started
    def restart(self) -> None:
        # As the example's inference() starts at frame 0 for every session.
        self.frame_idx = 0

    def generate(self, input: GradientState) -> GradientOutput:
        batch, self.frame_idx = render_batch(
            self.width, self.height, self.chunk_size, self.frame_idx, input.brightness
        )
        return GradientOutput(main_video=batch)
