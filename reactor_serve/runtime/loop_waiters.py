"""Futures that an event loop awaits and any thread may resolve."""

from __future__ import annotations

import asyncio

__all__ = ["LoopWaiters"]


class LoopWaiters:
    """Waiters created on whatever loop awaits them, woken from any thread.

    Not locked itself: callers hold their own lock around `add` / `wake_all`.
    """

    def __init__(self) -> None:
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def add(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((loop, waiter))
        return waiter

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self._waiters = [w for w in self._waiters if w[1] is not waiter]

    def wake_all(self, error: BaseException | None = None) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_settle, waiter, error)
            except RuntimeError:
                pass  # that loop is closed: nobody is waiting any more

    def __bool__(self) -> bool:
        return bool(self._waiters)


def _settle(waiter: asyncio.Future[None], error: BaseException | None) -> None:
    if waiter.done():
        return
    if error is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(error)
