"""Finding the rank processes of a model under `reactor run`, and copying an example
model directory with settings added, for the multi-rank end-to-end tests."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

RANK_MODULE = "reactor_serve.runtime.ranks.rank_process"


def model_copy(source: Path, tmp_path: Path, **config) -> Path:
    """A copy of the model directory `source` whose config.yml adds `config`."""
    copy = tmp_path / source.name
    shutil.copytree(source, copy)
    lines = [f"{key}: {value!r}" if isinstance(value, str) else f"{key}: {value}"
             for key, value in config.items()]
    with (copy / "config.yml").open("a") as file:
        file.write("\n" + "\n".join(lines) + "\n")
    return copy


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def rank_pids(run_pid: int) -> dict[int, int]:
    """The rank processes under `reactor run` (model process -> ranks), by rank."""
    ranks = {}
    for model_process in children(run_pid):
        for pid in children(model_process):
            line = cmdline(pid)
            if RANK_MODULE in line:
                ranks[int(line[line.index("--rank") + 1])] = pid
    return ranks


def wait_for_ranks(run_pid: int, count: int, avoid: set[int] = frozenset(),
                   timeout: float = 60.0) -> dict[int, int]:
    """The `count` rank processes under `reactor run`, none of them in `avoid`."""
    deadline = time.monotonic() + timeout
    ranks: dict[int, int] = {}
    while time.monotonic() < deadline:
        ranks = rank_pids(run_pid)
        if len(ranks) == count and not set(ranks.values()) & avoid:
            return ranks
        time.sleep(0.1)
    raise AssertionError(f"no {count} fresh ranks under reactor run within {timeout} s: {ranks}")


def wait_until_gone(pids, timeout: float = 10.0) -> None:
    """Until none of `pids` is a live process (a zombie counts as gone)."""
    for pid in pids:
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{pid}").exists():
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except OSError:
                break
            assert time.monotonic() < deadline, f"process {pid} lives on"
            time.sleep(0.1)


def fail_rank(pid: int, failure: str) -> None:
    """Kill the rank ("killed"), or stop it: alive, and never answering again."""
    os.kill(pid, signal.SIGKILL if failure == "killed" else signal.SIGSTOP)


def check_failure_named(ended: dict, failure: str, victim: int, rank: int,
                        timeout_s: float) -> None:
    """`ended` (a sessionEnded message) says which rank failed and how."""
    assert ended["data"]["reason"] == "error"
    message = ended["data"]["message"]
    if failure == "killed":
        assert "WorkerCrashed" in message and f"rank {rank} (pid {victim})" in message, message
        assert "SIGKILL" in message, message
    else:
        assert "WorkerTimeout" in message, message
        assert f"no answer within {timeout_s:g} s" in message, message
        assert f"{rank} (stopped by a signal)" in message, message
