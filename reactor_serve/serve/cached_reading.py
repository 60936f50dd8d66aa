"""`CachedReading`: a value read at most once per `ttl_s`, one read at a time.

For what the ingress reads from the control plane on behalf of clients (Serve's
deployment status, the session directory's counts, a model's published settings):
a picker page polled by many browsers, or a burst of new sessions, must cost the
controller and the GCS one read per interval per ingress replica, not one per
request. Concurrent callers of a stale reading wait for the one read in flight
instead of each starting their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["CachedReading"]

T = TypeVar("T")


class CachedReading(Generic[T]):
    """`await reading.get()`: the value `read()` gave at most `ttl_s` ago.

    `read` should not raise (answer a fallback value instead); if it does, the
    error reaches the caller and the next `get` reads again.
    """

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._ttl_s = ttl_s
        self._clock = clock
        self._value: T | None = None
        self._read_at: float | None = None
        # Created on first use, on the loop that uses it.
        self._lock: asyncio.Lock | None = None

    async def get(self) -> T:
        if self._fresh():
            return self._value  # type: ignore[return-value]
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            # Another caller may have read it while this one waited for the lock.
            if not self._fresh():
                self._value = await self._read()
                self._read_at = self._clock()
        return self._value  # type: ignore[return-value]

    def _fresh(self) -> bool:
        return self._read_at is not None and self._clock() - self._read_at <= self._ttl_s
