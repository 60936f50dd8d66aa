"""`get_ctx()`: the current session's context, from anywhere in the session's code.

The runtime binds a context source to the model's thread, its tasks and the older
API's session thread. Code on threads the model started itself cannot be seen that
way, so when exactly one session is live in the process, that one is returned.
"""

from __future__ import annotations

import abc
import contextvars
import threading
from typing import Any, Callable

from reactor_serve.interface.rank_context import get_rank

__all__ = ["SessionContext", "bind_context_source", "get_ctx", "register_live", "unregister_live"]


class SessionContext(abc.ABC):
    """What `get_ctx()` returns while a client is connected."""

    @abc.abstractmethod
    def emit_block(self, frames: Any) -> None:
        """Queue `(N,H,W,3)` or `(H,W,3)` uint8 RGB frames; `None` queues one black frame.

        Blocks while the output buffer is full; returns at once after the session stops.
        """

    @abc.abstractmethod
    def should_stop(self) -> bool:
        """True after the client disconnects, the session is stopped, or shutdown."""

    @abc.abstractmethod
    def send(self, message: Any) -> None:
        """Send a JSON message (a dict, sent as given, or a `ModelMessage`) to the client."""

    @abc.abstractmethod
    def disable_monitoring(self) -> None:
        """Stop measuring the generation rate during an intentional pause."""

    @abc.abstractmethod
    def enable_monitoring(self) -> None:
        """Resume measuring the generation rate."""

    @property
    @abc.abstractmethod
    def session_id(self) -> str:
        """The id of the live session."""

    # Where this process stands among the model's ranks (interface/rank_context.py):
    # the same for every session of the process.

    @property
    def rank(self) -> int:
        """This process's rank (0 unless the model runs on several ranks)."""
        return get_rank().rank

    @property
    def world_size(self) -> int:
        """How many ranks run the model (1 unless it runs on several)."""
        return get_rank().world_size

    @property
    def device(self) -> str:
        """This rank's device: "cuda:0" on a GPU, else "cpu"."""
        return get_rank().device


ContextSource = Callable[[], "SessionContext | None"]

_source: contextvars.ContextVar[ContextSource | None] = contextvars.ContextVar(
    "reactor_context_source", default=None
)
_live: list[SessionContext] = []
_live_lock = threading.Lock()


def bind_context_source(source: ContextSource) -> None:
    """Bind `source` to the current thread or task (runtime use)."""
    _source.set(source)


def register_live(ctx: SessionContext) -> None:
    with _live_lock:
        _live.append(ctx)


def unregister_live(ctx: SessionContext) -> None:
    with _live_lock:
        if ctx in _live:
            _live.remove(ctx)


def get_ctx() -> SessionContext:
    """The live session's context. Raises RuntimeError outside a session."""
    source = _source.get()
    if source is not None:
        ctx = source()
        if ctx is not None:
            return ctx
        raise RuntimeError("get_ctx() called outside a session: no client is connected")
    with _live_lock:
        if len(_live) == 1:
            return _live[0]
        count = len(_live)
    if count == 0:
        raise RuntimeError("get_ctx() called outside a session: no client is connected")
    raise RuntimeError(
        f"get_ctx() called from a thread that belongs to no session while {count} "
        f"sessions are live; call it from the model's own code"
    )
