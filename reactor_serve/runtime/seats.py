"""Seats: several sessions served at once by one loaded model.

A model's config may set `sessions_per_replica: N` (default 1). The host then loads
the model once and keeps N seats, each serving one session at a time with everything
of a session its own: its model thread and event loop, `self.state`, `@connected`
hooks, generator or run loop, input tracks, output buffer and emission clock. What
`load()` made (the weights) is shared; each seat's model is a shallow copy of the
loaded one, so what a session *assigns* to `self` stays its own
(`runtime/shared_state.py` names what a session changes in place instead).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from reactor_serve.runtime.loading.count_setting import count_setting

__all__ = ["MAX_SEATS", "SEATS_KEY", "intra_op_threads", "seat_count", "use_intra_op_threads"]

SEATS_KEY = "sessions_per_replica"
# More seats than this on one model is a configuration mistake, not a plan: each is a
# thread, an output buffer and a peer connection's worth of memory.
MAX_SEATS = 64


def seat_count(
    config: Mapping[str, Any] | None, model: str, seats: int | None = None
) -> int:
    """`seats` when given (a command line's or serve_config.yaml's), else the model
    config's `sessions_per_replica`, else 1. Raises ValueError naming the field and
    the model when it is not a whole number from 1 to MAX_SEATS."""
    return count_setting(config, SEATS_KEY, model, seats, MAX_SEATS)


# torch's CPU thread count (`torch.set_num_threads`, OpenMP's) belongs to the thread
# that sets it: a model that sets it in `load()` sets it for its loading thread only,
# and every other thread that runs its forward passes (another seat's model thread,
# the batch scheduler's) would start with one thread per core, and spin them.


def intra_op_threads() -> int | None:
    """The calling thread's torch CPU thread count, if torch is loaded."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def use_intra_op_threads(count: int | None) -> None:
    """Give the calling thread the torch CPU thread count `count` (from the thread
    that loaded the model); nothing without torch or a count."""
    torch = sys.modules.get("torch")
    if torch is not None and count is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)
