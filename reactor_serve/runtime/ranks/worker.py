"""`DistributedWorker`: the shape of one rank's share of a model.

A worker class has `load(**kwargs)`, `generate(input)` and `reset()`, and a constructor
that takes no arguments. `DistributedRunner` builds one in each rank's process, sets
`rank`, `world_size` and `device` on it, calls `load()` once, then runs every call on
every rank in the same order. Subclassing is optional: a class with the three methods
is accepted as it is.
"""

from __future__ import annotations

from typing import Any

from reactor_serve.interface.rank_context import get_rank

__all__ = ["DistributedWorker", "check_worker_class"]

WORKER_METHODS = ("load", "generate", "reset")


class DistributedWorker:
    """Optional base class of a worker.

    `rank` is this process's rank (0 to `world_size - 1`); `device` is `"cuda:0"` on a
    GPU (each rank sees its own GPU only) or `"cpu"`. All three are set before `load()`.
    """

    rank: int
    world_size: int
    device: str

    @property
    def is_leader(self) -> bool:
        """The rank whose `generate()` result the caller receives (rank 0 unless the
        runner was given another `result_rank`)."""
        return self.rank == get_rank().output_rank

    def load(self, **kwargs: Any) -> None:
        """Load this rank's weights onto `self.device` (the runner's `load_kwargs`)."""
        raise NotImplementedError

    def generate(self, input: Any, /) -> Any:
        """One step on this rank. Every rank gets the same `input`, in the same order;
        the leader's return value goes to the caller, so a model whose ranks each make
        a part gathers the parts onto the leader here (a `torch.distributed`
        collective)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the session's state; keep the weights."""
        raise NotImplementedError


def check_worker_class(worker_cls: Any) -> None:
    """Raise TypeError naming what `worker_cls` lacks to be a worker class."""
    if not isinstance(worker_cls, type):
        raise TypeError(f"a worker must be a class, got {type(worker_cls).__name__}")
    missing = [name for name in WORKER_METHODS if not callable(getattr(worker_cls, name, None))]
    if missing:
        raise TypeError(
            f"{worker_cls.__qualname__} has no {', '.join(f'{m}()' for m in missing)}: a worker "
            "needs load(), generate() and reset()"
        )
    if "<locals>" in worker_cls.__qualname__:
        raise TypeError(
            f"{worker_cls.__qualname__} is defined inside a function: each rank imports the "
            "worker class by name, so define it at the top level of a module"
        )
