"""`FailureThrottle`: an address that keeps presenting bad keys or tokens is slowed
down, then refused for a while, so guessing costs time instead of only requests.

Counts failures per address over a sliding window. Below `free_failures` nothing
happens; above it each further request from that address waits a little longer
(up to `max_delay_s`), and past `block_after` it is refused with a time to retry.
The block must be reachable by a client that waits for each answer: `block_after`
delays at most `max_delay_s` each fit in the window.
Bounded memory: the least recently failing addresses are forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

__all__ = ["FailureThrottle"]


class FailureThrottle:
    def __init__(
        self,
        *,
        window_s: float = 60.0,
        free_failures: int = 5,
        block_after: int = 20,
        max_delay_s: float = 1.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.free_failures = free_failures
        self.block_after = block_after
        self.max_delay_s = max_delay_s
        self._max_addresses = max_addresses
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        cutoff = self._clock() - self.window_s
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def retry_after_s(self, address: str) -> float | None:
        """Seconds until this address may try again, or None when it may now."""
        times = self._recent(address)
        if times is None or len(times) < self.block_after:
            return None
        return max(1.0, times[-self.block_after] + self.window_s - self._clock())

    def delay_s(self, address: str) -> float:
        """How long to hold this address's next answer."""
        times = self._recent(address)
        over = 0 if times is None else len(times) - self.free_failures
        if over <= 0:
            return 0.0
        return min(self.max_delay_s, 0.1 * 2 ** min(over - 1, 10))

    def failed(self, address: str) -> None:
        times = self._failures.pop(address, None) or deque()
        times.append(self._clock())
        while len(times) > self.block_after:
            times.popleft()
        self._failures[address] = times
        while len(self._failures) > self._max_addresses:
            self._failures.popitem(last=False)
