"""Batched steps: one call of the model for the next frame of several sessions.

A model whose `sessions_per_replica` seats share one loaded network can step them
together, since a forward pass over a batch of B costs far less than B passes. It
marks one method with `@batched`; the runtime then calls that method, instead of
`inference()` or `run()`, once per tick with one `SessionStep` per session ready for
its next frame, and the method returns one output per step, in order::

    class Styled(ReactorPipeline):
        state: StyleState

        def load(self, config):
            self.net = load_network()             # shared by every session

        @batched(max_size=8)
        def step(self, steps: list[SessionStep]) -> list[StyledOutput | None]:
            frames = [s.model.input.camera.latest() for s in steps]
            ...                                    # one forward pass for all
            return [StyledOutput(main_video=out) for out in outputs]

Each step's `model` is that session's own view of the model: its `self.state`, its
input tracks, and whatever its `@connected` hooks and its handlers assigned. An output
of None makes no frame for that session this time (its camera sent nothing yet, say).
Commands apply between steps, each to its own session; each session is paced at its
own rate, and one that is behind (its client's buffer full) simply sits a tick out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

__all__ = ["BATCHED_ATTR", "BatchDecl", "SessionStep", "batched"]

F = TypeVar("F", bound=Callable[..., Any])

BATCHED_ATTR = "__reactor_batched__"
# Sessions stepped in one call, at most: past it, the rest wait for the next call.
DEFAULT_MAX_SIZE = 8


@dataclass(frozen=True)
class BatchDecl:
    """What `@batched` declared on a method."""

    method_name: str
    max_size: int


@dataclass(frozen=True)
class SessionStep:
    """One session's part of a batched step."""

    #: The session's id (as `get_ctx().session_id` names it).
    session_id: str
    #: The session's own view of the model: `state`, `input`, and what its hooks and
    #: handlers assigned to `self`. What `load()` made is shared with every session.
    model: Any


def batched(max_size: int = DEFAULT_MAX_SIZE) -> Callable[[F], F]:
    """Mark the method that steps a batch of sessions: called with a list of
    `SessionStep`s (at most `max_size`), it returns one output (or None) per step."""
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise TypeError(f"@batched(max_size=...) must be a positive integer, got {max_size!r}")

    def mark(fn: F) -> F:
        setattr(fn, BATCHED_ATTR, BatchDecl(fn.__name__, max_size))
        return fn

    return mark
