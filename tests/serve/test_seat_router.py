"""The order in which a model with seats offers Serve its replicas (no Ray cluster)."""

from __future__ import annotations

from reactor_serve.serve.seat_router import packing_order


def test_the_fullest_replica_with_a_free_seat_comes_first_then_idle_then_full() -> None:
    seats = {name: 4 for name in "abcde"}
    used = {"a": 0, "b": 3, "c": 4, "d": 1, "e": None}
    assert packing_order(used, seats) == ["b", "d", "a", "e", "c"]


def test_equally_full_replicas_keep_their_order() -> None:
    seats = {"x": 2, "y": 2, "z": 2}
    assert packing_order({"x": 1, "y": 1, "z": 0}, seats) == ["x", "y", "z"]
    assert packing_order({"y": 1, "x": 1, "z": 0}, seats) == ["y", "x", "z"]


def test_a_replica_at_its_seats_is_tried_last_since_the_count_may_be_stale() -> None:
    assert packing_order({"full": 2, "idle": 0}, {"full": 2, "idle": 2}) == ["idle", "full"]
