"""Which rank processes run under a process, and what each is doing (Linux `/proc`).

The media process cannot ask a model process about its ranks (a model's runner is its
own business, and a stuck model answers nothing), so it looks: a rank is a child of
the model process started from `rank_process`, its rank in its command line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["RankProcess", "activity", "ranks_under"]

RANK_MODULE = "reactor_serve.runtime.ranks.rank_process"

_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O",
           "T": "stopped by a signal", "t": "stopped by a debugger", "Z": "exited"}


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    activity: str


def _stat(pid: int) -> list[str] | None:
    """`/proc/PID/stat` past the command name: state, parent pid, ..."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def activity(pid: int) -> str:
    """What the kernel says `pid` is doing, for a person."""
    fields = _stat(pid)
    if not fields:
        return "gone"
    return _STATES.get(fields[0], f"state {fields[0]}")


def ranks_under(parent: int) -> list[RankProcess]:
    """The rank processes whose parent is `parent`, by rank (empty off Linux)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or int(fields[1]) != parent or fields[0] == "Z":
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                argv = file.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if RANK_MODULE in argv and "--rank" in argv:
            try:
                rank = int(argv[argv.index("--rank") + 1])
            except (IndexError, ValueError):
                continue
            found.append(RankProcess(rank, int(entry), _STATES.get(fields[0], fields[0])))
    return sorted(found, key=lambda r: r.rank)
