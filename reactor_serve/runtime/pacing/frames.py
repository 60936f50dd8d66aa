"""Frame and audio validation: what a model emits, checked and normalised without copies.

Video is `(H, W, 3)` or `(N, H, W, 3)` uint8 RGB, as a numpy array or a torch tensor
on any device. Audio is int16 `(channels, samples)`. Anything else raises
`FrameError` naming what was given and what is expected. So does per-frame metadata
(`TrackPayload.metadata`) that cannot be sent: it becomes bytes here, once, so the
media side only ever carries bytes.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

__all__ = [
    "MAX_FRAME_METADATA_BYTES",
    "FrameError",
    "as_array",
    "audio_chunk",
    "black_frame",
    "frame_metadata",
    "video_batch",
]

# One frame's metadata rides at the end of that frame's encoded picture: a bound keeps
# a model from turning every frame into a burst of extra packets.
MAX_FRAME_METADATA_BYTES = 16 * 1024


class FrameError(ValueError):
    """A frame or audio chunk of the wrong type, shape or dtype."""


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        device = getattr(value, "device", None)
        where = f" on {device}" if device is not None and str(device) != "cpu" else ""
        return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}{where}"
    return type(value).__name__


def _is_torch_tensor(value: Any) -> bool:
    # Duck-typed so the runtime never imports torch itself.
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def as_array(value: Any) -> np.ndarray:
    """A numpy view of `value`; torch tensors on another device are copied to host."""
    if isinstance(value, np.ndarray):
        return value
    if _is_torch_tensor(value):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return tensor.numpy()
    raise FrameError(f"expected a numpy array or torch tensor, got {_describe(value)}")


def _array_for(value: Any, track: str, expected: str) -> np.ndarray:
    try:
        return as_array(value)
    except FrameError:
        raise FrameError(f"track {track!r}: expected {expected}, got {_describe(value)}") from None


def video_batch(value: Any, track: str, on_device: bool = False) -> Any:
    """`value` as an `(N, H, W, 3)` uint8 array (a single frame becomes N=1), no copy.

    With `on_device`, a torch tensor is checked where it is and returned as a tensor
    (on its device): its one copy to host is then the write into shared memory."""
    expected = "uint8 RGB frames of shape (H, W, 3) or (N, H, W, 3)"
    if on_device and _is_torch_tensor(value):
        array = _TensorShape(value.detach())
    else:
        array = _array_for(value, track, expected)
    if array.ndim not in (3, 4) or array.shape[-1] != 3:
        channels = array.shape[-1] if array.ndim >= 3 else None
        problem = (
            f"{channels} channels"
            if array.ndim in (3, 4) and channels != 3
            else f"{array.ndim} dimensions"
        )
        raise FrameError(
            f"track {track!r}: expected {expected}, got {_describe(value)} ({problem})"
        )
    if array.dtype != np.uint8:
        raise FrameError(
            f"track {track!r}: expected {expected}, got {_describe(value)} "
            f"(convert with (x * 255).clamp(0, 255).to(torch.uint8) or .astype(np.uint8))"
        )
    if 0 in array.shape[:-1]:
        raise FrameError(f"track {track!r}: expected {expected}, got an empty {_describe(value)}")
    if isinstance(array, _TensorShape):
        tensor = array.tensor
        return tensor.unsqueeze(0) if tensor.dim() == 3 else tensor
    return array[None] if array.ndim == 3 else array


class _TensorShape:
    """A torch tensor seen through the numpy attributes `video_batch` checks, so one
    set of checks serves both (the runtime never imports torch itself)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.ndim = tensor.dim()
        self.shape = tuple(tensor.shape)
        name = str(tensor.dtype).removeprefix("torch.")
        # Compares equal to np.uint8 exactly when the tensor is torch.uint8.
        self.dtype: Any = np.dtype(np.uint8) if name == "uint8" else name




def audio_chunk(value: Any, track: str) -> np.ndarray:
    """`value` as an int16 `(channels, samples)` array, no copy."""
    expected = "int16 audio of shape (channels, samples)"
    array = _array_for(value, track, expected)
    if array.ndim != 2 or array.dtype != np.int16:
        raise FrameError(f"track {track!r}: expected {expected}, got {_describe(value)}")
    if array.shape[0] not in (1, 2):
        raise FrameError(
            f"track {track!r}: expected 1 or 2 channels in {expected}, got {_describe(value)}"
        )
    return array


@functools.lru_cache(maxsize=8)
def black_frame(height: int, width: int) -> np.ndarray:
    """A shared, read-only black frame of the given size."""
    frame = np.zeros((height, width, 3), dtype=np.uint8)
    frame.setflags(write=False)
    return frame


def frame_metadata(value: Any, track: str, frames: int) -> list[bytes | None]:
    """One entry per frame of a `frames`-frame emit: a `TrackPayload.metadata` value
    (a mapping, bytes, None, or a list of those with one per frame) as the bytes that
    travel with each frame."""
    if isinstance(value, list):
        if len(value) != frames:
            raise FrameError(
                f"track {track!r}: {len(value)} metadata values for {frames} frame(s); "
                "give one value, or a list with one per frame"
            )
        return [_metadata_bytes(entry, track) for entry in value]
    return [_metadata_bytes(value, track)] * frames


def _metadata_bytes(value: Any, track: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, dict):
        try:
            data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise FrameError(f"track {track!r}: metadata is not JSON: {exc}") from None
    else:
        raise FrameError(
            f"track {track!r}: metadata must be a dict, bytes or None, got {type(value).__name__}"
        )
    if len(data) > MAX_FRAME_METADATA_BYTES:
        raise FrameError(
            f"track {track!r}: metadata of {len(data)} bytes is over the "
            f"{MAX_FRAME_METADATA_BYTES}-byte limit per frame"
        )
    return data or None
