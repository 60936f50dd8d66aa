"""`SharedState`: what `load()` made, watched for changes a session makes to it.

With several seats (`sessions_per_replica` above 1), every session on a replica runs
against its own shallow copy of the loaded model: an attribute a session *assigns*
(`self.count = 0` in `@connected`, `self.state`, `self.frames += 1`) is its own, but an
object `load()` made is one object for every session. A session that changes such an
object in place (a cache tensor written with `copy_()`, a history list appended to)
leaks into every other session on the replica. That cannot be made safe behind the
author's back, so it is caught where it can be seen cheaply and named:

- torch tensors, and the parameters and buffers of `torch.nn.Module`s: each carries a
  version counter that every in-place operation bumps;
- lists, dicts, sets, deques and bytearrays: their length and the identity of their
  first items.

NumPy arrays and arbitrary objects carry no such mark, so a change to them passes
unseen; the docs say so.
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
from typing import Any

__all__ = ["SharedState", "SharedStateChanged"]

# Items of a container looked at, at most: a change past them in a longer one whose
# length stays the same passes unseen, and the check stays cheap on every step.
_ITEMS_LOOKED_AT = 64


class SharedStateChanged(RuntimeError):
    """A session changed, in place, an object every session on the replica shares."""


class SharedState:
    """The loaded model's attributes and a mark of each one's contents, checked on
    demand; thread-safe (each seat checks from its own model thread)."""

    def __init__(self, model: Any, cls_name: str) -> None:
        self._cls_name = cls_name
        self._lock = threading.Lock()
        # (attribute, the object, its mark when last seen)
        self._watched: list[tuple[str, Any, Any]] = []
        for name, value in vars(model).items():
            mark = _mark(value)
            if mark is not None:
                self._watched.append((name, value, mark))

    @property
    def watched(self) -> list[str]:
        """The attributes whose in-place changes are seen."""
        return [name for name, _, _ in self._watched]

    def check(self) -> None:
        """Raise SharedStateChanged naming every watched attribute changed in place
        since the last check (and take the new contents as seen: each change is
        reported once, to the session whose check found it)."""
        changed: list[str] = []
        with self._lock:
            for index, (name, value, mark) in enumerate(self._watched):
                now = _mark(value)
                if now != mark:
                    changed.append(name)
                    self._watched[index] = (name, value, now)
        if changed:
            names = ", ".join(f"self.{name}" for name in changed)
            raise SharedStateChanged(
                f"{self._cls_name}: {names} (made in load(), so shared by every session "
                f"on this replica) was changed in place during a session; with "
                f"sessions_per_replica above 1, keep per-session state in self.state, in "
                f"what a @connected hook assigns, or in the locals of inference()/run()"
            )


def _mark(value: Any) -> Any:
    """A cheap mark of `value`'s contents that an in-place change alters, or None for
    a value whose changes cannot be seen cheaply (or that cannot change)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return ("tensor", value._version)
        if isinstance(value, torch.nn.Module):
            tensors = [*value.parameters(), *value.buffers()]
            return ("module", len(tensors), sum(t._version for t in tensors))
    if isinstance(value, (list, collections.deque)):
        return ("sequence", len(value),
                tuple(map(id, itertools.islice(value, _ITEMS_LOOKED_AT))))
    if isinstance(value, dict):
        return ("dict", len(value), tuple(
            (id(k), id(v)) for k, v in itertools.islice(value.items(), _ITEMS_LOOKED_AT)))
    if isinstance(value, bytearray):
        return ("bytes", len(value), hash(bytes(value[:_ITEMS_LOOKED_AT * 64])))
    if isinstance(value, set):
        return ("set", len(value))
    return None
