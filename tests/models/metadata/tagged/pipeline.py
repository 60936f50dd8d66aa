# A pipeline that tags every frame it makes with its index and the session's label,
# and paints the index into the frame: a client can check each frame's metadata
# against the picture it came with. What the client attached to its latest camera
# frame comes back in the tags too, as "echo" and "captured".
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
    Input,
    InputField,
    InputState,
    Output,
    ReactorPipeline,
    TrackPayload,
    Video,
)


@dataclass
class Picture(Output):
    main_video: Video


@dataclass
class Camera(Input):
    camera: Video


@dataclass
class Label(InputState):
    label: str = InputField(default="a", max_length=16, description="Put into each frame's metadata")


def level(n: int) -> int:
    """The grey level frame `n` is painted with."""
    return 20 + (n * 12) % 216


class Tagged(ReactorPipeline):
    state: Label
    input: Camera
    fps = 24
    buffer_size = 8

    def inference(self):
        n = 0
        echo = captured = None
        while True:
            seen = self.input.camera.try_read()
            if seen is not None:
                attached = getattr(seen[-1], "metadata", None)
                echo = attached.decode("utf-8", "replace") if attached is not None else None
                captured = getattr(seen[-1], "capture_time_us", None)
            batch = np.empty((4, 96, 128, 3), np.uint8)
            tags = []
            for i in range(4):
                batch[i] = level(n + i)
                tags.append({"n": n + i, "label": self.state.label, "echo": echo, "captured": captured})
            n += 4
            yield Picture(main_video=TrackPayload(batch, metadata=tags))
