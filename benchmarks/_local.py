"""Helpers the benchmarks share (they run as scripts, so this sits beside them)."""

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_healthy(
    base: str, timeout: float = 30.0,
    ready: Callable[[httpx.Response], bool] = lambda reply: reply.status_code == 200,
) -> None:
    """Wait until the server at `base` answers /health as `ready` says (by default:
    200, which is what `reactor run` answers once its model is loaded)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            try:
                if ready(await http.get(f"{base}/health")):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the server did not become healthy at {base}")


@dataclass
class ReactorRun:
    """A `reactor run` subprocess serving a model: its URL and process id."""

    base: str
    pid: int


@contextlib.contextmanager
def model_copy_of(
    model: Path, config: dict[str, Any], prepare: Callable[[Path], None] | None = None
) -> Iterator[Path]:
    """A copy of the model directory `model` whose config.yml is `config`, removed after.
    `prepare(copy)` may change the copy further (another model class, say)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"reactor-{model.name}-"))
    model_dir = workdir / model.name
    shutil.copytree(model, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (model_dir / "config.yml").write_text(yaml.safe_dump(config))
    if prepare is not None:
        prepare(model_dir)
    try:
        yield model_dir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.asynccontextmanager
async def reactor_run_of(
    model: Path, config: dict[str, Any], prepare: Callable[[Path], None] | None = None
) -> AsyncIterator[ReactorRun]:
    """`reactor run` of a copy of `model` whose config.yml is `config` (see
    model_copy_of for `prepare`), healthy; the process stopped and the copy removed after."""
    with model_copy_of(model, config, prepare) as model_dir:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "reactor_serve.cli", "run", str(model_dir), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_healthy(base)
            yield ReactorRun(base, server.pid)
        finally:
            stop_process(server)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
