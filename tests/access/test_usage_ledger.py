"""UsageLedger and the usage report against SQLite and a real PostgreSQL: intervals
per state, frames per interval, a wait at the ingress followed by the replica's
states, changes kept and retried while the database is down, and intervals a crash
left open closed at their last heartbeat."""

import threading
import time

import pytest
from sqlalchemy import text

from reactor_serve.access.database import DatabaseError, open_database
from reactor_serve.access.deployment_secret import DeploymentSecret
from reactor_serve.access.grants import SessionOwner
from reactor_serve.access.key_store import KeyStore
from reactor_serve.access.usage_ledger import UsageLedger
from reactor_serve.access.usage_report import usage

T0 = 1_700_000_000.0


@pytest.fixture
def database(database_url):
    database = open_database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def owned(database):
    store = KeyStore(database, DeploymentSecret("s" * 48), clock=lambda: T0)
    store.record_owner("s1", SessionOwner("a" * 16, "t1"), "gradient")
    store.record_owner("s2", SessionOwner("b" * 16, "t2"), "world")
    return store


def report(database, **kwargs):
    return {(row["key_id"], row["model"]): row
            for row in usage(database, start=T0 - 100, end=T0 + 1000, now=T0 + 1000, **kwargs)}


def test_a_session_s_states_become_intervals(database, owned):
    ledger = UsageLedger(database)
    events = [("created", 0, 0), ("waiting", 1, 0), ("streaming", 2, 0),
              ("orphaned", 12, 300), ("streaming", 15, 300), ("ended", 20, 450)]
    for state, at, frames in events:
        ledger.session_state("s1", state, T0 + at, reason="client_closed" if state == "ended"
                             else None, frames=frames)
    assert ledger.flush()
    [row] = report(database).values()
    assert row == {"key_id": "a" * 16, "model": "gradient", "sessions": 1,
                   "waiting_s": 2.0, "ready_s": 15.0, "orphaned_s": 3.0, "replica_s": 20.0,
                   "frames": 450}
    ledger.close()
    with database.begin() as connection:
        ended = connection.execute(text(
            "SELECT ended_at, end_reason FROM session_owners WHERE session_id='s1'")).one()
    assert tuple(ended) == (T0 + 20, "client_closed")


def test_a_wait_at_the_ingress_holds_no_replica(database, owned):
    ingress = UsageLedger(database, holds_slot=False)
    replica = UsageLedger(database)
    ingress.session_state("s2", "waiting", T0)
    assert ingress.flush()
    replica.session_state("s2", "created", T0 + 4)
    replica.session_state("s2", "streaming", T0 + 5)
    replica.session_state("s2", "ended", T0 + 10, reason="client_closed")
    assert replica.flush()
    # The ingress's copy of the end (its directory) changes nothing more.
    ingress.session_state("s2", "ended", T0 + 11, reason="client_closed")
    assert ingress.flush()
    [row] = report(database).values()
    assert (row["waiting_s"], row["ready_s"], row["replica_s"]) == (5.0, 5.0, 6.0)
    ingress.close()
    replica.close()


def test_changes_out_of_order_across_processes_still_tile_the_session(database, owned):
    replica, ingress = UsageLedger(database), UsageLedger(database, holds_slot=False)
    replica.session_state("s2", "streaming", T0 + 5)
    assert replica.flush()
    ingress.session_state("s2", "waiting", T0)  # written late
    assert ingress.flush()
    replica.session_state("s2", "ended", T0 + 9)
    assert replica.flush()
    [row] = report(database).values()
    assert (row["waiting_s"], row["ready_s"]) == (5.0, 4.0)
    replica.close()
    ingress.close()


class Flaky:
    """The database, refusing every transaction while `down` is set."""

    def __init__(self, database):
        self.database = database
        self.down = threading.Event()
        self.refused = 0

    def begin(self):
        if self.down.is_set():
            self.refused += 1
            raise DatabaseError("database test: connection refused")
        return self.database.begin()


def test_nothing_is_lost_while_the_database_is_down(database, owned):
    flaky = Flaky(database)
    ledger = UsageLedger(flaky, retry_s=0.05)
    flaky.down.set()
    ledger.session_state("s1", "streaming", T0)
    ledger.session_state("s1", "ended", T0 + 30, reason="client_closed")
    # A negative check: with the database down nothing can be flushed in any time.
    assert not ledger.flush(timeout=0.5)
    # How many retries fit in that half second is the machine's business: wait for
    # the ledger to have retried rather than count on it.
    deadline = time.monotonic() + 60
    while flaky.refused < 2:
        assert time.monotonic() < deadline, f"the ledger did not retry: {flaky.refused} tries"
        time.sleep(0.01)  # the poll interval; the deadline is the bound
    flaky.down.clear()
    assert ledger.flush(timeout=60), "the ledger did not flush once the database was back"
    [row] = report(database).values()
    assert row["ready_s"] == 30.0
    ledger.close()


def test_intervals_a_crash_left_open_close_at_their_last_heartbeat(database, owned):
    clock = [T0]
    crashed = UsageLedger(database, heartbeat_s=0.05, clock=lambda: clock[0])
    crashed.session_state("s1", "streaming", T0)
    assert crashed.flush()
    clock[0] = T0 + 42
    deadline = time.monotonic() + 60
    while seen_at(database, "s1") != T0 + 42:
        assert time.monotonic() < deadline, "no heartbeat renewed the interval at T0 + 42"
        time.sleep(0.05)  # the poll interval; the deadline is the bound
    # The process stops renewing (its last beat at T0 + 42) and never writes the end.
    crashed.close()
    restarted = UsageLedger(database)
    assert restarted.close_abandoned(lambda sid: sid != "s1") == 1
    assert restarted.close_abandoned(lambda sid: False) == 0
    [row] = report(database).values()
    assert row["ready_s"] == 42.0
    restarted.close()


def seen_at(database, session_id):
    with database.begin() as connection:
        return connection.execute(text(
            "SELECT seen_at FROM usage_intervals WHERE session_id = :sid"),
            {"sid": session_id}).scalar_one()


def test_two_ledgers_racing_on_one_session_never_leave_two_intervals_open(database, owned):
    """The ingress's wait and the replica's first state, written at once by two
    ledgers: each change must read what the other wrote (SQLite's immediate
    transactions, PostgreSQL's per-session advisory lock)."""
    store = owned
    queue_side, slot_side = UsageLedger(database, holds_slot=False), UsageLedger(database)
    for index in range(20):
        sid = f"race-{index}"
        store.record_owner(sid, SessionOwner("a" * 16, "t"), "gradient")
        queue_side.session_state(sid, "waiting", T0 + index * 10)
        slot_side.session_state(sid, "created", T0 + index * 10 + 0.001)
    assert queue_side.flush() and slot_side.flush()
    for index in range(20):
        slot_side.session_state(f"race-{index}", "ended", T0 + index * 10 + 5)
    assert slot_side.flush()
    with database.begin() as connection:
        still_open = connection.execute(text(
            "SELECT count(*) FROM usage_intervals WHERE ended_at IS NULL")).scalar_one()
        total = connection.execute(text(
            "SELECT sum(ended_at - started_at) FROM usage_intervals "
            "WHERE session_id LIKE 'race-%'")).scalar_one()
    assert still_open == 0
    assert total == pytest.approx(20 * 5.0, abs=1e-6)
    queue_side.close()
    slot_side.close()
