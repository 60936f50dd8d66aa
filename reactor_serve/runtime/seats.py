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
from dataclasses import dataclass
from typing import Any

from reactor_serve.runtime.loading.count_setting import count_setting

__all__ = ["MAX_SEATS", "SEATS_KEY", "TorchThreadSettings", "seat_count"]

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


@dataclass(frozen=True)
class TorchThreadSettings:
    """What torch keeps per thread that a model's `load()` may have set, carried from
    the loading thread to every other thread that runs the model's steps (another
    seat's model thread, the batch scheduler's).

    - `intra_op_threads`: torch's CPU thread count (`torch.set_num_threads`,
      OpenMP's) belongs to the thread that sets it. Without it, every other thread
      would start with one thread per core, and spin them.
    - `cuda_device`: the current CUDA device is per thread too. A thread that never
      set one runs its first cuBLAS call with no current context, and CUDA warns
      ("no current CUDA context") before making the primary context current.
    """

    intra_op_threads: int | None = None
    cuda_device: int | None = None

    @classmethod
    def of_this_thread(cls) -> TorchThreadSettings:
        """The calling thread's settings; none without torch, and no device unless
        CUDA was initialised (asking would initialise it)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return cls()
        cuda = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        return cls(intra_op_threads=int(torch.get_num_threads()), cuda_device=cuda)

    def apply(self) -> None:
        """Give the calling thread these settings (what is None is left alone)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if self.intra_op_threads is not None and torch.get_num_threads() != self.intra_op_threads:
            torch.set_num_threads(self.intra_op_threads)
        if self.cuda_device is not None:
            torch.cuda.set_device(self.cuda_device)
