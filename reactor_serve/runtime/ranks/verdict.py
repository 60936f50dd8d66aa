"""What one call on every rank comes to, from each rank's answer.

Every rank answers every call. When all succeed, the result rank's (rank 0 unless the
runner names another) result stands. When all raise the same type of error, the worker
raised it on purpose (the same input fails the same way everywhere): the caller gets
the result rank's exception and the group goes on. Any other mix means the ranks are
no longer doing the same thing, and whatever the result rank
made came from collectives a failing rank was part of: `RankDesync`. So is a call that
succeeded everywhere but came to different things, where the worker sums its results
up (`summarize`): ranks that part ways are stopped before a collective hangs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reactor_serve.runtime.ranks.errors import RankDesync

__all__ = ["RankAnswer", "verdict"]


@dataclass(frozen=True)
class RankAnswer:
    """One rank's answer to one call: the result rank's `result` on success (the
    others' stay behind), or its `error`."""

    rank: int
    result: Any = None
    error: BaseException | None = None
    # What the call came to on this rank, from a worker that sums its results up
    # (`summarize(result)`): small, sent by every rank, compared by `verdict`.
    summary: Any = None


def verdict(answers: list[RankAnswer], what: str, result_rank: int = 0) -> RankAnswer:
    """`result_rank`'s answer when every rank succeeded. Raises its exception when every
    rank raised the same type of error, RankDesync otherwise."""
    answers = sorted(answers, key=lambda answer: answer.rank)
    failed = [answer for answer in answers if answer.error is not None]
    chosen = next(answer for answer in answers if answer.rank == result_rank)
    if not failed:
        if len({answer.summary for answer in answers}) > 1:
            raise RankDesync(f"{what}: the ranks disagree: " + "; ".join(
                f"rank {answer.rank} {answer.summary}" for answer in answers))
        return chosen
    kinds = {type(answer.error) for answer in failed}
    if len(failed) == len(answers) and len(kinds) == 1:
        # Messages are not compared: a worker may put its rank in them.
        assert chosen.error is not None
        raise chosen.error
    first = failed[0]
    if len(failed) < len(answers):
        fine = ", ".join(str(a.rank) for a in answers if a.error is None)
        others = f"rank(s) {fine} did not"
    else:
        others = "the others raised " + ", ".join(
            f"{type(a.error).__name__} (rank {a.rank})" for a in failed[1:]
        )
    raise RankDesync(
        f"{what}: rank {first.rank} raised {type(first.error).__name__}: {first.error}; "
        f"{others}"
    ) from first.error
