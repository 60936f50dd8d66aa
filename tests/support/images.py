"""Image files for tests that upload one: a PNG of one colour, made with PyAV."""

from __future__ import annotations

import io

import av
import numpy as np

__all__ = ["png_of"]


def png_of(colour: tuple[int, int, int], height: int = 6, width: int = 8) -> bytes:
    """The bytes of a `width` x `height` PNG filled with `colour` (RGB)."""
    picture = np.empty((height, width, 3), np.uint8)
    picture[...] = colour
    out = io.BytesIO()
    with av.open(out, "w", format="image2pipe") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
