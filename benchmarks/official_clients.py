"""The official Python SDK against our server and the official runtime: one JSON line.

Serves the gradient example with `reactor run`, then the same model with the official
`reactor-runtime` 3.10 under Python 3.12 (benchmarks/models/official_gradient: the
example's class ported to 3.10's API, drawing with the example's own `render_batch`,
copied beside it at set-up), one after the other on this machine, and drives each with
`reactor-sdk` 1.13 from this process:

  ttff_ms               Reactor.connect() called -> the first main_video frame, median
                        of CONNECTS sessions after the server's first (its first is
                        `cold_ttff_ms`: one sample, whichever server the SDK met first
                        pays its own start-up too)
  connect_ms            Reactor.connect() called -> it returned (ready), median as above
  schema_ms             request_schema() round trip, median of SCHEMA_CALLS
  command_rtt_ms_p50    send_command("set_brightness") -> its reply, COMMANDS in a row
  command_rtt_ms_p95
  upload_mb_s           upload_file() of UPLOAD_MB MiB (reserve, then PUT), median of 3
  step_ms_p50           step() of a stepped session, median of STEPS; null (with
                        `step_error`) where the server takes no stepped session

Ours is printed at the top level, the official runtime's under "official", and
"ours_better" says per figure whether ours is at least as good (issue 20's target:
all of them). The official runtime always gives its clients a STUN server; a local
responder (benchmarks/_stun.py) answers for it so that no connect waits on a network
this machine does not have.

The official runtime: REACTOR_OFFICIAL_PYTHON names a Python that has
reactor-runtime 3.10 installed; otherwise benchmarks/.official-runtime is made (once)
with Python 3.12 (python3.12 on PATH, or pyenv's) and `pip install reactor-runtime==3.10.0`.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from _local import free_port, reactor_run_of, stop_process, wait_healthy
from _stun import stun_responder

ROOT = Path(__file__).parent.parent
GRADIENT = ROOT / "examples" / "gradient"
PORT = Path(__file__).parent / "models" / "official_gradient"
OFFICIAL_VENV = Path(__file__).parent / ".official-runtime"
OFFICIAL_VERSION = "3.10.0"

CONNECTS = 5
SCHEMA_CALLS = 10
COMMANDS = 200
UPLOAD_MB = 16
STEPS = 20
# Lower is better for these; upload_mb_s is higher-is-better.
LOWER_IS_BETTER = ("ttff_ms", "connect_ms", "schema_ms", "command_rtt_ms_p50",
                   "command_rtt_ms_p95", "step_ms_p50")


# --------------------------------------------------------------------------- servers


def official_python() -> str:
    """A Python with the official runtime installed, made if need be."""
    given = os.environ.get("REACTOR_OFFICIAL_PYTHON")
    if given:
        return given
    python = OFFICIAL_VENV / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3.12") or next(
            iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))),
            None,
        )
        if base is None:
            raise SystemExit("the official runtime needs Python 3.12: none on PATH or in pyenv "
                             "(or set REACTOR_OFFICIAL_PYTHON)")
        subprocess.run([base, "-m", "venv", str(OFFICIAL_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q",
                        f"reactor-runtime=={OFFICIAL_VERSION}", "pyyaml"], check=True)
    return str(python)


def render_module(example: Path) -> str:
    """The example's drawing code (its module constants and `render_batch`), as a
    module of its own for the ported model."""
    source = example.read_text()
    keep = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "render_batch":
            keep.append(node)
        elif isinstance(node, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id.isupper() for t in node.targets
        ):
            keep.append(node)
    return "import numpy as np\n\n\n" + "\n\n\n".join(
        ast.get_source_segment(source, node) or "" for node in keep
    ) + "\n"


@contextlib.asynccontextmanager
async def official_runtime(python: str) -> AsyncIterator[str]:
    """The ported gradient on the official runtime; yields its base URL."""
    workdir = Path(tempfile.mkdtemp(prefix="official-gradient-"))
    shutil.copytree(PORT, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    # The example's config and drawing code, as they are now.
    shutil.copy(GRADIENT / "config.yml", workdir / "config.yml")
    (workdir / "gradient_render.py").write_text(render_module(GRADIENT / "pipeline.py"))
    log = open(workdir / "runtime.log", "wb")
    async with stun_responder() as stun_url:
        port = free_port()
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "STUN_SERVERS": stun_url}
        server = subprocess.Popen([python, "-m", "reactor_runtime.serve"], cwd=workdir, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            # It answers /health 200 while still loading: ready is "available".
            await wait_healthy(base, 120, ready=lambda reply: reply.status_code == 200
                               and reply.json().get("state") == "available")
            yield base
        except BaseException:
            log.flush()
            sys.stderr.write("the official runtime's log:\n"
                             + (workdir / "runtime.log").read_text(errors="replace")[-4000:])
            raise
        finally:
            stop_process(server)
            log.close()
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- measuring


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def connect_timed(api_url: str) -> tuple[Any, float, float]:
    """A connected client, the seconds its connect() took and to its first frame. Timed
    from the attempt that got the model: both servers answer 409 while the session
    before is still closing, which is not what this measures."""
    from reactor_sdk import Reactor

    loop = asyncio.get_running_loop()
    reactor = Reactor(model_name="gradient", local=True, api_url=api_url)
    first = asyncio.Event()
    # The SDK calls frame handlers on a thread of its own.
    reactor.track("main_video").on_frame(lambda frame: loop.call_soon_threadsafe(first.set))
    started = await connect_when_free(reactor)
    connected = time.perf_counter()
    await asyncio.wait_for(first.wait(), 30)
    return reactor, connected - started, time.perf_counter() - started


async def streamed(api_url: str, commands: int, upload_mb: int, connects: int) -> dict[str, Any]:
    reactor, _, cold_ttff = await connect_timed(api_url)
    await reactor.disconnect()
    connect_s, ttff_s = [], []
    for _ in range(connects):
        reactor, connect, ttff = await connect_timed(api_url)
        connect_s.append(connect)
        ttff_s.append(ttff)
        await reactor.disconnect()
    reactor, _, _ = await connect_timed(api_url)
    try:
        schema = []
        for _ in range(SCHEMA_CALLS):
            at = time.perf_counter()
            await reactor.request_schema()
            schema.append(time.perf_counter() - at)
        rtts = []
        for i in range(commands):
            at = time.perf_counter()
            await reactor.send_command("set_brightness", {"brightness": 0.5 + (i % 2)})
            rtts.append(time.perf_counter() - at)
        data = os.urandom(upload_mb * 1024 * 1024)
        rates = []
        for i in range(3):
            at = time.perf_counter()
            await reactor.upload_file(data, name=f"blob{i}.bin", mime_type="application/octet-stream")
            rates.append(upload_mb / (time.perf_counter() - at))
    finally:
        await reactor.disconnect()
    return {
        "ttff_ms": ms(statistics.median(ttff_s)),
        "connect_ms": ms(statistics.median(connect_s)),
        "cold_ttff_ms": ms(cold_ttff),
        "schema_ms": ms(statistics.median(schema)),
        "command_rtt_ms_p50": ms(percentile(rtts, 0.5)),
        "command_rtt_ms_p95": ms(percentile(rtts, 0.95)),
        "upload_mb_s": round(statistics.median(rates), 1),
    }


async def stepped(api_url: str, steps: int) -> dict[str, Any]:
    from reactor_sdk import Reactor, ReactorError

    reactor = Reactor(model_name="gradient", local=True, api_url=api_url, generation="stepped")
    times = []
    try:
        await connect_when_free(reactor)
        for i in range(steps):
            at = time.perf_counter()
            await reactor.step(state={"brightness": 0.5 + (i % 2)})
            times.append(time.perf_counter() - at)
    except ReactorError as exc:
        return {"step_ms_p50": None, "step_error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        with contextlib.suppress(Exception):
            await reactor.disconnect()
    return {"step_ms_p50": ms(statistics.median(times))}


async def connect_when_free(reactor: Any, timeout: float = 30.0) -> float:
    """Connect once the previous session has let go of the model: both servers answer
    409 while the one before is still closing. Returns when (`time.perf_counter()`)
    the attempt that got the model started."""
    from reactor_sdk import ConflictError

    deadline = time.monotonic() + timeout
    while True:
        started = time.perf_counter()
        try:
            await reactor.connect()
            return started
        except ConflictError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def measure(api_url: str, args: argparse.Namespace) -> dict[str, Any]:
    figures = await streamed(api_url, args.commands, args.upload_mb, args.connects)
    figures.update(await stepped(api_url, args.steps))
    return figures


def ours_better(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, bool | None]:
    verdict: dict[str, bool | None] = {}
    for key in (*LOWER_IS_BETTER, "upload_mb_s"):
        a, b = ours.get(key), theirs.get(key)
        if a is None or b is None:
            verdict[key] = None if a is None and b is None else a is not None
        else:
            verdict[key] = a >= b if key == "upload_mb_s" else a <= b
    return verdict


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=COMMANDS)
    parser.add_argument("--upload-mb", type=int, default=UPLOAD_MB)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--connects", type=int, default=CONNECTS)
    args = parser.parse_args()
    import reactor_sdk

    python = official_python()
    config = yaml.safe_load((GRADIENT / "config.yml").read_text())
    async with reactor_run_of(GRADIENT, config) as ours_server:
        ours = await measure(ours_server.base, args)
    async with official_runtime(python) as base:
        official = await measure(base, args)
    print(json.dumps({
        "benchmark": "official_clients",
        "client": f"reactor-sdk {getattr(reactor_sdk, '__version__', '?')}",
        **ours,
        "official": official,
        "ours_better": ours_better(ours, official),
    }), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
