"""The reconnect supervisor alone: a fake clock, a fake transport that drops, and a
server whose answers each test scripts. Nothing waits on real time."""

from __future__ import annotations

import errno
from typing import Any

import httpx
import pytest

from reactor_serve.client.reconnect import (
    ClientState,
    ReconnectPolicy,
    ReconnectSupervisor,
)
from reactor_serve.client.signalling import SessionOver, SessionRefused


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakeTransport:
    """A connection and its server: `reoffer` and `check_session` answer from scripts
    (an exception to raise, or None for success); once the scripts run out, offers work
    and the session lives."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.stats_seen = False
        self.last_inbound = float("-inf")
        self.session_end: dict[str, Any] | None = None
        self.offers: list[BaseException | None] = []
        self.checks: list[BaseException | None] = []
        self.offer_timeouts: list[float] = []
        self.checked = 0
        self.offer_cost_s = 0.0  # how long each offer takes on the clock
        # Called after each offer that works: what the new connection then does.
        self.after_offer: Any = None

    def receive_stats(self) -> None:
        self.stats_seen = True
        self.last_inbound = self.clock.now

    async def reoffer(self, timeout: float) -> None:
        self.offer_timeouts.append(timeout)
        self.clock.now += self.offer_cost_s
        outcome = self.offers.pop(0) if self.offers else None
        if outcome is not None:
            raise outcome
        self.last_inbound = self.clock.now
        if self.after_offer is not None:
            self.after_offer()

    async def check_session(self) -> dict[str, Any]:
        self.checked += 1
        outcome = self.checks.pop(0) if self.checks else None
        if outcome is not None:
            raise outcome
        return {"state": "streaming"}


class Harness:
    def __init__(self, policy: ReconnectPolicy | None = None) -> None:
        self.clock = FakeClock()
        self.transport = FakeTransport(self.clock)
        self.states: list[tuple[str, dict[str, Any]]] = []
        self.ended: list[tuple[str, str | None]] = []
        self.supervisor = ReconnectSupervisor(
            self.transport,
            policy or ReconnectPolicy(),
            check_session=self.transport.check_session,
            reoffer=self.transport.reoffer,
            set_state=lambda state, **detail: self.states.append((state, detail)),
            end=self.end,
            server="http://model.test",
            name="abcd…",
            clock=self.clock,
            sleep=self.clock.sleep,
        )
        # run() then looks at the connection without waiting between looks.
        self.supervisor.TICK_S = 0

    async def end(self, reason: str, message: str | None) -> None:
        self.ended.append((reason, message))

    def drop(self, why: str = "peer connection failed") -> None:
        """The transport is lost, as ClientPeer reports it."""
        self.supervisor.lost(why)


def refused() -> httpx.ConnectError:
    error = httpx.ConnectError("All connection attempts failed")
    error.__cause__ = OSError(errno.ECONNREFUSED, "Connection refused")
    return error


def test_backoff_doubles_from_the_first_delay_up_to_the_cap():
    policy = ReconnectPolicy(first_delay_s=0.2, max_delay_s=2.0)
    assert [policy.delay(n) for n in range(1, 7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 2.0, 2.0])


async def test_a_dropped_transport_is_offered_again_and_streams():
    h = Harness()
    h.drop("peer connection failed")
    await h.supervisor.check()
    assert h.supervisor.reconnects == 1
    assert h.states == [
        (ClientState.RECONNECTING, {"attempt": 1, "reason": "peer connection failed"}),
        (ClientState.STREAMING, {"reconnects": 1}),
    ]
    assert h.clock.slept == [0.2]
    assert h.transport.checked == 1  # the session was asked about before offering
    assert h.ended == []
    # The loss was handled: the next look does nothing.
    await h.supervisor.check()
    assert h.supervisor.reconnects == 1 and len(h.transport.offer_timeouts) == 1


async def test_silence_counts_as_a_loss_only_once_stats_are_expected():
    h = Harness(ReconnectPolicy(silence_timeout_s=2.0))
    h.clock.now += 10.0  # no stats yet: silence means nothing
    await h.supervisor.check()
    assert h.transport.offer_timeouts == []
    h.transport.receive_stats()
    h.clock.now += 2.0  # exactly the timeout: not yet
    await h.supervisor.check()
    assert h.transport.offer_timeouts == []
    h.clock.now += 0.01
    await h.supervisor.check()
    assert h.supervisor.reconnects == 1
    assert h.states[0] == (
        ClientState.RECONNECTING, {"attempt": 1, "reason": "no message from the server for 2 s"}
    )


async def test_failed_attempts_back_off_until_one_works():
    h = Harness()
    h.transport.offers = [ConnectionError("ice"), TimeoutError("no answer"), OSError("net down")]
    h.drop()
    await h.supervisor.check()
    assert h.clock.slept == pytest.approx([0.2, 0.4, 0.8, 1.6])
    assert [d["attempt"] for s, d in h.states if s == ClientState.RECONNECTING] == [1, 2, 3, 4]
    assert h.states[-1] == (ClientState.STREAMING, {"reconnects": 1})
    assert h.ended == []


async def test_an_attempt_waits_at_most_what_is_left_of_the_grace_and_at_least_a_second():
    h = Harness(ReconnectPolicy(give_up_after_s=13.0, attempt_timeout_s=10.0,
                                first_delay_s=1.0, max_delay_s=1.0))
    h.transport.offer_cost_s = 5.0
    h.transport.offers = [TimeoutError(), TimeoutError(), TimeoutError()]
    h.drop()
    await h.supervisor.check()
    # 1 s pause: 12 s left, capped to 10; 5 s offer + 1 s pause: 6 s left; then 0: 1.
    assert h.transport.offer_timeouts == pytest.approx([10.0, 6.0, 1.0])


async def test_it_gives_up_after_the_grace_and_says_why():
    h = Harness(ReconnectPolicy(give_up_after_s=5.0))
    h.transport.offers = [TimeoutError("no answer")] * 100
    h.drop("peer connection closed")
    await h.supervisor.check()
    assert h.ended == [(
        "timeout",
        ("lost the connection (peer connection closed) and could not reconnect within 5 s "
         "(TimeoutError: no answer)"),
    )]
    assert h.supervisor.ended
    assert sum(h.clock.slept) >= 5.0
    assert h.supervisor.reconnects == 0


async def test_giving_up_reports_the_servers_reason_when_it_has_one():
    h = Harness(ReconnectPolicy(give_up_after_s=1.0))
    h.transport.offers = [TimeoutError()] * 100
    # The attempts' checks say it lives; the last word, after giving up, says it ended.
    h.transport.checks = [None] * 3 + [SessionOver("timeout", "the client did not reconnect")]
    h.drop()
    await h.supervisor.check()
    assert h.ended == [("timeout", "the client did not reconnect")]


async def test_a_server_that_refuses_connections_ends_the_session_as_gone():
    h = Harness(ReconnectPolicy(unreachable_after_s=3.0, give_up_after_s=30.0))
    h.transport.checks = [refused()] * 100
    h.drop("peer connection failed")
    await h.supervisor.check()
    assert h.ended == [(
        "error",
        ("lost the connection (peer connection failed) and the server at http://model.test "
         "refuses connections: it is gone, and the session with it"),
    )]
    assert sum(h.clock.slept) < 30.0  # well before the grace
    assert h.transport.offer_timeouts == []


async def test_an_answer_in_between_restarts_the_unreachable_count():
    h = Harness(ReconnectPolicy(unreachable_after_s=3.0, give_up_after_s=30.0,
                                first_delay_s=1.0, max_delay_s=1.0))
    # Refused for 2 s, then a 503 (someone listens), then refused again for 2 s: never
    # 3 s of refusals in a row, so it keeps trying until an offer works.
    h.transport.checks = [refused(), refused(), SessionRefused("busy", 503), refused(),
                          refused()]
    h.transport.offers = [None]
    h.drop()
    await h.supervisor.check()
    assert h.ended == [] and h.supervisor.reconnects == 1


async def test_the_server_saying_the_session_ended_ends_it_without_an_offer():
    h = Harness()
    h.transport.checks = [SessionOver("model_error", "the model raised")]
    h.drop()
    await h.supervisor.check()
    assert h.ended == [("model_error", "the model raised")]
    assert h.transport.offer_timeouts == []


async def test_a_404_offer_ends_with_the_descriptors_reason_or_the_404s_words():
    h = Harness()
    h.transport.offers = [SessionRefused("PUT /sessions/x: 404 session x has ended", 404)]
    h.transport.checks = [None, SessionOver("client_closed", "stopped by its owner")]
    h.drop()
    await h.supervisor.check()
    assert h.ended == [("client_closed", "stopped by its owner")]

    h = Harness()
    h.transport.offers = [SessionRefused("PUT /sessions/x: 404 session x has ended", 404)]
    # The server no longer remembers why: the 404's own words are the message.
    h.transport.checks = [None, SessionOver("error", None)]
    h.drop()
    await h.supervisor.check()
    assert h.ended == [("error", "PUT /sessions/x: 404 session x has ended")]


async def test_the_servers_own_session_ended_wins_over_a_lost_transport():
    h = Harness()
    h.transport.session_end = {"reason": "timeout", "message": "idle for too long"}
    h.drop()
    await h.supervisor.check()
    assert h.ended == [("timeout", "idle for too long")]
    assert h.transport.offer_timeouts == [] and h.states == []
    h.transport.session_end = {}
    await h.supervisor.check()  # once ended, nothing more
    assert len(h.ended) == 1


async def test_a_server_without_stats_is_asked_now_and_then():
    h = Harness()
    await h.supervisor.check()
    assert h.transport.checked == 0
    h.clock.now += ReconnectSupervisor.WATCH_INTERVAL_S
    await h.supervisor.check()
    assert h.transport.checked == 1
    await h.supervisor.check()  # not again until the next interval
    assert h.transport.checked == 1
    h.transport.checks = [SessionOver("shutdown", None)]
    h.clock.now += ReconnectSupervisor.WATCH_INTERVAL_S
    await h.supervisor.check()
    assert h.ended == [("shutdown", None)]


async def test_disabled_reconnects_end_on_the_first_loss():
    h = Harness(ReconnectPolicy(enabled=False))
    h.drop("peer connection failed")
    await h.supervisor.check()
    assert h.ended == [
        ("timeout", "lost the connection (peer connection failed) and reconnecting is disabled")
    ]
    assert h.transport.offer_timeouts == []


async def test_run_reconnects_each_drop_until_the_session_ends():
    h = Harness()
    drops = ["peer connection closed"]  # the first new connection drops at once too

    def after_offer() -> None:
        if drops:
            h.drop(drops.pop())
        else:
            h.transport.session_end = {"reason": "client_closed"}

    h.transport.after_offer = after_offer
    h.drop()
    await h.supervisor.run()
    assert h.supervisor.reconnects == 2
    assert [d.get("reason") for s, d in h.states if s == ClientState.RECONNECTING] == [
        "peer connection failed", "peer connection closed"]
    assert h.ended == [("client_closed", None)]


async def test_run_ends_the_session_when_the_supervisor_itself_fails():
    h = Harness()
    h.transport.checks = [RuntimeError("bug")]
    h.drop()
    await h.supervisor.run()
    assert h.ended == [("error", "the client's connection supervisor failed: RuntimeError('bug')")]
