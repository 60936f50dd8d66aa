"""The order in which a model with seats offers Serve its replicas (no Ray cluster)."""

from __future__ import annotations

from reactor_serve.serve.seat_router import SeatPackingRouter, packing_order


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


def test_among_equally_full_replicas_the_longest_known_comes_first() -> None:
    # Serve stops the newest replicas first: sessions go to the old ones.
    seats = {name: 2 for name in ("new", "old", "mid", "busy_new", "busy_old")}
    used = {"new": 0, "old": 0, "mid": 0, "busy_new": 1, "busy_old": 1}
    seen = {"old": 0, "busy_old": 1, "mid": 2, "busy_new": 3, "new": 4}
    assert packing_order(used, seats, seen) == ["busy_old", "busy_new", "old", "mid", "new"]


async def test_the_router_remembers_the_order_it_first_saw_replicas_in() -> None:
    router = SeatPackingRouter.__new__(SeatPackingRouter)
    router.initialize_state()
    assert router._ages(["a", "b"]) == {"a": 0, "b": 1}
    # A replica that came up later is younger, whatever order Serve lists them in.
    assert router._ages(["c", "b", "a"]) == {"a": 0, "b": 1, "c": 2}
    # Gone replicas are forgotten once they pile up; the live keep their places.
    for n in range(40):
        router._ages(["a", "c", f"gone{n}"])
    ages = router._ages(["a", "c"])
    assert ages["a"] == 0 and ages["c"] == 2 and len(ages) <= 4 * 3 + 16
