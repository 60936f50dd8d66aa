#!/usr/bin/env python3
"""Name every process a test run left behind, and fail if there is one.

`.ci/run` and `.ci/under-load` start pytest with REACTOR_TEST_RUN set to a value of
their own. Every process the suite starts (Ray's GCS, raylets and workers, model
processes, `reactor run`, Chromium, PostgreSQL, coturn, Prometheus) inherits that
environment, and /proc/PID/environ keeps the value a process started with even after
its parent died and it was re-parented to init. So a process carrying the value after
pytest has exited is one the suite failed to end, whoever started it.

    python .ci/leftovers.py VALUE [--grace SECONDS]

Processes still shutting down get `--grace` seconds to go (Ray's workers exit a moment
after their raylet); whatever is left then is printed, one line each, then killed, so
that a red run does not leave its servers to the next one, and the exit status is 1.
With nothing left it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

__all__ = ["processes_carrying", "main"]

VARIABLE = "REACTOR_TEST_RUN"


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone meanwhile, or a kernel thread
        return b""


def _describe(pid: str) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    state = next((line.split(":", 1)[1].strip() for line in status.splitlines()
                  if line.startswith("State:")), "?")
    return f"pid {pid} ({state}): {cmdline.decode(errors='replace')[:300]}"


def processes_carrying(value: str) -> dict[int, str]:
    """{pid: a line naming it} for each live process whose environment has
    REACTOR_TEST_RUN=value (a zombie has no environment left to read: it is its
    parent's leak, and goes with it)."""
    needle = f"{VARIABLE}={value}".encode()
    me = str(os.getpid())
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == me:
            continue
        if needle in _environ(entry).split(b"\0"):
            line = _describe(entry)
            if line:
                found[int(entry)] = line
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("value", help=f"the {VARIABLE} value the test run was started with")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds processes still exiting get to go (default 30)")
    args = parser.parse_args(argv)
    if not args.value:
        parser.error("the value is empty: every process would match")
    deadline = time.monotonic() + args.grace
    while True:
        left = processes_carrying(args.value)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if left:
        print(f"leftovers: {len(left)} process(es) the test run started are still running "
              "(now killed):")
        for pid, line in left.items():
            print(f"  {line}")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours to signal
                pass
        return 1
    print("leftovers: none; every process the test run started has ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
