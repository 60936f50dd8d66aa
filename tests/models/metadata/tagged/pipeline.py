# A pipeline that tags every frame it makes with its index and the session's label,
# and paints the index into the frame: a client can check each frame's metadata
# against the picture it came with.
from dataclasses import dataclass

import numpy as np

from reactor_runtime.interface import (
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
class Label(InputState):
    label: str = InputField(default="a", max_length=16, description="Put into each frame's metadata")


def level(n: int) -> int:
    """The grey level frame `n` is painted with."""
    return 20 + (n * 12) % 216


class Tagged(ReactorPipeline):
    state: Label
    fps = 24
    buffer_size = 8

    def inference(self):
        n = 0
        while True:
            batch = np.empty((4, 96, 128, 3), np.uint8)
            tags = []
            for i in range(4):
                batch[i] = level(n + i)
                tags.append({"n": n + i, "label": self.state.label})
            n += 4
            yield Picture(main_video=TrackPayload(batch, metadata=tags))
