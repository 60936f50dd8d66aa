"""Ranks: one model over several GPUs, a process per GPU, driven as one object.

`DistributedRunner` starts R processes of a worker class (`DistributedWorker`'s shape:
`load()`, `generate()`, `reset()`), forms their `torch.distributed` group and runs
every call on every rank in the same order; `WorkerCrashed`, `WorkerTimeout` and
`RankDesync` say how ranks failed. `rank_count` reads the model's `ranks` setting.
The official runtime's `reactor_runtime.distributed` names resolve here.
"""

from reactor_serve.runtime.ranks.errors import (
    RankDesync,
    SharedSlotAllocationFailed,
    WorkerCrashed,
    WorkerTimeout,
)
from reactor_serve.runtime.ranks.runner import DistributedRunner
from reactor_serve.runtime.ranks.worker import DistributedWorker

__all__ = [
    "DistributedRunner",
    "DistributedWorker",
    "RankDesync",
    "SharedSlotAllocationFailed",
    "WorkerCrashed",
    "WorkerTimeout",
]
