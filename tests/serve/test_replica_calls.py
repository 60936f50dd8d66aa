"""Reaching the replica that owns a session: a replica's answer, its reported error as
the protocol error it names, its silence, its death; actor lookups. No Ray runs: the
actors are fakes found through an injected lookup."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from memory_directory import MemoryDirectory

from reactor_serve.protocol.errors import (
    BackendError,
    ModelBusy,
    ModelUnavailable,
    OfferRejected,
    UnknownSession,
    ViewerLimitReached,
)
from reactor_serve.serve.replica import SERVE_ACTOR_NAMESPACE, control_call
from reactor_serve.serve.replica_calls import REPLICA_DIED, ReplicaCalls, ReplicaDied, reported_error

SESSION = "s-1"


class FakeReplica:
    """An actor whose `__ray_call__` answers what the test set."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer if answer is not None else {"ok": "value"}
        self.calls: list[tuple[Any, ...]] = []
        self.__ray_call__ = self

    def remote(self, fn: Any, *args: Any) -> Any:
        self.calls.append((fn, *args))
        if self.answer == "silent":
            return asyncio.get_running_loop().create_future()
        if isinstance(self.answer, BaseException):
            raise self.answer

        async def answered() -> Any:
            return self.answer

        return answered()


class Actors:
    def __init__(self, **actors: Any) -> None:
        self.actors = actors
        self.lookups: list[tuple[str, str]] = []

    def get(self, name: str, namespace: str) -> Any:
        self.lookups.append((name, namespace))
        if name not in self.actors:
            raise ValueError(f"Failed to look up actor with name {name!r}")
        return self.actors[name]


def placed(directory: MemoryDirectory, replica: str = "replica-1", **fields: Any) -> dict[str, Any]:
    record = {"model": "m", "state": "placed", "replica": replica, **fields}
    directory.records[SESSION] = dict(record)
    return record


async def test_a_call_runs_the_operation_on_the_replica_and_answers_its_value():
    directory, replica = MemoryDirectory(), FakeReplica({"ok": {"state": "live"}})
    actors = Actors(**{"replica-1": replica})
    calls = ReplicaCalls(directory, get_actor=actors.get)

    value = await calls.call(SESSION, placed(directory), "get", {"x": 1})

    assert value == {"state": "live"}
    assert replica.calls == [(control_call, "get", SESSION, {"x": 1})]
    assert actors.lookups == [("replica-1", SERVE_ACTOR_NAMESPACE)]


async def test_actor_handles_are_kept_and_looked_up_in_the_records_namespace():
    directory = MemoryDirectory()
    actors = Actors(**{"replica-1": FakeReplica()})
    calls = ReplicaCalls(directory, get_actor=actors.get)
    record = placed(directory, replica_namespace="elsewhere")

    for _ in range(3):
        await calls.call(SESSION, record, "get", {})

    assert actors.lookups == [("replica-1", "elsewhere")]


async def test_the_kept_handles_are_bounded(monkeypatch):
    monkeypatch.setattr(ReplicaCalls, "MAX_CACHED_ACTORS", 2)
    directory = MemoryDirectory()
    actors = Actors(a=FakeReplica(), b=FakeReplica(), c=FakeReplica())
    calls = ReplicaCalls(directory, get_actor=actors.get)
    for name in ("a", "b", "c", "a"):
        await calls.call(SESSION, placed(directory, replica=name), "get", {})
    # "a" was dropped to keep two handles, so it is looked up again.
    assert [name for name, _ in actors.lookups] == ["a", "b", "c", "a"]


@pytest.mark.parametrize(("kind", "status", "expected"), [
    ("UnknownSession", 404, UnknownSession),
    ("OfferRejected", 400, OfferRejected),
    ("ModelBusy", 503, ModelBusy),
    ("ViewerLimitReached", 429, ViewerLimitReached),
    ("ModelUnavailable", 503, ModelUnavailable),
])
async def test_a_reported_error_is_raised_as_the_protocol_error_it_names(kind, status, expected):
    directory = MemoryDirectory()
    error = {"kind": kind, "status": status, "message": "what the replica said", "retry_after_s": 3.0}
    calls = ReplicaCalls(directory, get_actor=Actors(**{"replica-1": FakeReplica({"error": error})}).get)

    with pytest.raises(expected, match="what the replica said") as raised:
        await calls.call(SESSION, placed(directory), "offer", {})

    assert type(raised.value) is expected
    assert raised.value.retry_after_s == 3.0
    assert directory.records[SESSION]["state"] == "placed"


@pytest.mark.parametrize(("kind", "status", "expected"), [
    ("KeyError", 400, OfferRejected),  # not a protocol error: its status decides
    ("Mystery", 502, ModelUnavailable),
    (None, 404, OfferRejected),
    ("BackendError", 400, BackendError),
])
def test_an_error_the_protocol_does_not_name_follows_its_status(kind, status, expected):
    error = reported_error({"kind": kind, "status": status, "message": "m"})
    assert type(error) is expected
    assert str(error) == "m" and error.retry_after_s is None


def test_a_reported_error_without_a_status_is_the_clients_fault():
    assert type(reported_error({"message": "m"})) is OfferRejected


async def test_a_replica_that_is_gone_ends_the_session():
    directory = MemoryDirectory()
    calls = ReplicaCalls(directory, get_actor=Actors().get)

    with pytest.raises(ReplicaDied):
        await calls.call(SESSION, placed(directory), "get", {})

    record = directory.records[SESSION]
    assert record["state"] == "ended"
    assert record["end_reason"] == "error" and record["end_message"] == REPLICA_DIED


async def test_a_replica_that_dies_during_the_call_ends_the_session():
    from ray.exceptions import RayActorError

    directory = MemoryDirectory()
    replica = FakeReplica(RayActorError())
    calls = ReplicaCalls(directory, get_actor=Actors(**{"replica-1": replica}).get)

    with pytest.raises(ReplicaDied):
        await calls.call(SESSION, placed(directory), "get", {})
    assert directory.records[SESSION]["end_message"] == REPLICA_DIED


async def test_a_replica_that_does_not_answer_is_unavailable_for_now(monkeypatch):
    # The product's call timeout, made short: the silent replica never answers, so no
    # machine's speed changes the outcome.
    monkeypatch.setattr(ReplicaCalls, "TIMEOUT_S", 0.01)
    directory = MemoryDirectory()
    calls = ReplicaCalls(directory, get_actor=Actors(**{"replica-1": FakeReplica("silent")}).get)

    with pytest.raises(ModelUnavailable, match=f"session {SESSION} did not answer") as raised:
        await calls.call(SESSION, placed(directory), "get", {})

    assert raised.value.retry_after_s == 1.0
    # Slow is not dead: the session goes on.
    assert directory.records[SESSION]["state"] == "placed"


async def test_actor_alive_asks_afresh_each_time():
    actors = Actors(**{"ingress-b": object()})
    calls = ReplicaCalls(MemoryDirectory(), get_actor=actors.get)

    assert await calls.actor_alive("ingress-b", "ns")
    assert await calls.actor_alive("ingress-b", "ns")
    assert not await calls.actor_alive("ingress-c", "ns")
    assert actors.lookups == [("ingress-b", "ns"), ("ingress-b", "ns"), ("ingress-c", "ns")]
