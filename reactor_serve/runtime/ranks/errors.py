"""What a `DistributedRunner` raises when its ranks, not the worker's code, went wrong.

The names are the official runtime's, so a model that catches them runs unchanged. A
worker's own exception, raised alike by every rank, is never wrapped: the caller gets
rank 0's. After any of these the group is unusable, and the runner has already
stopped every rank; a model process whose session ends on one is restarted with all
its ranks (see `RANK_FAILURES`).
"""

from __future__ import annotations

__all__ = [
    "RANK_FAILURES",
    "RankDesync",
    "SharedSlotAllocationFailed",
    "WorkerCrashed",
    "WorkerTimeout",
    "rank_failure_in",
]


class WorkerCrashed(RuntimeError):  # noqa: N818 (the official name)
    """A rank's process died before answering; the message names the rank and how it
    died (its exit code or signal)."""


class WorkerTimeout(TimeoutError):  # noqa: N818 (the official name)
    """A rank did not answer a call within its timeout: alive but stuck, typically in
    a collective a peer left. The message names the ranks that did not answer."""


class RankDesync(RuntimeError):  # noqa: N818 (the official name)
    """Ranks disagreed on a call: some raised and some did not, or they raised
    different types of error. The message names the first failing rank; its
    exception is the `__cause__`."""


class SharedSlotAllocationFailed(MemoryError):  # noqa: N818 (the official name)
    """Memory to pass a call's data to the ranks could not be had; the message says
    how much was asked for."""


# The failures after which a model's ranks must all start again.
RANK_FAILURES: tuple[type[BaseException], ...] = (WorkerCrashed, WorkerTimeout, RankDesync)


def rank_failure_in(exc: BaseException | None) -> BaseException | None:
    """The rank failure `exc` is, or was raised from (a model may wrap it)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, RANK_FAILURES):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
