"""What one call on every rank comes to, from each rank's answer.

Every rank answers every call. When all succeed, rank 0's result stands. When all
raise the same type of error, the worker raised it on purpose (the same input fails the
same way everywhere): the caller gets rank 0's exception and the group goes on. Any
other mix means the ranks are no longer doing the same thing, and whatever rank 0
made came from collectives a failing rank was part of: `RankDesync`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reactor_serve.runtime.ranks.errors import RankDesync

__all__ = ["RankAnswer", "verdict"]


@dataclass(frozen=True)
class RankAnswer:
    """One rank's answer to one call: rank 0's `result` on success, or its `error`."""

    rank: int
    result: Any = None
    error: BaseException | None = None


def verdict(answers: list[RankAnswer], what: str) -> RankAnswer:
    """Rank 0's answer when every rank succeeded. Raises rank 0's exception when every
    rank raised the same type of error, RankDesync otherwise."""
    answers = sorted(answers, key=lambda answer: answer.rank)
    failed = [answer for answer in answers if answer.error is not None]
    if not failed:
        return answers[0]
    kinds = {type(answer.error) for answer in failed}
    if len(failed) == len(answers) and len(kinds) == 1:
        # Messages are not compared: a worker may put its rank in them.
        assert answers[0].error is not None
        raise answers[0].error
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
