"""`get_rank()`: which rank of a multi-GPU model this process is, and on what device.

A model whose config says `ranks: R` and `rank_mode: model` runs its own class in R
processes, one per GPU (see docs/ranks.md). Each reads its place here, in `load()` to
take its share of the weights and in a session to know whether its frames are the
ones the client sees. A model run any other way is rank 0 of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankContext", "bind_rank", "get_rank", "visible_device"]


@dataclass(frozen=True)
class RankContext:
    """This process's place among the ranks of its model."""

    rank: int
    world_size: int
    # "cuda:0" on a GPU (each rank sees its own GPU only), else "cpu".
    device: str
    # The rank whose frames and messages reach the client.
    output_rank: int = 0

    @property
    def is_output_rank(self) -> bool:
        """This rank's emits are the ones the client sees (the others' are dropped)."""
        return self.rank == self.output_rank


_bound: RankContext | None = None


def bind_rank(context: RankContext) -> None:
    """Say which rank this process is (runtime use, once, before the model loads)."""
    global _bound
    _bound = context


def get_rank() -> RankContext:
    """This process's rank. Outside a multi-rank model: rank 0 of 1, on the first GPU
    this process sees, else the CPU."""
    if _bound is not None:
        return _bound
    return RankContext(0, 1, visible_device())


def visible_device() -> str:
    """The first GPU this process sees ("cuda:0"; a rank sees its own only), else "cpu"."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda:0" if torch.cuda.is_available() else "cpu"
