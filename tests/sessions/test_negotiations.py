"""One session's negotiation table on a fake clock and timer: connection ids, offers and
their answers, bounds, release, and the expiry of a session with no usable offer."""

import asyncio
import gc

import pytest

from reactor_serve.protocol.errors import ModelBusy, NegotiationFailed, UnknownSession
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer
from reactor_serve.sessions.negotiations import Negotiations


class FakeTimers:
    """A clock and a `call_later` that only move when the test says so."""

    def __init__(self):
        self.now = 50.0
        self.handles = []

    def clock(self):
        return self.now

    def call_later(self, delay_s, callback):
        handle = _Handle(self.now + delay_s, callback)
        self.handles.append(handle)
        return handle

    def advance(self, seconds):
        self.now += seconds
        for handle in list(self.handles):
            if handle.due <= self.now and not handle.cancelled:
                self.handles.remove(handle)
                handle.callback()

    @property
    def armed(self):
        return [h for h in self.handles if not h.cancelled]


class _Handle:
    def __init__(self, due, callback):
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


@pytest.fixture
def timers():
    return FakeTimers()


@pytest.fixture
def table(timers):
    return Negotiations("s1", 30.0, clock=timers.clock, call_later=timers.call_later)


def answering(result=None, error=None, gate=None):
    """An `answer` factory for `Negotiations.offer`; its tasks end with `result` or
    `error`, after `gate` (an Event) is set when one is given."""

    async def answer(cid):
        if gate is not None:
            await gate.wait()
        if error is not None:
            raise error
        return result if result is not None else f"answer-{cid}"

    started = []

    def start(cid):
        started.append(cid)
        return asyncio.get_running_loop().create_task(answer(cid))

    start.started = started
    return start


async def settle():
    # Loop turns, not wall time: the tasks under test finish within a few steps.
    for _ in range(3):
        await asyncio.sleep(0)


# ---- connection ids ----------------------------------------------------------------------


async def test_ids_count_from_one_per_session_whether_registered_or_offered(table):
    assert table.register() == 1
    assert table.register() == 2
    assert table.offer(None, answering()) == 3
    assert table.register() == 4
    # Another session's table counts on its own.
    assert Negotiations("s2", 30.0).register() == 1


async def test_an_offer_on_a_registered_id_answers_on_that_id(table):
    cid = table.register()
    start = answering()
    assert table.offer(cid, start) == cid
    assert start.started == [cid]
    await settle()
    assert table.poll(cid) == SdpAnswer(f"answer-{cid}", cid)
    assert table.poll(cid).connection_id == cid


async def test_known_ids_are_those_handed_out_and_kept(table):
    registered = table.register()
    offered = table.offer(None, answering())
    assert table.knows(registered) and table.knows(offered)
    assert not table.knows(99)
    assert not table.knows("1") and not table.knows(None) and not table.knows(1.0 + 0.5)


async def test_registered_ids_are_bounded_oldest_dropped(table):
    ids = [table.register() for _ in range(Negotiations.KEEP_REGISTERED + 2)]
    assert not table.knows(ids[0]) and not table.knows(ids[1])
    assert all(table.knows(cid) for cid in ids[2:])


async def test_offers_are_bounded_and_a_dropped_one_is_an_unknown_connection(table):
    ids = [table.offer(None, answering()) for _ in range(Negotiations.KEEP_OFFERED + 1)]
    await settle()
    assert len(table.tasks()) == Negotiations.KEEP_OFFERED
    assert not table.knows(ids[0])
    with pytest.raises(UnknownSession, match=r"unknown connection 1 for session s1"):
        table.poll(ids[0])
    assert table.poll(ids[-1]) == SdpAnswer(f"answer-{ids[-1]}", ids[-1])


# ---- polling -----------------------------------------------------------------------------


async def test_before_any_offer_the_answer_awaits_one(table):
    assert table.poll(None) == AnswerPending({"status": "awaiting_offer"})
    cid = table.register()
    assert table.poll(cid) == AnswerPending({"status": "awaiting_offer"})
    with pytest.raises(UnknownSession, match="unknown connection 7"):
        table.poll(7)


async def test_an_answer_is_pending_until_its_task_ends(table):
    gate = asyncio.Event()
    cid = table.offer(None, answering(gate=gate))
    assert table.poll(cid) == AnswerPending({"status": "pending"})
    gate.set()
    await settle()
    assert table.poll(cid) == SdpAnswer(f"answer-{cid}", cid)


async def test_a_poll_without_an_id_sees_the_newest_offer_only(table):
    first = table.offer(None, answering())
    await settle()
    gate = asyncio.Event()
    second = table.offer(None, answering(gate=gate))
    assert table.latest == second
    # The previous connection's answer is never handed out for the new one.
    assert table.poll(None) == AnswerPending({"status": "pending"})
    assert table.poll(first) == SdpAnswer(f"answer-{first}", first)
    gate.set()
    await settle()
    assert table.poll(None) == SdpAnswer(f"answer-{second}", second)


async def test_an_offer_on_an_id_again_makes_it_the_latest(table):
    first = table.offer(None, answering())
    table.offer(None, answering())
    table.offer(first, answering(result="again"))
    await settle()
    assert table.latest == first
    assert table.poll(None) == SdpAnswer("again", first)


async def test_a_failed_answer_raises_a_fresh_error_of_its_kind_each_poll(table):
    cid = table.offer(None, answering(error=ModelBusy("the model is busy", 3.0)))
    await settle()
    raised = []
    for _ in range(2):
        with pytest.raises(ModelBusy, match="the model is busy") as caught:
            table.poll(cid)
        assert caught.value.retry_after_s == 3.0
        raised.append(caught.value)
    assert raised[0] is not raised[1]


async def test_an_answer_that_failed_otherwise_is_a_failed_negotiation(table):
    cid = table.offer(None, answering(error=RuntimeError("the codec broke")))
    await settle()
    with pytest.raises(NegotiationFailed, match="the codec broke"):
        table.poll(cid)


async def test_a_cancelled_answer_was_abandoned(table):
    cid = table.offer(None, answering(gate=asyncio.Event()))
    [task] = table.tasks()
    task.cancel()
    await settle()
    with pytest.raises(NegotiationFailed, match="abandoned"):
        table.poll(cid)


# ---- release -----------------------------------------------------------------------------


async def test_release_lets_go_of_the_tasks_and_keeps_the_ids(table, timers):
    failed = table.offer(None, answering(error=RuntimeError("boom")))
    registered = table.register()
    table.arm_expiry(lambda: None)
    await settle()
    table.release()
    assert table.tasks() == [None]
    assert table.knows(failed) and table.knows(registered)
    assert timers.armed == []
    with pytest.raises(NegotiationFailed):
        table.poll(failed)


async def test_a_failed_answer_nobody_polled_leaves_no_unretrieved_exception(table):
    unretrieved = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        table.offer(None, answering(error=RuntimeError("never polled")))
        await settle()
        table.release()
        gc.collect()
        await settle()
    finally:
        loop.set_exception_handler(None)
    assert unretrieved == []


# ---- expiry ------------------------------------------------------------------------------


async def test_a_session_with_no_offer_expires_after_the_timeout(table, timers):
    expired = []
    table.arm_expiry(lambda: expired.append(timers.now))
    assert table.expires_in() == 30.0
    timers.advance(12.5)
    assert table.expires_in() == 17.5
    assert expired == []
    timers.advance(17.5)
    assert expired == [80.0]
    assert table.expires_in() is None


async def test_rearming_replaces_the_expiry(table, timers):
    expired = []
    table.arm_expiry(lambda: expired.append("first"))
    timers.advance(20)
    table.arm_expiry(lambda: expired.append("second"))
    timers.advance(20)
    assert expired == []
    timers.advance(10)
    assert expired == ["second"]


async def test_an_offer_stops_the_expiry(table, timers):
    expired = []
    table.arm_expiry(lambda: expired.append(True))
    table.offer(None, answering(gate=asyncio.Event()))
    assert table.expires_in() is None
    timers.advance(60)
    assert expired == []


async def test_an_offer_still_being_answered_holds_off_the_expiry(table, timers):
    # Armed again while an offer is answered (a failed earlier one re-arms it): the
    # pending answer decides, not the timer.
    expired = []
    gate = asyncio.Event()
    table.offer(None, answering(gate=gate))
    table.arm_expiry(lambda: expired.append(True))
    timers.advance(30)
    assert expired == []
    gate.set()
    await settle()


async def test_an_answered_session_never_expires(table, timers):
    expired = []
    table.arm_expiry(lambda: expired.append(True))
    table.mark_answered()
    assert table.answered
    assert table.expires_in() is None
    timers.advance(30)
    assert expired == []


async def test_cancel_expiry_calls_off_the_timer(table, timers):
    expired = []
    table.arm_expiry(lambda: expired.append(True))
    table.cancel_expiry()
    assert timers.armed == [] and table.expires_in() is None
    timers.advance(60)
    assert expired == []


async def test_the_default_timer_is_the_running_loops():
    expired = asyncio.Event()
    table = Negotiations("s1", 0.01)
    table.arm_expiry(expired.set)
    try:
        await asyncio.wait_for(expired.wait(), 30)  # only stops a hang
    except asyncio.TimeoutError:
        raise AssertionError("the loop's timer did not expire the negotiation") from None
