"""A queued session's position, as two ingress replicas sharing one session directory
see it, with their steps interleaved by hand. No Ray: the directory is in memory and
the model's deployment handle is a slot call the test answers, so each interleaving
is exact instead of a timing that a loaded machine may or may not hit."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from reactor_serve.protocol.errors import OfferRejected
from reactor_serve.serve import ingress_sessions
from reactor_serve.serve.ingress_sessions import IngressSessions
from reactor_serve.sessions.contract import SessionState

MODEL = "gradient"


class SharedDirectory:
    """SessionDirectory's interface over dicts. Writes can be held back, as a slow GCS
    holds back an ingress replica's writes while other replicas keep reading."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.positions: dict[str, dict[str, Any]] = {}
        self._writes_open = asyncio.Event()
        self._writes_open.set()
        self._stall_once_waiting = False

    def stall_writes_once_a_session_waits(self) -> None:
        self._stall_once_waiting = True

    async def _write(self) -> None:
        await self._writes_open.wait()

    async def put(self, session_id: str, record: dict[str, Any]) -> None:
        await self._write()
        self.records[session_id] = dict(record)
        if self._stall_once_waiting and record.get("state") == SessionState.WAITING:
            self._writes_open.clear()

    async def get(self, session_id: str) -> dict[str, Any] | None:
        record = self.records.get(session_id)
        return dict(record) if record is not None else None

    async def update(self, session_id: str, **fields: Any) -> dict[str, Any] | None:
        await self._write()
        if session_id not in self.records:
            return None
        self.records[session_id].update(fields)
        return dict(self.records[session_id])

    async def end(self, session_id: str, reason: str, message: str | None) -> None:
        await self._write()
        record = self.records.get(session_id)
        if record is not None and record["state"] != SessionState.ENDED:
            record.update(state=SessionState.ENDED, end_reason=reason, end_message=message,
                          ended_at=time.time())

    async def put_position(self, session_id: str, position: int, eta_s: float | None) -> None:
        await self._write()
        self.positions[session_id] = {"position": position, "eta_s": eta_s}

    async def position(self, session_id: str) -> dict[str, Any]:
        return dict(self.positions.get(session_id, {}))

    async def drop_position(self, session_id: str) -> None:
        await self._write()
        self.positions.pop(session_id, None)

    async def model_settings(self, name: str) -> dict[str, Any]:
        return {"admission_timeout_s": 60.0}

    def release(self) -> None:
        self._writes_open.set()


class FullModel:
    """The model's deployment handle with its one replica busy: the slot call waits
    until the test answers it."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self._first: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.session = SimpleNamespace(remote=self._remote)

    def options(self, **_: Any) -> FullModel:
        return self

    def _remote(self, request: dict[str, Any]) -> FullModel:
        self.called.set()
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._first

    def cancel(self) -> None:
        self._first.cancel()

    def answer(self, message: dict[str, Any]) -> None:
        self._first.set_result(message)


class LiveHolders:
    """`ray.get_actor` for the holder check: which ingress replicas are alive. A check
    can be held at the point where the asking replica has read the record but not yet
    the position."""

    def __init__(self, *alive: str) -> None:
        self.alive = set(alive)
        self.asked = threading.Event()
        self.go_on = threading.Event()
        self.go_on.set()

    def get_actor(self, name: str, namespace: str | None = None) -> object:
        self.asked.set()
        self.go_on.wait(10)
        if name not in self.alive:
            raise ValueError(name)
        return object()


@pytest.fixture
def holders(monkeypatch) -> LiveHolders:
    import ray

    live = LiveHolders("ingress-a")
    monkeypatch.setattr(ray, "get_actor", live.get_actor)
    return live


@pytest.fixture
async def ingresses(monkeypatch):
    """Ingress replicas `ingress-a` and `ingress-b` over one directory and one model."""
    directory = SharedDirectory()
    model = FullModel()
    made: list[IngressSessions] = []

    def ingress(name: str) -> IngressSessions:
        # The actor name Serve gives a replica; asking Ray for it outside one would
        # start a Ray instance.
        monkeypatch.setattr(ingress_sessions, "_own_actor_name", lambda: name)
        backend = IngressSessions(SimpleNamespace(name=MODEL), model, directory, [])
        made.append(backend)
        return backend

    yield directory, model, ingress("ingress-a"), ingress("ingress-b")
    directory.release()
    tasks = [t for b in made for t in (*b._admissions.values(), *b._background)]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def new_session(directory: SharedDirectory) -> str:
    session_id = f"s-{len(directory.records)}"
    await directory.put(session_id, {"model": MODEL, "created_at": time.time(), "extra_args": {},
                                     "client": "c", "state": SessionState.CREATED, "next_cid": 1})
    return session_id


async def queue_status(ingress: IngressSessions, session_id: str) -> dict[str, Any]:
    return (await ingress.poll_answer(session_id, None)).status


async def test_a_poll_right_after_the_offer_gets_the_position_from_either_ingress_replica(
        ingresses, holders):
    directory, _, a, b = ingresses
    session_id = await new_session(directory)
    # A's writes stall the moment the record says the session waits: whatever A
    # publishes after that is not there yet for a poll.
    directory.stall_writes_once_a_session_waits()

    await a.submit_offer(session_id, "v=0", [], None)

    for ingress in (a, b):
        status = await queue_status(ingress, session_id)
        assert status["status"] == "queued"
        assert status["position"] == 1


async def test_a_poll_that_read_the_wait_just_before_it_ended_still_gets_the_position(
        ingresses, holders):
    directory, model, a, b = ingresses
    session_id = await new_session(directory)
    await a.submit_offer(session_id, "v=0", [], None)
    await model.called.wait()
    admission = a._admissions[session_id]

    # B has read the record (waiting, held by A) and asks whether A is alive...
    holders.go_on.clear()
    poll = asyncio.create_task(queue_status(b, session_id))
    assert await asyncio.to_thread(holders.asked.wait, 10)
    # ...while A's wait ends, and everything A does about it lands.
    model.answer({"type": "rejected", "kind": "OfferRejected", "status": 400,
                  "detail": "the offer has no video"})
    await admission
    await asyncio.gather(*a._background)
    holders.go_on.set()

    status = await poll
    assert status["status"] == "queued"
    assert status["position"] == 1
    # The next poll learns how the wait ended.
    with pytest.raises(OfferRejected, match="no video"):
        await b.poll_answer(session_id, None)
