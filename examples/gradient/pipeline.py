from dataclasses import dataclass
from typing import Any

import numpy as np

from reactor_runtime.interface import InputField, InputState, Output, ReactorPipeline, Video


@dataclass
class MyOutput(Output):
    main_video: Video


@dataclass
class MyState(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness multiplier")


class MyModel(ReactorPipeline):
    state: MyState
    buffer_size = 8

    def load(self, config: dict[str, Any]) -> None:
        self.width = config.get("width", 640)
        self.height = config.get("height", 480)
        self.chunk_size = config.get("chunk_size", 4)

    def inference(self):
        frame_idx = 0
        while True:
            batch, frame_idx = render_batch(
                self.width, self.height, self.chunk_size,
                frame_idx, self.state.brightness,
            )
            yield MyOutput(main_video=batch)


PERIOD = 360  # pixels per full colour cycle along the diagonal
SPEED = 4     # pixels the gradient moves per frame


def render_batch(width, height, chunk_size, start_idx, brightness):
    """Render frames of a diagonal rainbow that scrolls with the frame index.

    Returns (np.ndarray uint8 of shape (N, H, W, 3), next_frame_index).
    """
    # One colour cycle, with brightness applied here once instead of on every pixel.
    hue = np.arange(PERIOD, dtype=np.float32)[:, None] / PERIOD
    channel_phase = np.array([0.0, 1 / 3, 2 / 3], dtype=np.float32)
    palette = 0.5 + 0.5 * np.cos(2 * np.pi * (hue + channel_phase))
    palette = np.clip(palette * (255.0 * brightness), 0, 255).astype(np.uint8)

    # Pixel (y, x) shows colour (x + y + shift) % PERIOD, so every row is a window
    # of one long colour strip, one step further along than the row above.
    # Copying those windows is far cheaper than computing colours per pixel.
    strip = palette[np.arange(PERIOD + height + width) % PERIOD]
    windows = np.lib.stride_tricks.sliding_window_view(strip, width, axis=0)  # (L, 3, W)

    frames = np.empty((chunk_size, height, width, 3), dtype=np.uint8)
    for i in range(chunk_size):
        shift = (start_idx + i) * SPEED % PERIOD
        frames[i] = windows[shift:shift + height].transpose(0, 2, 1)
    return frames, start_idx + chunk_size
