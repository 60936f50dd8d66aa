"""Large arrays in a call's input reach each rank through shared memory, not the socket.

A step's input is often a frame or a latent: megabytes. Pickled into the call message,
it would be copied into each rank's socket and out again, then rebuilt by unpickling,
once per rank. Instead the runner writes each large array (a numpy array or a torch
tensor of at least `SHARED_MIN_BYTES`) into that rank's own ring of shared slots
(`frame_ring`, anonymous memory: nothing in /dev/shm, freed by the kernel with the
last process), and the message carries a small `SharedArray` in its place. The rank
maps the slot and hands its worker a view, no copy: the slot goes back when the
worker drops the last view of it, so a worker that keeps an input keeps its slot.

One ring per rank, not one for all: a slot is freed by its one reader, so no rank can
free memory another still reads, and a rank's view is its own to write.

When a rank holds so many earlier inputs that no slot is free and the ring may not
grow (its `max_bytes`), or one array is larger than that, the call fails with
`SharedSlotAllocationFailed` before anything is sent: no rank saw the call, so the
group goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from reactor_serve.runtime.isolation.frame_ring import (
    FrameReader,
    FrameWriter,
    SlotRef,
    torch_numpy_dtype,
)
from reactor_serve.runtime.isolation.process_channel import ProcessChannel
from reactor_serve.runtime.ranks.errors import SharedSlotAllocationFailed

__all__ = [
    "SHARED_MIN_BYTES",
    "InputSharing",
    "SharedArray",
    "has_shareable",
    "restore_shared",
]

# Smaller arrays ride in the message: pickling them costs less than a slot's
# bookkeeping.
SHARED_MIN_BYTES = 1 << 16
# Slots per ring: a call's arrays, and a few calls' worth that a rank may still hold.
SLOTS = 4
# How deep in dicts, lists and tuples arrays are looked for; deeper ones are pickled.
MAX_DEPTH = 8


class SharedArray(NamedTuple):
    """What stands in the message for an array placed in the rank's shared slot."""

    ref: SlotRef
    # None for a numpy array; for a torch tensor, its device type ("cpu", "cuda").
    torch_device: str | None


def _is_torch_tensor(value: Any) -> bool:
    # A tensor can only exist if torch was imported, so this never imports torch.
    # Plain tensors only: a subclass would come back as a plain one.
    torch = sys.modules.get("torch")
    return torch is not None and type(value) is torch.Tensor


def _has_numpy_dtype(tensor: Any) -> bool:
    try:
        torch_numpy_dtype(tensor.dtype)
    except TypeError:
        return False  # bfloat16 and the like: pickled as before
    return True


def _shareable(value: Any) -> bool:
    if type(value) is np.ndarray:  # a subclass (a masked array, say) is pickled whole
        return not value.dtype.hasobject and value.nbytes >= SHARED_MIN_BYTES
    if _is_torch_tensor(value):
        # A tensor that tracks gradients, or has no dense numpy layout, keeps what
        # pickling gives it.
        return (value.layout is sys.modules["torch"].strided and not value.requires_grad
                and value.numel() * value.element_size() >= SHARED_MIN_BYTES
                and _has_numpy_dtype(value))
    return False


def _rebuilt(value: Any, change: Callable[[Any], Any], depth: int = 0) -> Any:
    """`value` with each leaf that `change` replaces (returns something other than
    `_KEEP` for) replaced: the values inside dicts, lists and tuples, within
    `MAX_DEPTH`. The one walk where arrays are looked for, on both sides."""
    replaced = change(value)
    if replaced is not _KEEP:
        return replaced
    if depth >= MAX_DEPTH:
        return value
    if type(value) is dict:
        return {k: _rebuilt(v, change, depth + 1) for k, v in value.items()}
    if type(value) is list:
        return [_rebuilt(v, change, depth + 1) for v in value]
    if type(value) is tuple:
        return tuple(_rebuilt(v, change, depth + 1) for v in value)
    return value


_KEEP = object()


def has_shareable(value: Any) -> bool:
    """Whether `value` holds an array worth sharing, within `MAX_DEPTH`."""
    found = False

    def look(leaf: Any) -> Any:
        nonlocal found
        if _shareable(leaf):
            found = True
            return leaf
        return _KEEP

    _rebuilt(value, look)
    return found


class InputSharing:
    """The runner's side: one writer of shared slots per rank.

    `place` writes a call's large arrays into a rank's slots and sends the rank any new
    ring first (its descriptor rides the socket); `release` gives back the slots of a
    call that is not sent after all.
    """

    def __init__(self, ranks: int, max_bytes: int) -> None:
        self._max_bytes = int(max_bytes)
        self._writers = [FrameWriter(f"reactor-rank{rank}-inputs", SLOTS, self._max_bytes)
                         for rank in range(ranks)]

    def place(
        self, rank: int, channel: ProcessChannel, value: Any
    ) -> tuple[Any, list[SlotRef]]:
        """`value` with its large arrays in `rank`'s slots, and the slots written.
        Raises SharedSlotAllocationFailed (with what was written given back)."""
        written: list[SlotRef] = []

        def share(leaf: Any) -> Any:
            if not _shareable(leaf):
                return _KEEP
            shared = self._write(rank, channel, leaf)
            written.append(shared.ref)
            return shared

        try:
            return _rebuilt(value, share), written
        except BaseException:
            self.release(rank, written)
            raise

    def _write(self, rank: int, channel: ProcessChannel, array: Any) -> SharedArray:
        writer = self._writers[rank]
        torch_device = array.device.type if _is_torch_tensor(array) else None
        nbytes = array.numel() * array.element_size() if torch_device else array.nbytes
        try:
            placed = writer.write(array)
        except ValueError as exc:
            raise SharedSlotAllocationFailed(
                f"rank {rank}: an input of {nbytes} bytes does not fit its shared memory "
                f"({self._max_bytes} bytes): {exc}") from None
        if placed is None:
            raise SharedSlotAllocationFailed(
                f"rank {rank}: no shared slot free for an input of {nbytes} bytes: the "
                f"rank still holds earlier inputs in all of its {self._max_bytes} bytes "
                "(a worker that keeps an input keeps its slot; copy what you keep)")
        ref, announcement = placed
        if announcement is not None:
            # Before the message that names a slot of it: the rank attaches it as it
            # reads. A rank already gone fails the call at the gather.
            channel.send_ring(announcement)
        return SharedArray(ref, torch_device)

    def release(self, rank: int, written: list[SlotRef]) -> None:
        for ref in written:
            self._writers[rank].release(ref.generation, ref.index)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


def restore_shared(value: Any, reader: FrameReader, device: str) -> Any:
    """The rank's side: `value` with each `SharedArray` replaced by a view of its slot
    (a torch tensor again where it was one, on this rank's device if it was on a GPU)."""

    def restore(leaf: Any) -> Any:
        if not isinstance(leaf, SharedArray):
            return _KEEP
        view = reader.view(leaf.ref)
        if leaf.torch_device is None:
            return view
        import torch

        tensor = torch.from_numpy(view)
        return tensor if leaf.torch_device == "cpu" else tensor.to(device)

    return _rebuilt(value, restore)
