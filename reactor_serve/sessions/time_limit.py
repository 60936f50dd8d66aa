"""`TimeLimit`: a session's longest allowed time, from its API key or token.

A minute before the end the client gets a message, as a model's would be sent:
`{"type": "session_limit", "data": {"seconds_left", "ends_at"}}` (at once, for a limit
shorter than that); at the end the session is ended with `sessionEnded{reason:
"limit"}`. Times are wall-clock seconds, so a limit fixed by one process (the
ingress, when it created the session) holds in another (the replica that runs it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["WARN_BEFORE_S", "TimeLimit"]

log = logging.getLogger("reactor_serve.sessions")

WARN_BEFORE_S = 60.0


class TimeLimit:
    def __init__(
        self,
        ends_at: float,
        *,
        warn: Callable[[dict[str, Any]], None],
        end: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ends_at = ends_at
        self._warn = warn
        self._end = end
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="reactor-time-limit")

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _run(self) -> None:
        await asyncio.sleep(max(0.0, self.ends_at - WARN_BEFORE_S - self._clock()))
        left = max(0.0, self.ends_at - self._clock())
        self._warn({"type": "session_limit",
                    "data": {"seconds_left": math.ceil(left), "ends_at": self.ends_at}})
        await asyncio.sleep(max(0.0, self.ends_at - self._clock()))
        try:
            await self._end("the session reached the longest time its API key or token "
                            "allows")
        except Exception:
            log.exception("ending a session at its time limit failed")
