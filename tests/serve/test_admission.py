"""The admission queue: first a queued session's position as two ingress replicas
sharing one session directory see it, with their steps interleaved by hand; then one
replica's `AdmissionQueue` alone (positions, ETA, how a wait ends, holders). No Ray:
the directory is in memory and the model's deployment handle is a slot call the test
answers, so each interleaving is exact instead of a timing that a loaded machine may
or may not hit."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from memory_directory import MemoryDirectory

from reactor_serve.protocol.errors import ModelUnavailable, OfferRejected
from reactor_serve.serve.admission import AdmissionQueue, AdmissionTimeout, admission_error
from reactor_serve.serve.ingress_sessions import IngressSessions
from reactor_serve.serve.replica import SERVE_ACTOR_NAMESPACE
from reactor_serve.serve.replica_calls import REPLICA_DIED, ReplicaCalls
from reactor_serve.sessions.contract import SessionState

MODEL = "gradient"


class SharedDirectory(MemoryDirectory):
    """One directory for both ingress replicas. Writes can be held back, as a slow GCS
    holds back an ingress replica's writes while other replicas keep reading."""

    def __init__(self) -> None:
        super().__init__()
        self._writes_open = asyncio.Event()
        self._writes_open.set()
        self._stall_once_waiting = False

    def stall_writes_once_a_session_waits(self) -> None:
        self._stall_once_waiting = True

    async def _write(self) -> None:
        await self._writes_open.wait()

    async def put(self, session_id: str, record: dict[str, Any]) -> None:
        await super().put(session_id, record)
        if self._stall_once_waiting and record.get("state") == SessionState.WAITING:
            self._writes_open.clear()

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
    """The actor lookup for the holder check: which ingress replicas are alive. A check
    can be held at the point where the asking replica has read the record but not yet
    the position."""

    def __init__(self, *alive: str) -> None:
        self.alive = set(alive)
        self.asked = threading.Event()
        self.go_on = threading.Event()
        self.go_on.set()

    def get_actor(self, name: str, namespace: str | None = None) -> object:
        self.asked.set()
        self.go_on.wait(60)  # held until the test lets it go on; the bound only stops a hang
        if name not in self.alive:
            raise ValueError(name)
        return object()


@pytest.fixture
def holders() -> LiveHolders:
    return LiveHolders("ingress-a")


@pytest.fixture
async def ingresses(holders):
    """Ingress replicas `ingress-a` and `ingress-b` over one directory and one model."""
    directory = SharedDirectory()
    model = FullModel()
    made: list[IngressSessions] = []

    def ingress(name: str) -> IngressSessions:
        # The actor name Serve gives a replica.
        backend = IngressSessions(SimpleNamespace(name=MODEL), model, directory, [],
                                  actor_name=name, admission_timeout_s=60.0,
                                  replicas=ReplicaCalls(directory, get_actor=holders.get_actor))
        made.append(backend)
        return backend

    yield directory, model, ingress("ingress-a"), ingress("ingress-b")
    directory.release()
    tasks = [t for b in made for t in (*b.admission._waits.values(), *b.admission._background)]
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
    admission = a.admission._waits[session_id]

    # B has read the record (waiting, held by A) and asks whether A is alive...
    holders.go_on.clear()
    poll = asyncio.create_task(queue_status(b, session_id))
    assert await asyncio.to_thread(holders.asked.wait, 60), "B never asked whether A is alive"
    # ...while A's wait ends, and everything A does about it lands.
    model.answer({"type": "rejected", "kind": "OfferRejected", "status": 400,
                  "detail": "the offer has no video"})
    await admission
    await asyncio.gather(*a.admission._background)
    holders.go_on.set()

    status = await poll
    assert status["status"] == "queued"
    assert status["position"] == 1
    # The next poll learns how the wait ended.
    with pytest.raises(OfferRejected, match="no video"):
        await b.poll_answer(session_id, None)


# ---- the admission queue alone --------------------------------------------------
#
# One ingress replica's queue over an in-memory directory, a model whose slot calls
# the test answers one by one, and fake clocks: waits last exactly as long as the test
# says, with no sleeping.


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SlotCall:
    """One `session(...)` call: its messages come when the test sends them."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.cancelled = False
        self._messages: asyncio.Queue[Any] = asyncio.Queue()

    def send(self, message: dict[str, Any]) -> None:
        self._messages.put_nowait(message)

    def fail(self, exc: BaseException) -> None:
        self._messages.put_nowait(exc)

    def finish(self) -> None:
        self._messages.put_nowait(StopAsyncIteration())

    def __aiter__(self) -> SlotCall:
        return self

    async def __anext__(self) -> dict[str, Any]:
        message = await self._messages.get()
        if isinstance(message, BaseException):
            raise message
        return message

    def cancel(self) -> None:
        self.cancelled = True


class SlotModel:
    """The model's deployment handle: each slot call waits for the test."""

    def __init__(self) -> None:
        self.calls: dict[str, SlotCall] = {}
        self.session = SimpleNamespace(remote=self._remote)

    def options(self, **_: Any) -> SlotModel:
        return self

    def _remote(self, request: dict[str, Any]) -> SlotCall:
        call = self.calls[request["session_id"]] = SlotCall(request)
        return call

    async def called(self, session_id: str) -> SlotCall:
        # Loop turns until the queue's task calls; the deadline only stops a hang.
        deadline = asyncio.get_running_loop().time() + 30
        while session_id not in self.calls:
            assert asyncio.get_running_loop().time() < deadline, (
                f"the queue never called the model for {session_id}")
            await asyncio.sleep(0)
        return self.calls[session_id]


class RecordedMetric:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float, tags: dict[str, str]) -> None:
        assert tags == {"model": MODEL}
        self.values.append(value)

    def set(self, value: float, tags: dict[str, str]) -> None:
        assert tags == {"model": MODEL}
        self.values.append(value)


@pytest.fixture
async def queue_parts():
    directory = MemoryDirectory()
    model = SlotModel()
    clock, wall = FakeClock(), FakeClock(1_700_000_000.0)
    metrics = SimpleNamespace(wait=RecordedMetric(), waiting=RecordedMetric())
    alive_asked: list[tuple[str, str]] = []
    timeout = {"s": 60.0}

    async def admission_timeout_s() -> float:
        return timeout["s"]

    async def actor_alive(name: str, namespace: str) -> bool:
        alive_asked.append((name, namespace))
        return name == "ingress-b"

    queue = AdmissionQueue(MODEL, model, directory, holder_name="ingress-a",
                           admission_timeout_s=admission_timeout_s, actor_alive=actor_alive,
                           metrics=metrics, clock=clock, wall_clock=wall)
    parts = SimpleNamespace(queue=queue, directory=directory, model=model, clock=clock,
                            wall=wall, metrics=metrics, alive_asked=alive_asked, timeout=timeout)
    yield parts
    tasks = [*queue._waits.values(), *queue._background]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def waiting_session(parts: SimpleNamespace) -> str:
    session_id = await new_session(parts.directory)
    record = await parts.directory.get(session_id)
    await parts.queue.claim(session_id, record)
    record["state"] = SessionState.WAITING
    await parts.directory.put(session_id, record)
    parts.queue.admit(session_id, claimed=True)
    await parts.model.called(session_id)
    return session_id


async def settled(queue: AdmissionQueue) -> None:
    """Let what the queue does in the background (publishing positions) land: loop
    turns and the background tasks themselves, not wall time."""
    for _ in range(5):
        await asyncio.sleep(0)
        await asyncio.gather(*queue._background)


async def test_a_claim_names_this_replica_the_holder_and_publishes_the_next_position(queue_parts):
    parts = queue_parts
    first = await waiting_session(parts)
    second = await new_session(parts.directory)
    record = await parts.directory.get(second)

    await parts.queue.claim(second, record)

    assert record["holder"] == "ingress-a"
    assert record["holder_namespace"] == SERVE_ACTOR_NAMESPACE
    assert record["queued_at"] == parts.wall.now
    # The first session holds position 1; the claim publishes 2 before the record says
    # the session waits (the caller writes the record after).
    assert parts.directory.positions[second] == {"position": 2, "eta_s": None}
    assert parts.directory.records[second]["state"] == SessionState.CREATED
    assert parts.queue.holds(first) and not parts.queue.holds(second)


async def test_positions_follow_the_queue_and_are_published_as_it_moves(queue_parts):
    parts = queue_parts
    sessions = [await waiting_session(parts) for _ in range(3)]
    await settled(parts.queue)
    for index, session_id in enumerate(sessions):
        status = await parts.queue.status(session_id, parts.directory.records[session_id])
        assert status["position"] == index + 1
        assert parts.directory.positions[session_id]["position"] == index + 1

    parts.model.calls[sessions[0]].send({"type": "placed"})
    await asyncio.sleep(0)  # a loop turn, not wall time: the wait reads the reply
    await settled(parts.queue)

    assert [parts.directory.positions[s]["position"] for s in sessions[1:]] == [1, 2]
    assert parts.metrics.waiting.values[-1] == 2


async def test_the_eta_is_unknown_until_a_wait_ends_then_follows_the_recent_waits(queue_parts):
    parts = queue_parts
    first, second, third = [await waiting_session(parts) for _ in range(3)]
    assert parts.queue.eta(1) is None
    assert (await parts.queue.status(second, parts.directory.records[second]))["eta_s"] is None

    parts.clock.now += 10.0
    parts.model.calls[first].send({"type": "placed"})
    await settled(parts.queue)
    # One wait of 10 s: each place ahead costs 10 s.
    assert parts.queue.eta(1) == 10.0
    assert parts.queue.eta(3) == 30.0
    assert (await parts.queue.status(third, parts.directory.records[third]))["eta_s"] == 20.0
    assert parts.directory.positions[third] == {"position": 2, "eta_s": 20.0}

    # The second waited 30 s in all: the estimate moves toward it, weighted.
    parts.clock.now += 20.0
    parts.model.calls[second].send({"type": "placed"})
    await settled(parts.queue)
    assert parts.queue.eta(1) == 16.0  # 0.7 * 10 + 0.3 * 30
    assert parts.metrics.wait.values == [10.0, 30.0]


async def test_a_poll_elsewhere_reads_the_published_position_and_the_time_waited(queue_parts):
    parts = queue_parts
    session_id = await new_session(parts.directory)
    parts.directory.positions[session_id] = {"position": 4, "eta_s": 12.5}
    record = {**parts.directory.records[session_id], "queued_at": parts.wall.now - 7.26}

    status = await parts.queue.status(session_id, record)

    assert status == {"status": "queued", "position": 4, "eta_s": 12.5, "waited_s": 7.3}


async def test_a_wait_that_times_out_ends_the_session_with_a_503_to_retry(queue_parts):
    parts = queue_parts
    # The admission timeout under test; the test awaits the wait's end, not a time.
    parts.timeout["s"] = 0.01
    session_id = await waiting_session(parts)
    await parts.queue._waits[session_id]

    record = parts.directory.records[session_id]
    assert parts.model.calls[session_id].cancelled
    assert record["state"] == SessionState.ENDED and record["end_reason"] == "timeout"
    error = admission_error(record["admission_error"])
    assert isinstance(error, AdmissionTimeout) and error.status == 503
    # No wait has been seen yet: the default Retry-After.
    assert error.retry_after_s == AdmissionQueue.DEFAULT_RETRY_AFTER_S
    assert "0.01 s" in str(error)
    assert parts.queue._queue == [] and not parts.queue.holds(session_id)
    # The position stays until the directory deletes the record.
    assert session_id in parts.directory.positions


async def test_a_replica_that_declines_the_session_ends_it_with_its_own_error(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)

    parts.model.calls[session_id].send({"type": "rejected", "kind": "OfferRejected", "status": 400,
                                        "detail": "the offer has no video"})
    await parts.queue._waits[session_id]

    record = parts.directory.records[session_id]
    assert record["state"] == SessionState.ENDED and record["end_reason"] == "error"
    assert record["end_message"] == "the offer has no video"
    error = admission_error(record["admission_error"])
    assert isinstance(error, OfferRejected) and "no video" in str(error)


async def test_a_session_placed_elsewhere_is_left_to_that_call(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)
    parts.model.calls[session_id].send({"type": "placed_elsewhere"})
    await parts.queue._waits[session_id]
    assert parts.directory.records[session_id]["state"] == SessionState.WAITING
    assert parts.queue._queue == []


async def test_the_holder_watches_a_placed_session_and_learns_when_its_replica_dies(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)
    call = parts.model.calls[session_id]
    call.send({"type": "placed"})
    call.send({"type": "streaming"})
    await settled(parts.queue)
    assert parts.queue.holds(session_id)

    call.fail(RuntimeError("actor died"))
    await parts.queue._waits[session_id]

    record = parts.directory.records[session_id]
    assert record["state"] == SessionState.ENDED
    assert record["end_message"] == REPLICA_DIED


async def test_a_call_that_fails_before_placement_says_so(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)
    parts.model.calls[session_id].fail(RuntimeError("no route"))
    await parts.queue._waits[session_id]
    assert parts.directory.records[session_id]["end_message"] == (
        "the session could not be placed: RuntimeError"
    )


async def test_an_unclaimed_wait_names_this_replica_in_the_record(queue_parts):
    parts = queue_parts
    session_id = await new_session(parts.directory)
    parts.directory.records[session_id].update(state=SessionState.WAITING, holder="gone")

    parts.queue.admit(session_id)
    await parts.model.called(session_id)

    record = parts.directory.records[session_id]
    assert record["holder"] == "ingress-a" and record["queued_at"] == parts.wall.now
    # Admitting a session already held here starts no second call.
    call = parts.model.calls[session_id]
    parts.queue.admit(session_id)
    # A negative check after a loop turn: a second call would have started in it.
    await asyncio.sleep(0)
    assert parts.model.calls[session_id] is call


async def test_cancel_gives_the_wait_up_and_leaves_the_queue(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)
    task = parts.queue._waits[session_id]

    parts.queue.cancel(session_id)
    with pytest.raises(asyncio.CancelledError):
        await task

    assert parts.queue._queue == [] and not parts.queue.holds(session_id)
    parts.queue.cancel("never-held")  # nothing to cancel: no error


async def test_whether_a_holder_is_alive(queue_parts):
    parts = queue_parts
    session_id = await waiting_session(parts)
    queue = parts.queue

    assert not await queue.holder_alive(session_id, {})
    # This replica: whether it holds the wait, without asking Ray.
    assert await queue.holder_alive(session_id, {"holder": "ingress-a"})
    assert not await queue.holder_alive("other", {"holder": "ingress-a"})
    assert parts.alive_asked == []
    # Another replica: asked by name, in the namespace the record gives.
    assert await queue.holder_alive(session_id, {"holder": "ingress-b", "holder_namespace": "ns"})
    assert not await queue.holder_alive(session_id, {"holder": "ingress-c"})
    assert parts.alive_asked == [("ingress-b", "ns"), ("ingress-c", SERVE_ACTOR_NAMESPACE)]


def test_an_admission_error_of_an_unknown_kind_follows_its_status():
    busy = admission_error({"kind": "Mystery", "status": 503, "message": "m", "retry_after_s": 2.0})
    assert isinstance(busy, ModelUnavailable) and busy.retry_after_s == 2.0
    assert isinstance(admission_error({"kind": "Mystery", "status": 409, "message": "m"}),
                      OfferRejected)


class ReadModifyWriteDirectory(MemoryDirectory):
    """`update` as the GCS-backed directory does it: read the record, then write it
    whole, with the loop free in between (each GCS call is a thread hop)."""

    async def get(self, session_id: str) -> dict[str, Any] | None:
        # Frees the loop as a GCS hop does, so the callers interleave; the outcome must
        # not depend on how long the hop takes, and nothing asserts on it.
        await asyncio.sleep(0.005)
        return await super().get(session_id)

    async def update(self, session_id: str, **fields: Any) -> dict[str, Any] | None:
        record = await self.get(session_id)
        if record is None:
            return None
        record.update(fields)
        await asyncio.sleep(0.005)  # the hop between read and write, as in get()
        await self.put(session_id, record)
        return record


async def test_candidates_trickled_beside_the_offer_never_undo_it(holders):
    directory = ReadModifyWriteDirectory()
    model = FullModel()
    ingress = IngressSessions(SimpleNamespace(name=MODEL), model, directory, [],
                              actor_name="ingress-a", admission_timeout_s=60.0,
                              replicas=ReplicaCalls(directory, get_actor=holders.get_actor))
    try:
        session_id = await new_session(directory)
        cid = await ingress.register_connection(session_id)
        # The official SDK posts its first candidates while its offer is on its way.
        await asyncio.gather(
            ingress.submit_offer(session_id, "v=0 the offer", [], cid),
            ingress.add_ice_candidates(session_id, cid, [{"candidate": "c1"}], False),
            ingress.add_ice_candidates(session_id, cid, [{"candidate": "c2"}], True),
        )
        record = directory.records[session_id]
        assert record["offer"]["sdp_offer"] == "v=0 the offer"
        assert "early_candidates" not in record  # kept apart from the record
        batches = await directory.take_early_candidates(session_id)
        assert sorted(b["candidates"][0]["candidate"] for b in batches) == ["c1", "c2"]
        assert await directory.take_early_candidates(session_id) == []  # taken once
        assert ingress._record_locks == {}
    finally:
        tasks = [*ingress.admission._waits.values(), *ingress.admission._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_offer_and_candidates_on_two_ingress_replicas_both_survive():
    # The official SDK's offer and its trickled candidates are separate requests, and
    # Serve may send them to different ingress replicas, whose locks know nothing of
    # each other: only what each writes decides whether one undoes the other.
    directory = ReadModifyWriteDirectory()
    model = FullModel()
    holders = LiveHolders("ingress-a", "ingress-b")

    def ingress(name: str) -> IngressSessions:
        return IngressSessions(SimpleNamespace(name=MODEL), model, directory, [], actor_name=name,
                               admission_timeout_s=60.0,
                               replicas=ReplicaCalls(directory, get_actor=holders.get_actor))

    a, b = ingress("ingress-a"), ingress("ingress-b")
    try:
        session_id = await new_session(directory)
        cid = await a.register_connection(session_id)
        await asyncio.gather(
            b.add_ice_candidates(session_id, cid, [{"candidate": "c1"}], False),
            a.submit_offer(session_id, "v=0 the offer", [], cid),
            b.add_ice_candidates(session_id, cid, [{"candidate": "c2"}], True),
        )
        record = directory.records[session_id]
        assert record["offer"]["sdp_offer"] == "v=0 the offer" and record["state"] == SessionState.WAITING
        batches = await directory.take_early_candidates(session_id)
        assert sorted(batch["candidates"][0]["candidate"] for batch in batches) == ["c1", "c2"]
    finally:
        tasks = [t for x in (a, b) for t in (*x.admission._waits.values(), *x.admission._background)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
