"""Worker classes for the ranks tests: each rank logs what it applied, in order, to a
file of its own, and inputs name the failure to act out."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from reactor_serve.runtime.ranks import DistributedRunner, DistributedWorker


class SummingWorker(DistributedWorker):
    """Each rank adds its share to an all-reduce; rank 0 returns the sum. Inputs:
    a number (a step), or a (failure, rank) pair to act out on that rank."""

    def load(self, log_dir: str, fail_load_on: int | None = None) -> None:
        if fail_load_on == self.rank:
            raise ValueError(f"rank {self.rank} cannot load")
        self.log = Path(log_dir) / f"rank-{self.rank}.log"
        self.log.write_text(f"loaded {os.getpid()} {self.world_size} {self.device} "
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")
        self.steps = 0

    def generate(self, value):
        with self.log.open("a") as log:
            log.write(f"generate {value!r}\n")
        if isinstance(value, tuple):
            failure, rank = value
            if failure == "everyone_raises":
                raise KeyError(f"no such thing on rank {self.rank}")
            if rank == self.rank:
                if failure == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                if failure == "hang":
                    time.sleep(3600)
                if failure == "raise":
                    raise ValueError("only this rank fails")
                if failure == "unpicklable":
                    return lambda: None
            return None
        self.steps += 1
        share = torch.tensor([float(value) * (self.rank + 1)])
        if self.world_size > 1:
            dist.all_reduce(share)
        return {"sum": share.item(), "steps": self.steps, "rank": self.rank,
                "world_size": self.world_size, "device": self.device}

    def reset(self) -> None:
        with self.log.open("a") as log:
            log.write("reset\n")
        self.steps = 0


def in_shared_slot(array) -> bool:
    """Whether `array`'s memory lies in a rank's ring of shared input slots (a memfd
    mapping named for it in /proc/self/maps), rather than in memory of its own."""
    address = (array.data_ptr() if isinstance(array, torch.Tensor)
               else array.__array_interface__["data"][0])
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in span.split("-"))
        if start <= address < end:
            return len(rest) == 5 and "reactor-rank" in rest[4] and "inputs" in rest[4]
    return False


class ArrayWorker(DistributedWorker):
    """Sums a large input on every rank (an all-reduce of the sums), says whether it
    arrived in shared memory, and keeps it when asked to."""

    def load(self, log_dir: str) -> None:
        self.log = Path(log_dir) / f"rank-{self.rank}.log"
        self.log.write_text(f"loaded {os.getpid()}\n")
        self.kept: list = []

    def generate(self, value):
        frame = value["frame"]
        shared = in_shared_slot(frame)
        checksum = float(frame.double().sum()) if isinstance(frame, torch.Tensor) \
            else float(frame.sum(dtype="float64"))
        if value.get("keep"):
            self.kept.append(frame)
        if value.get("scribble"):
            frame[...] = 0  # this rank's own view: no other rank sees it
        with self.log.open("a") as log:
            log.write(f"{type(frame).__name__} shared={shared} sum={checksum}\n")
        total = torch.tensor([checksum], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(total)
        small = value.get("small")
        return {"type": type(frame).__name__, "shared": shared, "total": total.item(),
                "small_shared": None if small is None else in_shared_slot(small),
                "kept": len(self.kept)}

    def reset(self) -> None:
        self.kept.clear()


@contextmanager
def started_runners(worker_cls: type, log_dir: Path) -> Iterator[Callable[..., DistributedRunner]]:
    """`start(world_size, **options)`: a started runner of `worker_cls` whose ranks log
    to `log_dir` (unless `load_kwargs` says otherwise); every one is shut down at the
    end."""
    runners: list[DistributedRunner] = []

    def start(world_size: int, **options) -> DistributedRunner:
        options.setdefault("load_kwargs", {"log_dir": str(log_dir)})
        runner = DistributedRunner(worker_cls, world_size=world_size, **options)
        runners.append(runner)
        runner.start()
        return runner

    try:
        yield start
    finally:
        for runner in runners:
            runner.shutdown()
