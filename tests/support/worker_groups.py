"""Which tests run together on one pytest-xdist worker.

pytest-xdist's own `loadgroup` carries a test's group to the controller as a suffix of
its node id, which pytest 9.2's node ids no longer take. So the suite does the same
with a file instead: each worker writes the group of every test it collected into a
directory the controller gave it (`workerinput`), and the controller's scheduler, a
`loadscope` whose scope is that group, reads it once every worker has collected.

`tests/conftest.py` decides the groups and wires the hooks; this module is the
mechanism alone.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

__all__ = ["GroupScheduling", "read_groups", "write_groups"]

WORKER_INPUT_KEY = "reactor_groups_dir"


def write_groups(directory: str | os.PathLike, worker: str, groups: dict[str, str]) -> None:
    """Write one worker's {node id: group}; atomically, so a reader never sees half."""
    path = Path(directory) / f"{worker}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


def read_groups(directory: str | os.PathLike) -> dict[str, str]:
    """Every worker's groups merged (they collected the same tests)."""
    groups: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*.json")):
        groups.update(json.loads(path.read_text()))
    return groups


class _FirstInLine(OrderedDict):
    """loadscope's work queue, in which the named scopes go to the front as they are
    queued: the scheduler hands out the queue's head first, one scope to each worker."""

    def __init__(self, first: Iterable[str]) -> None:
        super().__init__()
        self._first = frozenset(first)

    def __setitem__(self, scope: str, work_unit: dict[str, bool]) -> None:
        super().__setitem__(scope, work_unit)
        if scope in self._first:
            self.move_to_end(scope, last=False)


class GroupScheduling(LoadScopeScheduling):
    """xdist's loadscope, whose scope is the group each worker wrote for the test; a
    test with none falls back to its module, as loadfile would. The groups in `first`
    are handed out before every other scope."""

    def __init__(self, config, log=None, *, directory: str | os.PathLike,
                 first: Iterable[str] = ()) -> None:
        super().__init__(config, log)
        self._directory = directory
        self._groups: dict[str, str] | None = None
        self.workqueue = _FirstInLine(first)

    def _split_scope(self, nodeid: str) -> str:
        # Called once every worker has reported its collection, and each writes its
        # file before it reports; a test missing from what was read is read for again
        # rather than silently scheduled by its module.
        if self._groups is None or nodeid not in self._groups:
            self._groups = read_groups(self._directory)
        return self._groups.get(nodeid) or nodeid.split("::", 1)[0]
