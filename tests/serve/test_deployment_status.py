"""What the ingress tells of a model's deployment: its capacity, whether it can take
sessions, its admission timeout, each from a reading reused for `TTL_S`. Serve's
status is a fake the test sets, the directory is in memory, the clock is fake."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from memory_directory import MemoryDirectory

from reactor_serve.protocol.errors import ModelUnavailable
from reactor_serve.serve.deployment_status import (
    DeploymentStatus,
)

MODEL = "gradient"


class FakeServe:
    """Serve's status of the deployment: None until the test sets one."""

    def __init__(self) -> None:
        self.overview: Any = None
        self.reads = 0

    def set(self, status: str = "HEALTHY", message: str = "", **replica_states: int) -> None:
        self.overview = SimpleNamespace(status=status, message=message,
                                        replica_states=dict(replica_states))

    async def read(self) -> Any:
        self.reads += 1
        return self.overview


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> SimpleNamespace:
    directory = MemoryDirectory({"max_replicas": 4})
    serve, clock = FakeServe(), FakeClock()
    status = DeploymentStatus(MODEL, directory, admission_timeout_s=30.0, read_status=serve.read,
                              clock=clock)
    return SimpleNamespace(status=status, directory=directory, serve=serve, clock=clock)


def add_sessions(directory: MemoryDirectory, replica: str | None = None, **counts: int) -> None:
    """Sessions in each state; placed ones on `replica`, else each on a replica of its own."""
    for state, count in counts.items():
        for _ in range(count):
            n = len(directory.records)
            directory.records[f"s{n}"] = {"model": MODEL, "state": state,
                                         "replica": replica or f"r{n}"}
    directory.records["other"] = {"model": "another-model", "state": "placed"}


async def test_capacity_counts_replicas_from_serve_and_sessions_from_the_directory(parts):
    parts.serve.set(RUNNING=3, STARTING=1, RECOVERING=1, STOPPING=2)
    add_sessions(parts.directory, placed=2, waiting=5, ended=4)

    assert await parts.status.capacity() == {
        "replicas": 3, "starting": 2, "busy": 2, "free": 1, "waiting": 5, "max_replicas": 4,
        "seats_per_replica": 1, "seats_used": 2, "seats_free": 1,
    }
    # A wait older than the admission timeout (and one reading's age) holds nothing.
    assert parts.directory.max_wait_asked == 30.0 + DeploymentStatus.TTL_S


async def test_with_seats_a_replica_is_busy_once_every_seat_is_held(parts):
    parts.directory.settings = {**parts.directory.settings, "sessions_per_replica": 3}
    parts.serve.set(RUNNING=3)
    add_sessions(parts.directory, replica="full", placed=3)
    add_sessions(parts.directory, replica="half", placed=1)
    assert await parts.status.capacity() == {
        "replicas": 3, "starting": 0, "busy": 1, "free": 2, "waiting": 0, "max_replicas": 4,
        "seats_per_replica": 3, "seats_used": 4, "seats_free": 5,
    }


async def test_busy_never_exceeds_the_running_replicas(parts):
    # Records that outlived their replicas do not make up busy replicas.
    parts.serve.set(RUNNING=1)
    add_sessions(parts.directory, placed=3)
    capacity = await parts.status.capacity()
    assert capacity["busy"] == 1 and capacity["free"] == 0


async def test_without_serve_status_the_replica_counts_are_unknown(parts):
    parts.directory.settings = {}
    add_sessions(parts.directory, placed=1, waiting=2)
    assert await parts.status.capacity() == {
        "replicas": None, "starting": None, "busy": 1, "free": None, "waiting": 2,
        "max_replicas": None, "seats_per_replica": 1, "seats_used": 1, "seats_free": None,
    }


async def test_readings_are_reused_for_their_ttl(parts):
    parts.serve.set(RUNNING=1)
    await parts.status.capacity()
    parts.serve.set(RUNNING=5)
    add_sessions(parts.directory, placed=1)

    parts.clock.now += DeploymentStatus.TTL_S
    assert (await parts.status.capacity())["replicas"] == 1
    assert parts.serve.reads == 1 and parts.directory.count_reads == 1

    parts.clock.now += 0.01
    capacity = await parts.status.capacity()
    assert capacity["replicas"] == 5 and capacity["busy"] == 1
    assert parts.serve.reads == 2 and parts.directory.count_reads == 2


@pytest.mark.parametrize("status", ["DEPLOY_FAILED", "UNHEALTHY", "DeploymentStatus.DEPLOY_FAILED"])
async def test_a_failed_deployment_with_no_running_replica_is_the_problem(parts, status):
    parts.serve.set(status, "RuntimeError: load() failed: no weights\n  Traceback ...", RUNNING=0)

    problem = await parts.status.problem()

    assert problem == f"model {MODEL!r} is not available: RuntimeError: load() failed: no weights"
    with pytest.raises(ModelUnavailable, match="no weights") as raised:
        await parts.status.check_available()
    assert raised.value.retry_after_s == 5.0


async def test_a_failed_deployment_without_a_message_names_its_status(parts):
    parts.serve.set("UNHEALTHY", "", RUNNING=0)
    assert await parts.status.problem() == f"model {MODEL!r} is not available: UNHEALTHY"


@pytest.mark.parametrize("overview", [
    None,  # outside Serve, or the controller is busy: let the session try
    ("UNHEALTHY", 1),  # one replica still runs sessions
    ("UPDATING", 0),  # replicas are coming
    ("HEALTHY", 2),
])
async def test_no_problem_while_a_session_could_still_run(parts, overview):
    if overview is not None:
        parts.serve.set(overview[0], "boom", RUNNING=overview[1])
    assert await parts.status.problem() is None
    await parts.status.check_available()


async def test_the_admission_timeout_is_the_apps_whatever_the_replicas_published():
    # A model scaled to zero: its first session waits for a replica to start, and the
    # app set how long that may take; a replica's older publication does not change it.
    scaled_to_zero = DeploymentStatus(MODEL, MemoryDirectory({}), admission_timeout_s=240.0,
                                      read_status=FakeServe().read)
    assert await scaled_to_zero.admission_timeout_s() == 240.0
    published = DeploymentStatus(MODEL, MemoryDirectory({"admission_timeout_s": 30.0}),
                                 admission_timeout_s=240.0, read_status=FakeServe().read)
    assert await published.admission_timeout_s() == 240.0


async def test_a_directory_that_fails_reads_as_no_settings_and_no_sessions(parts):
    class Unreachable(MemoryDirectory):
        async def model_settings(self, name: str) -> dict[str, Any]:
            raise ConnectionError("the GCS did not answer")

        async def session_counts(self, model: str, *, max_wait_s: float | None = None):
            raise ConnectionError("the GCS did not answer")

    status = DeploymentStatus(MODEL, Unreachable(), admission_timeout_s=60.0,
                              read_status=FakeServe().read)
    assert await status.settings() == {}
    capacity = await status.capacity()
    assert capacity["busy"] == 0 and capacity["waiting"] == 0
