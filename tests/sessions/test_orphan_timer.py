"""The orphan timer on a fake clock: silence, the reconnect grace, the stop window."""

import asyncio

import pytest

from reactor_serve.sessions.orphan_timer import OrphanTimer


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.waiters = []  # (deadline, future)

    def clock(self):
        return self.now

    async def sleep(self, seconds):
        future = asyncio.get_running_loop().create_future()
        self.waiters.append((self.now + seconds, future))
        await future

    async def advance(self, seconds):
        self.now += seconds
        for deadline, future in list(self.waiters):
            if deadline <= self.now and not future.done():
                self.waiters.remove((deadline, future))
                future.set_result(None)
        for _ in range(5):  # loop turns, not wall time: the woken waiters run
            await asyncio.sleep(0)


@pytest.fixture
def fake():
    return FakeTime()


def timer_of(fake, silent=None, expired=None, idle=8.0, grace=30.0, connect=None):
    async def on_silent():
        silent.append(fake.now)

    async def on_expired(at):
        expired.append(at)

    return OrphanTimer(
        idle_timeout_s=idle, reconnect_grace_s=grace, connect_timeout_s=connect,
        on_silent=on_silent if silent is not None else _never,
        on_expired=on_expired if expired is not None else _never,
        clock=fake.clock, sleep=fake.sleep,
    )


async def _never(*_):
    raise AssertionError("not expected")


async def test_the_watchdog_fires_after_idle_timeout_without_inbound(fake):
    silent = []
    timer = timer_of(fake, silent=silent, idle=8.0)
    timer.start_watchdog()
    await fake.advance(0)
    await fake.advance(1.0)
    timer.silence.heard()
    for _ in range(8):
        await fake.advance(1.0)
    assert silent == []  # 8 s since the frame: not longer than idle_timeout_s yet
    await fake.advance(1.0)
    assert silent == [110.0]
    timer.stop()
    await fake.advance(10.0)
    assert silent == [110.0]


async def test_a_stall_of_our_own_loop_is_not_the_clients_silence(fake):
    # The loop wakes 25 s late: what the client sent meanwhile is still unread in the
    # socket, so the watchdog must not call it silent on waking; it judges the seconds
    # after the stall, as the client's frames get their turn.
    silent = []
    timer = timer_of(fake, silent=silent, idle=8.0)
    timer.start_watchdog()
    await fake.advance(0)
    await fake.advance(25.0)  # one sleep of 1 s that took 25
    assert silent == []
    for _ in range(7):
        await fake.advance(1.0)
    assert silent == []  # 1 + 7 heard-able seconds: not longer than idle_timeout_s
    await fake.advance(1.0)
    assert silent == [133.0]
    timer.stop()


async def test_a_slow_machine_is_not_excused_a_late_wake_under_a_period(fake):
    # Wakes 0.5 s late each time (a loaded machine, not a stall): the silence counts
    # in full, so a gone client is still found after idle_timeout_s.
    silent = []
    timer = timer_of(fake, silent=silent, idle=8.0)
    timer.start_watchdog()
    await fake.advance(0)
    for _ in range(5):
        await fake.advance(1.5)
    assert silent == []  # 7.5 s
    await fake.advance(1.5)
    assert silent == [109.0]
    timer.stop()


async def test_grace_expires_with_its_orphaning_time_and_a_resume_cancels_it(fake):
    expired = []
    timer = timer_of(fake, expired=expired, grace=30.0)
    at = timer.orphan()
    await fake.advance(0)
    assert timer.orphaned_at == at and timer.grace_remaining() == 30.0
    await fake.advance(10.0)
    assert timer.grace_remaining() == 20.0 and timer.orphaned_within(10.0)
    assert not timer.orphaned_within(9.0)
    timer.resume()
    assert timer.grace_remaining() is None and timer.orphaned_at is None
    await fake.advance(60.0)
    assert expired == []
    again = timer.orphan()
    await fake.advance(29.0)
    assert expired == []
    await fake.advance(1.0)
    assert expired == [again]
    assert timer.grace_remaining() == 0.0


async def test_stop_on_close_is_a_window(fake):
    timer = timer_of(fake)
    assert not timer.stopping_on_close()
    timer.stop_on_close(5.0)
    await fake.advance(5.0)
    assert timer.stopping_on_close()
    await fake.advance(0.1)
    assert not timer.stopping_on_close()


async def test_after_stop_nothing_starts_again(fake):
    timer = timer_of(fake)
    timer.stop()
    timer.start_watchdog()
    timer.orphan()
    await fake.advance(100.0)
    assert fake.waiters == []


async def test_a_connection_coming_up_has_the_connect_timeout_and_silence_counts_from_up(fake):
    silent = []
    timer = timer_of(fake, silent=silent, idle=8.0, connect=30.0)
    timer.start_watchdog()
    timer.silence.coming_up()
    assert timer.silence.waiting_for_connection
    for _ in range(30):
        await fake.advance(1.0)
    assert silent == []  # 30 s coming up: past the idle timeout, not the connect one
    timer.silence.up()
    assert not timer.silence.waiting_for_connection
    for _ in range(8):
        await fake.advance(1.0)
    assert silent == []  # 8 s since it came up
    await fake.advance(1.0)
    assert silent == [139.0]
    timer.stop()


async def test_a_connection_that_does_not_come_up_is_silent_after_the_connect_timeout(fake):
    silent = []
    timer = timer_of(fake, silent=silent, idle=8.0, connect=30.0)
    timer.start_watchdog()
    timer.silence.coming_up()
    for _ in range(31):
        await fake.advance(1.0)
    assert silent == [131.0] and timer.silence.waiting_for_connection
    timer.stop()
