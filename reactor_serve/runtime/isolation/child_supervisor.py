"""`ChildSupervisor`: keeps one child process running, and says how each one ended.

A child is started, waited for until it says it is ready (or that it failed to
start), then watched until it exits. A child that dies is restarted after a delay
that doubles with each death in a row, so a child that dies at once does not spin;
one that ran a while first starts the sequence over. Starts that keep failing mark
the supervisor unhealthy (it keeps trying), so a health check can say why.

What a child is, and what must be let go of when it is gone, belongs to the caller
(`SupervisedChild`); the supervisor only decides when to start, stop and kill. Every
child is started from the supervisor's own thread: the kernel's parent-death signal
follows the thread that forked, and this one lives as long as the supervisor does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import signal
import subprocess
import threading
import time
from typing import Callable, Generic, Protocol, Sequence, TypeVar

__all__ = ["ChildStopped", "ChildSupervisor", "SupervisedChild", "describe_exit"]

log = logging.getLogger("reactor_serve.runtime")


def describe_exit(returncode: int) -> str:
    """How a process ended, for a person: "exited with code 3", "was killed by
    SIGSEGV (signal 11)"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        text = f"was killed by {signal.Signals(number).name} (signal {number})"
    except ValueError:
        text = f"was killed by signal {number}"
    if number == signal.SIGKILL:
        text += ": the kernel's out-of-memory killer, or someone, killed it"
    return text


class SupervisedChild(Protocol):
    """One started child process, as its supervisor sees it."""

    @property
    def process(self) -> subprocess.Popen[bytes]: ...

    def wait_started(self) -> Exception | None:
        """Block until the child is ready (None) or has failed to start (why; a child
        that dies while starting has failed)."""

    def ask_to_stop(self) -> None:
        """Ask the child to exit by itself; it is killed if it has not in time."""

    def release(self, why: str | None) -> None:
        """The child has exited: let go of everything held for it. `why` says what
        happened, for whoever was using it; None when it was stopped on purpose."""


class ChildStopped(RuntimeError):
    """The supervisor was stopped before its first child had started."""


C = TypeVar("C", bound=SupervisedChild)


class ChildSupervisor(Generic[C]):
    """Starts a child with `spawn`, restarts it when it dies, stops it on request."""

    # Restart delays after a death or a failed start, doubling up to the last; a child
    # that ran STABLE_AFTER_S before dying starts the sequence over.
    RESTART_BACKOFF_S: Sequence[float] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
    STABLE_AFTER_S = 60.0
    # Failed starts in a row after which the supervisor reports unhealthy.
    UNHEALTHY_AFTER = 3
    # How long a child that failed to start gets to exit before it is killed.
    STOP_WAIT_S = 10.0

    def __init__(
        self,
        name: str,
        spawn: Callable[[], C],
        *,
        what: str = "the child process",
        backoff_s: Sequence[float] = RESTART_BACKOFF_S,
        stable_after_s: float = STABLE_AFTER_S,
        unhealthy_after: int = UNHEALTHY_AFTER,
        describe_failure: Callable[[Exception], str] = str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`name` names the supervisor in logs and its thread; `what` names a child in
        what `release` is told ("the model process"); `describe_failure` gives the
        details logged when a restart fails to start."""
        if not backoff_s:
            raise ValueError("backoff_s needs at least one delay")
        self.name = name
        self.what = what
        self.backoff_s = tuple(backoff_s)
        self.stable_after_s = stable_after_s
        self.unhealthy_after = unhealthy_after
        self._spawn = spawn
        self._describe_failure = describe_failure
        self._clock = clock
        self._sleep = sleep
        self._crashes = 0
        self._restarts = 0
        self._start_error: Exception | None = None
        self._child: C | None = None
        self._stopping = False
        # Held while a child is spawned, so that `stop()` sees every child started.
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._first_start: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread: threading.Thread | None = None

    # ---- what its owner reads ---------------------------------------------------

    @property
    def child(self) -> C | None:
        """The child started last; it may have exited since."""
        return self._child

    @property
    def pid(self) -> int | None:
        """The child's pid, while one runs."""
        child = self._child
        return child.process.pid if child is not None and child.process.poll() is None else None

    @property
    def crashes(self) -> int:
        """Children that died after they had started."""
        return self._crashes

    @property
    def restarts(self) -> int:
        """Children started again after a death or a failed start."""
        return self._restarts

    @property
    def start_error(self) -> Exception | None:
        """Why the first child failed to start, or why UNHEALTHY_AFTER starts in a row
        have; None again once one starts."""
        return self._start_error

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def healthy(self) -> bool:
        """Started once, not failing to start, and supervising (a child being
        restarted after a death counts as healthy: it will be ready again)."""
        thread = self._thread
        return (
            thread is not None
            and thread.is_alive()
            and self._first_start.done()
            and self._start_error is None
            and not self._stopping
        )

    @property
    def ready(self) -> bool:
        """A child has started and has not exited."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a child is ready; False when `timeout` passed first."""
        return self._ready.wait(timeout)

    # ---- what its owner does ----------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start supervising and wait until the first child is ready. Raises what
        `wait_started` said when the first child fails to start (nothing is retried
        then), ChildStopped when `stop()` came first."""
        self._thread = threading.Thread(
            target=self._supervise, name=f"reactor-supervisor-{self.name}", daemon=True
        )
        self._thread.start()
        self._first_start.result(timeout)

    def kill(self, child: C) -> None:
        """`child` is stuck: kill it now. If it is the running one, it is not ready
        from here on, and it is restarted as if it had crashed."""
        if child is self._child:
            self._ready.clear()
        child.process.kill()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the child (asked first, killed after `timeout`) and start no other."""
        with self._lock:
            self._stopping = True
            child = self._child
        if child is not None:
            self._stop_process(child, timeout)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ---- the supervising thread -------------------------------------------------

    def _supervise(self) -> None:
        try:
            self._run()
        finally:
            if not self._first_start.done():
                self._first_start.set_exception(
                    ChildStopped(f"{self.name} was stopped before {self.what} started")
                )

    def _run(self) -> None:
        failures = 0
        delay_index = 0
        while True:
            with self._lock:
                if self._stopping:
                    return
                child = self._child = self._spawn()
            log.info("%s: %s %d started", self.name, self.what, child.process.pid)
            started = self._clock()
            error = child.wait_started()
            if error is not None:
                failures += 1
                if not self._first_start.done():
                    # Gone before start() raises: nothing of a failed start lingers.
                    self._start_error = error
                    self._stop_and_release(child)
                    self._first_start.set_exception(error)
                    return
                log.error(
                    "%s failed to start again (%d in a row):\n%s",
                    self.name, failures, self._describe_failure(error),
                )
                if failures >= self.unhealthy_after:
                    self._start_error = error
                self._stop_and_release(child)
            else:
                failures = 0
                self._start_error = None
                self._ready.set()
                if not self._first_start.done():
                    self._first_start.set_result(None)
                returncode = child.process.wait()
                self._ready.clear()
                if self._stopping:
                    child.release(None)
                    return
                how = describe_exit(returncode)
                self._crashes += 1
                log.error("%s: %s %s", self.name, self.what, how)
                child.release(f"{self.what} {how}; it is being restarted")
                if self._clock() - started > self.stable_after_s:
                    delay_index = 0
            if self._stopping:
                return
            delay = self.backoff_s[min(delay_index, len(self.backoff_s) - 1)]
            delay_index += 1
            self._restarts += 1
            self._sleep(delay)

    def _stop_and_release(self, child: C) -> None:
        self._stop_process(child, self.STOP_WAIT_S)
        child.release(f"{self.what} stopped")

    def _stop_process(self, child: C, timeout: float) -> None:
        child.ask_to_stop()
        try:
            child.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s: %s %d did not stop in %.0f s: killing it",
                self.name, self.what, child.process.pid, timeout,
            )
            child.process.kill()
            child.process.wait()
