"""Frame and audio validation: what a model emits, checked and normalised without copies.

Video is `(H, W, 3)` or `(N, H, W, 3)` uint8 RGB, as a numpy array or a torch tensor
on any device. Audio is int16 `(channels, samples)`. Anything else raises
`FrameError` naming what was given and what is expected.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["FrameError", "as_array", "audio_chunk", "black_frame", "video_batch"]


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
