"""`join_serve_log`: what the `reactor_serve` loggers say in a replica reaches the
handlers Serve puts on `ray.serve` (a replica's log file), at Serve's level, also after
Serve replaces those handlers."""

import logging

import pytest

from reactor_serve.serve.replica_logging import SERVE_LOGGER, join_serve_log


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def serve_logger():
    """`ray.serve` and `reactor_serve` as a replica has them, restored afterwards: the
    test process's logging is shared with every other test."""
    serve, ours = logging.getLogger(SERVE_LOGGER), logging.getLogger("reactor_serve")
    saved = [(logger, logger.handlers[:], logger.level, logger.propagate) for logger in (serve, ours)]
    serve.handlers.clear()
    serve.setLevel(logging.INFO)
    serve.propagate = False
    yield serve
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def test_a_session_line_reaches_serves_handlers_at_serves_level(serve_logger):
    kept = Kept()
    serve_logger.addHandler(kept)
    join_serve_log()
    join_serve_log()  # a second replica class in the process: still one copy per record
    sessions = logging.getLogger("reactor_serve.sessions")
    sessions.info("session %s: transport %s; orphaned for up to %g s", "ab12", "idle", 30.0)
    sessions.debug("below Serve's level")
    assert [r.getMessage() for r in kept.records] == [
        "session ab12: transport idle; orphaned for up to 30 s"]
    assert kept.records[0].name == "reactor_serve.sessions"


def test_handlers_serve_puts_in_later_get_the_records(serve_logger):
    join_serve_log()
    # Serve reconfigures a deployment's logging by replacing its handlers.
    later = Kept()
    serve_logger.handlers[:] = [later]
    logging.getLogger("reactor_serve.serve").warning("model %r restarted", "gradient")
    assert [r.getMessage() for r in later.records] == ["model 'gradient' restarted"]
