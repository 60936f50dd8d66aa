"""`.ci/leftovers.py`, the check `.ci/run` ends with: it names every process that
carries the test run's REACTOR_TEST_RUN value, even one whose parent is gone, and
nothing else."""

import contextlib
import os
import secrets
import signal
import subprocess
import sys

from paths import ROOT

CHECK = ROOT / ".ci" / "leftovers.py"


def check(value: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), value, *args],
                          capture_output=True, text=True, timeout=60)


def orphan(value: str | None) -> int:
    """A `sleep` whose parent has exited (re-parented to init, as a server a test forgot
    would be), started with REACTOR_TEST_RUN=value; its pid."""
    env = dict(os.environ)
    env.pop("REACTOR_TEST_RUN", None)
    if value is not None:
        env["REACTOR_TEST_RUN"] = value
    parent = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"],
        env=env, capture_output=True, text=True, timeout=30, check=True)
    return int(parent.stdout.strip())


def test_a_process_left_by_the_run_is_named_fails_the_check_and_is_ended():
    value = f"test-{secrets.token_hex(4)}"
    pid = orphan(value)
    try:
        result = check(value, "--grace", "0")
        assert result.returncode == 1, result.stdout
        assert f"pid {pid} " in result.stdout and "sleep 120" in result.stdout
        # Killed, so that the next run does not start beside it: it is gone or a zombie
        # of init's, which nothing counts.
        again = check(value, "--grace", "30")
        assert again.returncode == 0, again.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_processes_of_other_runs_or_of_none_are_not_counted():
    value = f"test-{secrets.token_hex(4)}"
    others = [orphan(f"{value}-other"), orphan(None)]
    try:
        result = check(value, "--grace", "0")
        assert result.returncode == 0, result.stdout
        assert result.stdout.startswith("leftovers: none")
    finally:
        for pid in others:
            os.kill(pid, signal.SIGKILL)


def test_a_process_that_ends_within_the_grace_is_not_a_leftover():
    value = f"test-{secrets.token_hex(4)}"
    env = {**os.environ, "REACTOR_TEST_RUN": value}
    subprocess.Popen(["sh", "-c", "sleep 1"], env=env)
    result = check(value, "--grace", "60")
    assert result.returncode == 0, result.stdout


def test_an_empty_value_is_refused():
    result = check("")
    assert result.returncode == 2 and "empty" in result.stderr
