"""The logs the multi-rank examples write, one per rank (`rank_log_dir`): a header
line naming the rank, its pid and its device, then a line per step or event.

Tests count steps from these logs, not from the frames a client received: a slow step
can show the same frame more than once, so N frames are not N steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["complete_lines", "rank_logs", "ranks_logged"]


def complete_lines(path: Path) -> list[str]:
    """The lines a rank has finished writing: a live rank may be half-way through one."""
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def rank_logs(logs: Path, ranks: int) -> list[list[str]]:
    """Each rank's finished lines, header first, by rank."""
    return [complete_lines(logs / f"rank-{rank}.log") for rank in range(ranks)]


async def ranks_logged(client: Any, logs: Path, ranks: int,
                       predicate: Callable[[list[str]], bool], what: str,
                       timeout: float = 60.0) -> None:
    """Wait, while `client`'s session streams, until every rank's lines since its
    header meet `predicate`; fail naming `what` if the session ends or `timeout` runs
    out first."""
    deadline = time.monotonic() + timeout
    while not all(predicate(log[1:]) for log in rank_logs(logs, ranks)):
        assert not client.closed, (what, client.end_reason, client.end_message)
        assert time.monotonic() < deadline, f"the ranks' logs never showed {what}"
        await asyncio.sleep(0.2)  # the poll interval of this bounded wait
