"""`CommandQueue`: commands waiting for the model, where the newest value of a field wins.

A generated `set_<field>` command is idempotent: only the last value sent matters. So
a setter put while an older one of the same field still waits replaces it (the older
is handed back as superseded, to be counted and forgotten) and the queue never holds
more than one setter per field. Events are not idempotent: each is kept, and bounding
them is the caller's rule (`ModelHost.MAX_QUEUED_COMMANDS`).

The replacement goes to the back of the queue, not into the place of the value it
replaced: an event sent before the newest value must not see it, so the value applies
after every command the client sent before it. An event sent between two values of a
field sees the field's older value (neither of the two): coalescing gives up only
values that were never going to last.

Not thread-safe: each owner guards it with the lock it already holds.
"""

from __future__ import annotations

import collections
import itertools
from typing import Generic, Hashable, Iterator, TypeVar

__all__ = ["CommandQueue"]

T = TypeVar("T")


class CommandQueue(Generic[T]):
    """Items in arrival order; those put with a `key` coalesce with the waiting item
    of the same key."""

    def __init__(self) -> None:
        self._items: collections.OrderedDict[Hashable, T] = collections.OrderedDict()
        # Unkeyed items get a key no keyed item can have.
        self._seq = itertools.count()
        self.coalesced = 0  # items superseded so far

    def put(self, item: T, key: Hashable | None = None) -> T | None:
        """Queue `item`; returns the item it superseded (same `key`), else None."""
        if key is None:
            self._items[(_Unkeyed, next(self._seq))] = item
            return None
        superseded = self._items.pop(key, None)
        self._items[key] = item
        if superseded is not None:
            self.coalesced += 1
        return superseded

    def popleft(self) -> T:
        """The oldest item; raises IndexError when empty."""
        try:
            return self._items.popitem(last=False)[1]
        except KeyError:
            raise IndexError("pop from an empty CommandQueue") from None

    def clear(self) -> list[T]:
        """Empty the queue; returns what it held."""
        items = list(self._items.values())
        self._items.clear()
        return items

    def __contains__(self, key: Hashable) -> bool:
        """Whether an item put with `key` waits."""
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))


class _Unkeyed:
    """Marks the keys of unkeyed items."""
