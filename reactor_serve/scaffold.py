"""``reactor init``: write a new, runnable model directory.

The generated model is the one the reference's "first model" page walks through,
written out with its imports and a real ``render_batch``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

__all__ = ["init_model", "model_name_from"]

PIPELINE_TEMPLATE = '''\
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
'''

CONFIG_TEMPLATE = """\
width: 640
height: 480
chunk_size: 4
"""

_NOT_NAME_CHARS = re.compile(r"[^a-z0-9-]")


def model_name_from(text: str) -> str:
    """A valid model name from ``text``: lowercased, other characters turned to '-'."""
    # Leading hyphens are dropped because the manifest rejects names starting with one.
    name = _NOT_NAME_CHARS.sub("-", text.lower()).lstrip("-")
    if not name:
        raise ValueError(f"cannot make a model name from {text!r}; pass a name")
    return name


def init_model(dest: str | os.PathLike[str], name: str | None = None) -> list[Path]:
    """Create a model directory at ``dest``; return the files written.

    ``dest`` may exist if it is an empty directory. ``name`` defaults to the
    directory's name; either way it is normalised to a valid model name.
    """
    dest = Path(dest)
    model_name = model_name_from(name if name is not None else dest.resolve().name)
    if dest.exists():
        if not dest.is_dir():
            raise FileExistsError(f"{dest} already exists and is not a directory")
        if any(dest.iterdir()):
            raise FileExistsError(
                f"{dest} already exists and is not empty; choose another name or directory"
            )
    dest.mkdir(parents=True, exist_ok=True)

    # safe_dump quotes names YAML would otherwise read as booleans or numbers
    # ("yes", "123").
    manifest = yaml.safe_dump(
        {"model": "pipeline:MyModel", "name": model_name, "config": "config.yml"},
        sort_keys=False,
    )
    files = {
        "pipeline.py": PIPELINE_TEMPLATE,
        "reactor.yaml": manifest,
        "config.yml": CONFIG_TEMPLATE,
    }
    written = []
    for filename, text in files.items():
        path = dest / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
