"""The order in which a model with seats offers Serve its replicas (no Ray cluster)."""

from __future__ import annotations

from reactor_serve.serve.seat_router import SeatPackingRouter, age_keys, packing_order


def test_the_oldest_replica_comes_first_whatever_the_seats_in_use() -> None:
    # Not the fullest first, nor the emptiest: Serve passes over a full one at its rank.
    seen = {"a": 3, "b": 1, "c": 0, "d": 4, "e": 2}
    assert packing_order(list("abcde"), seen) == ["c", "b", "e", "a", "d"]


def test_a_busy_newest_replica_comes_after_an_older_one() -> None:
    # Serve stops the newest first: sending sessions to a busy young replica would
    # keep it busy while the old one idles, and the policy could then stop neither.
    assert packing_order(["old", "new"], {"old": 0, "new": 1}) == ["old", "new"]
    assert packing_order(["new", "old"], {"old": 0, "new": 1}) == ["old", "new"]


def test_replicas_of_one_age_or_none_keep_their_order() -> None:
    assert packing_order(["x", "y", "z"]) == ["x", "y", "z"]
    assert packing_order(["y", "x", "z"]) == ["y", "x", "z"]
    assert packing_order(["y", "x", "z"], {"z": 0}) == ["z", "y", "x"]


async def test_an_old_replica_the_cache_counts_full_keeps_its_rank() -> None:
    # Its sessions may have ended through another ingress replica's router: Serve
    # probes a replica its cache counts as full at its rank, so the old one is asked
    # afresh before a younger replica gets the session (CI met the younger getting it).
    from types import SimpleNamespace

    router = SeatPackingRouter.__new__(SeatPackingRouter)
    router.initialize_state()
    # This router's cache: the old replica at its two seats (stale), the new at one.
    counts = {"old": 2, "new": 1}
    router._replica_queue_len_cache = SimpleNamespace(get=counts.get)
    old = SimpleNamespace(replica_id="old", max_ongoing_requests=2,
                          routing_stats={"started_at": 100.0})
    new = SimpleNamespace(replica_id="new", max_ongoing_requests=2,
                          routing_stats={"started_at": 200.0})
    ranks = await router.choose_replicas([new, old])
    assert [[r.replica_id for r in rank] for rank in ranks] == [["old"], ["new"]]


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
    assert packing_order(["new", "quiet", "old"], keys) == ["old", "new", "quiet"]
