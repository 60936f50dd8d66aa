"""Waits the tests share: for an awaitable, or for the first frame a model made.

Each is bounded only so that a broken server fails instead of hanging, and says what
was awaited when the bound runs out; none of them measures a speed."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable

import numpy as np

__all__ = ["model_frame", "until", "within_deadline"]


async def until(condition: Any, what: str, timeout: float = 60.0) -> None:
    """Return once `condition()` holds; fail naming `what` if it does not in `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # the poll interval of a wait with a deadline


async def within_deadline(awaitable: Awaitable[Any], what: str, timeout: float = 60.0) -> Any:
    """Await `awaitable`; if it hangs past `timeout`, fail saying what was awaited."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def model_frame(client: Any, shape: tuple[int, ...], timeout: float = 60.0) -> np.ndarray:
    """The first picture of `shape` the client gets: the first the model made, since
    until then a session shows black at a default size."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no frame of the model's size {shape} arrived in {timeout} s"
        image = (await client.next_frame(timeout=remaining)).image
        if image.shape == shape:
            return image
