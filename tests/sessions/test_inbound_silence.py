"""InboundSilence on a fake clock: idle_timeout_s for a connection that is up,
connect_timeout_s while it comes up, and silence counted from when it came up."""

import pytest

from reactor_serve.sessions.inbound_silence import InboundSilence, silence_checks


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_a_connection_that_is_up_is_silent_past_the_idle_timeout_since_it_was_last_heard():
    clock = Clock()
    silence = InboundSilence(idle_timeout_s=8.0, connect_timeout_s=30.0, clock=clock)
    clock.now += 7.0
    silence.heard()
    clock.now += 8.0
    assert not silence.silent() and silence.limit_s == 8.0
    clock.now += 0.5
    assert silence.silent()


def test_coming_up_has_the_connect_timeout_and_up_restarts_the_count():
    clock = Clock()
    silence = InboundSilence(idle_timeout_s=8.0, connect_timeout_s=30.0, clock=clock)
    silence.coming_up()
    assert silence.waiting_for_connection and silence.limit_s == 30.0
    clock.now += 29.0
    assert not silence.silent()  # past the idle timeout, within the connect one
    silence.up()
    assert not silence.waiting_for_connection and silence.limit_s == 8.0
    clock.now += 8.0
    assert not silence.silent()  # 8 s since it came up, not since it was answered
    clock.now += 0.5
    assert silence.silent()


def test_a_connection_that_never_comes_up_is_silent_past_the_connect_timeout():
    clock = Clock()
    silence = InboundSilence(idle_timeout_s=8.0, connect_timeout_s=30.0, clock=clock)
    silence.coming_up()
    clock.now += 30.5
    assert silence.silent() and silence.waiting_for_connection


def test_without_a_connect_timeout_a_connection_coming_up_has_the_idle_timeout():
    clock = Clock()
    silence = InboundSilence(idle_timeout_s=8.0, clock=clock)
    silence.coming_up()
    assert silence.limit_s == 8.0
    clock.now += 8.5
    assert silence.silent()


def test_excused_seconds_do_not_count_but_never_put_the_last_word_in_the_future():
    clock = Clock()
    silence = InboundSilence(idle_timeout_s=8.0, clock=clock)
    clock.now += 20.0
    assert silence.silent()
    silence.excuse(15.0)  # our loop stalled for 15 of those 20 s
    assert not silence.silent()
    clock.now += 3.5
    assert silence.silent()  # 5 heard-able seconds before, 3.5 after
    silence.excuse(1000.0)
    clock.now += 8.0
    assert not silence.silent()  # counted from now at most, not from the future
    clock.now += 0.5
    assert silence.silent()
    silence.excuse(-5.0)  # nothing to excuse: no effect
    assert silence.silent()


async def test_silence_checks_yield_the_stall_past_a_whole_period_and_nothing_for_noise():
    clock = Clock()
    wakes = iter([1.0, 1.4, 2.0, 31.0])  # how long each 1 s sleep really takes

    async def sleep(seconds):
        clock.now += next(wakes)

    checks = silence_checks(1.0, clock=clock, sleep=sleep)
    assert [await anext(checks) for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(30.0)]
