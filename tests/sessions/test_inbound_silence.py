"""InboundSilence on a fake clock: idle_timeout_s for a connection that is up,
connect_timeout_s while it comes up, and silence counted from when it came up."""

from reactor_serve.sessions.inbound_silence import InboundSilence


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
