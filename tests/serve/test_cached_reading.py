"""A reading reused for its TTL, with one read in flight: a fake clock moves time."""

from __future__ import annotations

import asyncio

import pytest

from reactor_serve.serve.cached_reading import CachedReading


class Source:
    def __init__(self) -> None:
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def read(self) -> int:
        self.reads += 1
        await self.gate.wait()
        return self.reads


async def test_a_reading_is_reused_until_its_ttl_has_passed():
    source, now = Source(), [10.0]
    reading = CachedReading(source.read, 2.0, clock=lambda: now[0])

    assert await reading.get() == 1
    now[0] += 2.0
    assert await reading.get() == 1
    now[0] += 0.01
    assert await reading.get() == 2
    assert source.reads == 2


async def test_concurrent_callers_of_a_stale_reading_share_one_read():
    source = Source()
    source.gate.clear()
    reading = CachedReading(source.read, 2.0, clock=lambda: 0.0)

    callers = [asyncio.create_task(reading.get()) for _ in range(5)]
    await asyncio.sleep(0)  # one loop turn, not wall time: every caller starts in it
    source.gate.set()

    assert await asyncio.gather(*callers) == [1] * 5
    assert source.reads == 1


async def test_a_read_that_raises_reaches_the_caller_and_the_next_get_reads_again():
    attempts = []

    async def read() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("down")
        return "up"

    reading = CachedReading(read, 2.0, clock=lambda: 0.0)
    with pytest.raises(ConnectionError):
        await reading.get()
    assert await reading.get() == "up"
