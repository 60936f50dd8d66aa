"""The order in which a model with seats offers Serve its replicas (no Ray cluster)."""

from __future__ import annotations

from reactor_serve.serve.seat_router import SeatPackingRouter, age_keys, packing_order


def test_the_oldest_replica_with_a_free_seat_comes_first_then_the_full_ones() -> None:
    seats = {name: 4 for name in "abcde"}
    used = {"a": 0, "b": 3, "c": 4, "d": 1, "e": None}
    seen = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    # Not the fullest first: "b" is fuller than "a", but "a" is older.
    assert packing_order(used, seats, seen) == ["a", "b", "d", "e", "c"]


def test_a_busy_newest_replica_gets_no_session_while_an_older_one_has_a_seat() -> None:
    # Serve stops the newest first: sending sessions to a busy young replica would
    # keep it busy while the old one idles, and the policy could then stop neither.
    seats = {"old": 2, "new": 2}
    assert packing_order({"old": 0, "new": 1}, seats, {"old": 0, "new": 1}) == ["old", "new"]
    assert packing_order({"new": 1, "old": 0}, seats, {"old": 0, "new": 1}) == ["old", "new"]


def test_replicas_of_one_age_keep_their_order() -> None:
    seats = {"x": 2, "y": 2, "z": 2}
    assert packing_order({"x": 1, "y": 0, "z": 1}, seats) == ["x", "y", "z"]
    assert packing_order({"y": 1, "x": 1, "z": 0}, seats) == ["y", "x", "z"]


def test_a_replica_at_its_seats_is_tried_last_since_the_count_may_be_stale() -> None:
    assert packing_order({"full": 2, "idle": 0}, {"full": 2, "idle": 2},
                         {"full": 0, "idle": 1}) == ["idle", "full"]


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


def test_replicas_are_aged_by_when_they_started_whatever_order_a_router_first_saw_them() -> None:
    # A router that first routes once both replicas run (another ingress replica's) may
    # see them in any order: their own start times settle which is the oldest. One that
    # has not reported yet is the newest.
    keys = age_keys({"new": 200.0, "quiet": None, "old": 100.0}, {"new": 0, "old": 1, "quiet": 2})
    used, seats = {"new": 1, "quiet": 0, "old": 1}, {"new": 2, "quiet": 2, "old": 2}
    assert packing_order(used, seats, keys) == ["old", "new", "quiet"]
