"""Our log records in a Serve replica's log.

Serve writes a replica's log (the file the dashboard shows for that replica, and
stderr when asked) through the handlers it puts on the `ray.serve` logger, and on no
other. The sessions' lifecycle (orphaned, resumed, ended and why), the model process's
restarts and the admission's decisions are logged at INFO under `reactor_serve`:
without this, a replica drops them (they reach no handler, and Python's last resort
prints only warnings), and an operator reading why a session ended finds nothing.
"""

from __future__ import annotations

import logging

__all__ = ["SERVE_LOGGER", "join_serve_log"]

SERVE_LOGGER = "ray.serve"
OURS = "reactor_serve"


class _ServeLog(logging.Handler):
    """Hands each record to the `ray.serve` logger's handlers as they are when it is
    logged: Serve replaces them when a deployment's logging config changes."""

    def emit(self, record: logging.LogRecord) -> None:
        serve = logging.getLogger(SERVE_LOGGER)
        if record.levelno >= serve.getEffectiveLevel():
            serve.handle(record)


def join_serve_log() -> None:
    """Route the `reactor_serve` loggers of this process into the Serve log, at the
    level Serve's logging config sets. Called where a replica starts; once is enough."""
    ours = logging.getLogger(OURS)
    if not any(isinstance(handler, _ServeLog) for handler in ours.handlers):
        ours.addHandler(_ServeLog())
    # Serve's own handlers write them: passing them on to the root logger as well
    # would print them twice where the root has a handler.
    ours.propagate = False
    ours.setLevel(logging.getLogger(SERVE_LOGGER).getEffectiveLevel())
