"""`LogThrottle`: at most so many log lines per window, so a hostile peer cannot flood
the log (or the disk) with one line per bad frame."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

__all__ = ["LOG_LINES", "LOG_WINDOW_S", "LogThrottle"]

# Warnings about bad input, per throttle: at most LOG_LINES per LOG_WINDOW_S,
# then one line saying how many were suppressed. A client flooding garbage must not be
# able to fill the disk through our logs; a handful per window is enough to diagnose.
LOG_LINES = 20
LOG_WINDOW_S = 10.0


class LogThrottle:
    """At most `lines` log lines per `window_s`; the rest are counted and reported in
    one line when the next window opens."""

    def __init__(
        self,
        logger: logging.Logger,
        lines: int = LOG_LINES,
        window_s: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.lines = lines
        self.window_s = window_s
        self._clock = clock
        self._start = clock()
        self._count = 0
        self.suppressed = 0

    def allow(self) -> bool:
        now = self._clock()
        if now - self._start >= self.window_s:
            if self.suppressed:
                self.logger.warning(
                    "%d more data-channel warnings suppressed in %.0f s",
                    self.suppressed, self.window_s,
                )
            self._start, self._count, self.suppressed = now, 0, 0
        if self._count < self.lines:
            self._count += 1
            return True
        self.suppressed += 1
        return False

    def warning(self, msg: str, *args: Any) -> None:
        if self.allow():
            self.logger.warning(msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        if self.allow():
            self.logger.exception(msg, *args)
