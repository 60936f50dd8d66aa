"""Soak: memory, fds and threads over many sequential sessions; prints one JSON line.

Each session is what an operator's smoke test does with the gradient example: open,
10 frames, one command (set_brightness) and a few frames after it, stop. The sessions
run one after another against

  reactor_run   `reactor run` (a subprocess): the server process and its model child
  serve         a local Ray (logical GPUs) with Serve: the model replica's actor
                process and its model child; the ingress replica(s) apart

and for each, summed over those processes (read from /proc):

  sessions                    sessions served
  rss_mb_start                anonymous RSS (RssAnon) before the first session
  rss_mb_warm                 the same after the warm-up (the first 20 sessions)
  rss_mb_end                  the same after the last session
  rss_growth_kb_per_session   (end - warm) / (sessions - warm-up): issue 19 asks <= 50
  fds_growth                  open fds at the end minus after the warm-up
  threads_growth              threads at the end minus after the warm-up
  child_processes_left        descendant processes at the end minus before the first
                              session (a model child or encoder left behind per session)

The deterministic check that no session is left behind is tests/e2e/local/test_session_leaks.py;
this one shows the process-level effect, and takes minutes (about 0.5-1 s a session).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from _local import free_port, reactor_run_of

ROOT = Path(__file__).parent.parent
GRADIENT = ROOT / "examples" / "gradient"
WARMUP = 20
FRAMES = 10


# ---- /proc ---------------------------------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _children() -> dict[int, list[int]]:
    """Parent pid -> its child pids, for every process on the machine."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def sample(pids: list[int]) -> dict[str, float]:
    """RssAnon (MB), open fds and threads, summed over `pids` and their descendants."""
    everyone = [p for pid in pids for p in [pid, *descendants(pid)]]
    rss_kb = fds = threads = 0
    by_process = {}
    for pid in everyone:
        try:
            status = _status(pid)
            anon = int(status.get("RssAnon", "0 kB").split()[0])
            by_process[pid] = round(anon / 1024, 1)
            rss_kb += anon
            threads += int(status.get("Threads", "0"))
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue  # it ended meanwhile
    if os.environ.get("SOAK_VERBOSE"):
        print(f"soak: RssAnon MB by process {by_process}", file=sys.stderr, flush=True)
    return {"rss_mb": rss_kb / 1024, "fds": fds, "threads": threads,
            "children": len(everyone) - len(pids)}


# ---- sessions ------------------------------------------------------------------------


async def one_session(base: str) -> None:
    from reactor_serve.client import connect

    client = await connect(base, timeout=60)
    try:
        for _ in range(FRAMES):
            await client.next_frame(timeout=30)
        client.send_command("set_brightness", {"brightness": 0.5})
        for _ in range(3):
            await client.next_frame(timeout=30)
    finally:
        await client.close()


async def soak(
    base: str, sessions: int, measured: Callable[[], list[int]],
    settle: Callable[[], Awaitable[None]],
) -> dict[str, Any]:
    """`sessions` sequential sessions at `base`; the figures of the processes that
    `measured()` names (each sampled once `settle()` says the server is idle)."""
    await settle()
    start = sample(measured())
    warm = start
    for index in range(sessions):
        await one_session(base)
        if index + 1 == min(WARMUP, sessions):
            await settle()
            warm = sample(measured())
    await settle()
    end = sample(measured())
    counted = max(1, sessions - WARMUP)
    return {
        "sessions": sessions,
        "rss_mb_start": round(start["rss_mb"], 1),
        "rss_mb_warm": round(warm["rss_mb"], 1),
        "rss_mb_end": round(end["rss_mb"], 1),
        "rss_growth_kb_per_session": round((end["rss_mb"] - warm["rss_mb"]) * 1024 / counted, 1),
        "fds_growth": end["fds"] - warm["fds"],
        "threads_growth": end["threads"] - warm["threads"],
        "child_processes_left": end["children"] - start["children"],
    }


async def _idle(base: str, timeout: float = 30.0) -> None:
    """Wait until the server holds no session (the last one's teardown is done)."""
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            health = (await http.get(f"{base}/health")).json()
            if not health.get("live_sessions"):
                break
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # aiortc's last timers and the encoder threads wind down


# ---- targets -------------------------------------------------------------------------


async def reactor_run(sessions: int) -> dict[str, Any]:
    config = {"width": 640, "height": 480, "chunk_size": 4}
    async with reactor_run_of(GRADIENT, config) as server:
        return await soak(server.base, sessions, lambda: [server.pid],
                          lambda: _idle(server.base))


def _serve_processes(app: str) -> dict[str, list[int]]:
    """Deployment name -> the pids of its replica actors (Ray titles them
    `ray::ServeReplica:<app>:<deployment>`)."""
    found: dict[str, list[int]] = {}
    prefix = f"ray::ServeReplica:{app}:"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if cmdline.startswith(prefix):
            found.setdefault(cmdline[len(prefix):].strip(), []).append(int(entry))
    return found


async def serve(sessions: int) -> dict[str, Any]:
    import ray
    from ray import serve as ray_serve

    from reactor_serve.serve.app import build_app

    port = free_port()
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False,
             log_to_driver=False)
    try:
        ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = {"ingress_replicas": 1, "models": [
            {"path": str(GRADIENT), "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
             "cpus_per_replica": 0.5}]}
        ray_serve.run(build_app(app), name="soak", route_prefix="/soak")
        base = f"http://127.0.0.1:{port}/soak/models/gradient"
        processes = _serve_processes("soak")
        replica = [pid for name, pids in processes.items() if name.startswith("model-")
                   for pid in pids]
        ingress = [pid for name, pids in processes.items() if not name.startswith("model-")
                   for pid in pids]
        if not replica:
            raise RuntimeError(f"no model replica process found: {processes}")
        ingress_start = sample(ingress)
        # The client's stop returns once the replica has ended the session; what is
        # left (the directory record, metrics) settles within a second or two.
        result = await soak(base, sessions, lambda: replica, lambda: asyncio.sleep(2.0))
        ingress_end = sample(ingress)
        result["ingress_rss_mb_start"] = round(ingress_start["rss_mb"], 1)
        result["ingress_rss_mb_end"] = round(ingress_end["rss_mb"], 1)
        ray_serve.delete("soak")
        return result
    finally:
        ray_serve.shutdown()
        ray.shutdown()


async def measure(sessions: int, targets: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "soak"}
    if "reactor_run" in targets:
        result["reactor_run"] = await reactor_run(sessions)
    if "serve" in targets:
        result["serve"] = await serve(sessions)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300, help="sequential sessions per target")
    parser.add_argument("--target", choices=["reactor_run", "serve"], action="append",
                        help="measure only this target (repeatable; default: both)")
    args = parser.parse_args()
    targets = args.target or ["reactor_run", "serve"]
    print(json.dumps(asyncio.run(measure(args.sessions, targets))), flush=True)


if __name__ == "__main__":
    main()
