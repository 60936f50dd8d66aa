"""The two model base classes authors subclass: `ReactorModel` and `ReactorPipeline`.

Both are plain classes: the runtime instantiates one, binds its buffers and
connection signal, calls `load(config)` once, then drives it. Nothing here runs
media or threads; that is the runtime's job.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, ClassVar, Iterator, Protocol

from reactor_serve.interface.messages import ModelMessage

__all__ = ["BufferClosed", "Idle", "OutputControl", "ReactorModel", "ReactorPipeline"]


class BufferClosed(Exception):
    """Raised by an input buffer's `read()` once the buffer is closed (client gone)."""


class _IdleType:
    _instance: ClassVar[_IdleType | None] = None

    def __new__(cls) -> _IdleType:
        # One sentinel, so `yield Idle` and `yield Idle()` mean the same.
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "Idle"


Idle = _IdleType()
"""Yield this (or None) from `inference()` to skip an iteration without emitting."""


class OutputControl(Protocol):
    """The parts of the output buffer a model may touch."""

    def set_fps(self, fps: float) -> None: ...

    def flush(self) -> None: ...


class _Binding(Protocol):
    async def emit(self, output: Any, drop: bool, compute_time: float | None) -> None: ...

    async def send(self, message: ModelMessage | dict[str, Any]) -> None: ...


class _HostedModel:
    """What the runtime provides to both model kinds."""

    fps: ClassVar[float] = 30
    buffer_size: ClassVar[int] = 4

    connected: asyncio.Event
    output_buffer: OutputControl
    _reactor_binding: _Binding | None = None

    def load(self, config: dict[str, Any]) -> None:
        """Called once before any client connects, with the model's config mapping."""

    def _binding(self) -> _Binding:
        if self._reactor_binding is None:
            raise RuntimeError(
                f"{type(self).__name__} is not running under the reactor runtime; "
                f"start it with reactor_serve.runtime.ModelHost"
            )
        return self._reactor_binding

    async def send(self, message: ModelMessage | dict[str, Any]) -> None:
        """Send a message to the connected client (dropped when nobody is connected)."""
        await self._binding().send(message)


class ReactorModel(_HostedModel):
    """A model that owns its loop: override `async run()` and call `emit()`."""

    #: Drop the frames still queued when a command changes the model's state, so the
    #: next frame shown is one made after the change. Off here: a run loop's frames
    #: may not depend on the state a handler sets; turn it on when they do.
    drop_stale_frames: ClassVar[bool] = False

    async def run(self) -> None:
        """The model's main loop, started once after `load()`. Default: wait forever,
        for models whose logic lives entirely in event handlers."""
        await asyncio.Event().wait()

    async def emit(
        self, output: Any, drop: bool = False, compute_time: float | None = None
    ) -> None:
        """Queue an `Output` (or a raw frame/batch for single-video-track models).

        Waits while the output buffer is full, or with `drop=True` discards what does
        not fit. `compute_time` (seconds) lets the runtime match the emission rate to
        the model's throughput. Frames are queued without copying: emit a fresh array
        (as `tensor.cpu().numpy()` gives) rather than one you overwrite afterwards.
        """
        await self._binding().emit(output, drop, compute_time)


class ReactorPipeline(_HostedModel):
    """A model written as a generator: override `inference()` and yield outputs.

    The runtime creates the generator when a client connects, closes it on
    disconnect, restarts it if it returns while the client is still there, and
    applies commands only between yields.
    """

    #: Drop the frames still queued when a command changes the state (they were all
    #: made before it), so the next frame shown is the first made after the change
    #: instead of a queue of old ones. Set False to show every frame made.
    drop_stale_frames: ClassVar[bool] = True

    def inference(self) -> Iterator[Any] | AsyncIterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define inference()")
