"""The child supervisor alone, over tiny child processes that exit, crash, fail to
start or hang: how it restarts them (backoff on a fake clock), when it turns
unhealthy, how it stops and kills them, and how it says how they ended."""

import signal
import subprocess
import sys
import threading

import pytest

from reactor_serve.runtime.isolation.child_supervisor import (
    ChildStopped,
    ChildSupervisor,
    describe_exit,
)

# Waits on events the supervisor's thread sets; generous, as real processes start.
WAIT_S = 30.0

# Runs until its stdin closes (closing it is how it is asked to stop).
SERVES = "import sys; sys.stdin.read()"
# Ignores being asked.
HANGS = "import time; time.sleep(60)"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TinyChild:
    """A `python -c` child that is ready at once, or says it failed to start."""

    def __init__(self, code, *, fails=None, clock=None, runs_for=0.0):
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        self.fails = fails
        self.clock = clock
        self.runs_for = runs_for
        self.released = threading.Event()
        self.why = "not released"

    def wait_started(self):
        if self.clock is not None:
            self.clock.now += self.runs_for  # how long it will have run when it exits
        return self.fails

    def ask_to_stop(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def release(self, why):
        self.why = why
        self.released.set()


class Children:
    """Spawns the planned children in turn, then ones that serve until stopped."""

    def __init__(self, *plan):
        self.plan = list(plan)
        self.started = []
        self.serving = threading.Event()

    def __call__(self):
        if self.plan:
            child = self.plan.pop(0)()
        else:
            child = TinyChild(SERVES)
            self.serving.set()
        self.started.append(child)
        return child


class Backoff:
    """A sleep that sleeps not at all: notes each delay, and what the supervisor
    reported at that moment, and moves the fake clock on by it."""

    def __init__(self, clock):
        self.clock = clock
        self.delays = []
        self.health = []
        self.supervisor = None

    def __call__(self, delay):
        self.delays.append(delay)
        self.health.append((self.supervisor.healthy, self.supervisor.start_error))
        self.clock.now += delay


def _supervisor(children, clock=None, **options):
    clock = clock or FakeClock()
    sleep = Backoff(clock)
    supervisor = ChildSupervisor(
        "test", children, what="the test child", clock=clock, sleep=sleep, **options
    )
    sleep.supervisor = supervisor
    return supervisor, sleep


@pytest.fixture
def stop_after():
    started = []
    yield started.append
    for supervisor in started:
        supervisor.stop(5.0)


def test_a_dead_child_is_described_released_and_restarted_with_doubling_delays(stop_after):
    children = Children(
        lambda: TinyChild("import sys; sys.exit(3)"),
        lambda: TinyChild("import os; os.kill(os.getpid(), 11)"),
        lambda: TinyChild("import sys; sys.exit(1)"),
    )
    supervisor, backoff = _supervisor(children, backoff_s=(0.5, 1.0, 2.0))
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    assert children.serving.wait(WAIT_S) and supervisor.wait_ready(WAIT_S)
    first, second, third, fourth = children.started
    assert first.why == "the test child exited with code 3; it is being restarted"
    assert second.why == "the test child was killed by SIGSEGV (signal 11); it is being restarted"
    assert third.why == "the test child exited with code 1; it is being restarted"
    assert backoff.delays == [0.5, 1.0, 2.0]  # kept at the last
    assert supervisor.crashes == 3 and supervisor.restarts == 3
    assert supervisor.child is fourth and supervisor.pid == fourth.process.pid
    assert supervisor.healthy and supervisor.start_error is None


def test_a_child_that_ran_a_while_starts_the_delays_over(stop_after):
    clock = FakeClock()
    stable = ChildSupervisor.STABLE_AFTER_S
    children = Children(
        lambda: TinyChild("import sys; sys.exit(3)"),
        lambda: TinyChild("import sys; sys.exit(3)"),
        lambda: TinyChild("import sys; sys.exit(3)", clock=clock, runs_for=stable + 1),
        lambda: TinyChild("import sys; sys.exit(3)", clock=clock, runs_for=stable - 1),
    )
    supervisor, backoff = _supervisor(children, clock=clock, backoff_s=(1.0, 2.0, 4.0, 8.0))
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    assert children.serving.wait(WAIT_S)
    assert backoff.delays == [1.0, 2.0, 1.0, 2.0]


def test_the_first_child_failing_to_start_is_raised_and_leaves_nothing(stop_after):
    failure = RuntimeError("no model here")
    children = Children(lambda: TinyChild(SERVES, fails=failure))
    supervisor, backoff = _supervisor(children)
    stop_after(supervisor)
    with pytest.raises(RuntimeError, match="no model here"):
        supervisor.start(WAIT_S)
    [child] = children.started
    assert child.released.is_set() and child.why == "the test child stopped"
    assert child.process.returncode == 0  # it was asked, and went
    assert supervisor.start_error is failure
    assert not supervisor.healthy and supervisor.pid is None
    assert backoff.delays == [] and supervisor.restarts == 0


def test_starts_failing_in_a_row_turn_it_unhealthy_until_one_starts(stop_after):
    failure = RuntimeError("still broken")
    children = Children(
        lambda: TinyChild("import sys; sys.exit(3)"),
        *[lambda: TinyChild(SERVES, fails=failure)] * 3,
    )
    supervisor, backoff = _supervisor(children, backoff_s=(0.1,), unhealthy_after=3)
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    assert children.serving.wait(WAIT_S) and supervisor.wait_ready(WAIT_S)
    # Healthy after the crash and after the first two failures; not after the third.
    assert backoff.health == [(True, None), (True, None), (True, None), (False, failure)]
    assert all(child.why == "the test child stopped" for child in children.started[1:4])
    assert supervisor.healthy and supervisor.start_error is None
    assert supervisor.crashes == 1 and supervisor.restarts == 4


def test_stop_asks_then_kills_a_child_that_does_not_go(stop_after):
    children = Children(lambda: TinyChild(HANGS))
    supervisor, _ = _supervisor(children)
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    [child] = children.started
    # The grace the supervisor is configured with: this child never goes by itself,
    # so however long it lasts the child ends killed.
    supervisor.stop(timeout=0.2)
    assert child.process.returncode == -signal.SIGKILL
    assert child.released.wait(WAIT_S) and child.why is None  # stopped, not crashed
    assert supervisor.crashes == 0 and supervisor.restarts == 0
    assert not supervisor.healthy and not supervisor.ready


def test_stop_lets_a_child_that_goes_when_asked_exit_by_itself(stop_after):
    children = Children()
    supervisor, _ = _supervisor(children)
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    supervisor.stop(timeout=WAIT_S)
    [child] = children.started
    assert child.process.returncode == 0 and child.why is None


def test_a_stuck_child_killed_is_not_ready_and_is_restarted(stop_after):
    children = Children(lambda: TinyChild(HANGS))
    supervisor, backoff = _supervisor(children)
    stop_after(supervisor)
    supervisor.start(WAIT_S)
    stuck = supervisor.child
    supervisor.kill(stuck)
    # At once: a session opened now waits for the next child.
    assert not supervisor.ready
    assert children.serving.wait(WAIT_S) and supervisor.wait_ready(WAIT_S)
    assert stuck.why.startswith("the test child was killed by SIGKILL (signal 9)")
    assert supervisor.crashes == 1 and backoff.delays == [ChildSupervisor.RESTART_BACKOFF_S[0]]


def test_stopped_before_the_first_child_starts_none_is_started():
    children = Children()
    supervisor, _ = _supervisor(children)
    supervisor.stop()
    with pytest.raises(ChildStopped):
        supervisor.start(WAIT_S)
    assert children.started == [] and not supervisor.healthy


def test_exits_are_described_for_people():
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-11) == "was killed by SIGSEGV (signal 11)"
    assert describe_exit(-9).startswith("was killed by SIGKILL (signal 9): the kernel's out-of-memory")
    assert describe_exit(-200) == "was killed by signal 200"
