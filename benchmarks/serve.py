"""Ray Serve benchmark: prints one JSON line.

Starts a local Ray and Serve, deploys the gradient example, and measures with the
Python client over WebRTC on 127.0.0.1:

  ttff_ms_warm          start_session -> first decoded frame, on an idle warm replica
  ttff_ms_queued_spare  the same for a session arriving while another is live and
                        the warm spare kept for it is idle
  ingress_overhead_ms   signaling time (start_session -> SDP answer) through the Serve
                        ingress minus the same through `reactor run`'s server
  scale_up_s            a session waiting (every replica busy, warm_spares 0) -> the
                        new replica takes it; the example's load() is ~0, so this is
                        Serve's own start-up
  sessions              sessions measured in all

Targets (issue #4): ttff_ms_warm <= 600 and ingress_overhead_ms <= 100 on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from _local import free_port

ROOT = Path(__file__).parent.parent
GRADIENT = ROOT / "examples" / "gradient"



async def _timed_session(base: str) -> tuple[float, float]:
    """(signaling seconds, time-to-first-frame seconds) of one session."""
    from reactor_serve.client import connect

    started = time.monotonic()
    client = await connect(base)
    answered = time.monotonic()
    await client.next_frame(timeout=30)
    first = time.monotonic()
    await client.close()
    return answered - started, first - started


def _running(app: str, deployment: str) -> int:
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return status.replica_states.get("RUNNING", 0)


async def _wait_replicas(app: str, deployment: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _running(app, deployment) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{app}/{deployment} did not reach {count} replicas")
        await asyncio.sleep(0.2)


async def _reactor_run_signaling(rounds: int) -> list[float]:
    import uvicorn

    from reactor_serve.local.app import create_app

    port = free_port()
    app = create_app(GRADIENT, settings_override={"loopback_candidates": True})
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        return [(await _timed_session(f"http://127.0.0.1:{port}"))[0] for _ in range(rounds)]
    finally:
        server.should_exit = True
        thread.join(10)


async def measure(rounds: int) -> dict[str, Any]:
    import ray
    from ray import serve

    from reactor_serve.client import connect
    from reactor_serve.serve.app import build_app

    port = free_port()
    ray.init(num_cpus=8, num_gpus=0, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    sessions = 0
    try:
        spare_app = {"models": [{"path": str(GRADIENT), "min_replicas": 1, "max_replicas": 3,
                                 "warm_spares": 1, "downscale_delay_s": 2,
                                 "cpus_per_replica": 0.5}]}
        serve.run(build_app(spare_app), name="bench", route_prefix="/bench")
        base = f"http://127.0.0.1:{port}/bench/models/gradient"
        await _wait_replicas("bench", "model-gradient", 1)

        warm, serve_signaling = [], []
        for _ in range(rounds):
            signaling, ttff = await _timed_session(base)
            serve_signaling.append(signaling)
            warm.append(ttff)
            sessions += 1
            await _wait_replicas("bench", "model-gradient", 1)

        spare = []
        for _ in range(rounds):
            holder = await connect(base)
            await holder.next_frame(timeout=30)
            await _wait_replicas("bench", "model-gradient", 2)  # the spare is warm
            spare.append((await _timed_session(base))[1])
            await holder.close()
            sessions += 2
            await _wait_replicas("bench", "model-gradient", 1)
        serve.delete("bench")

        no_spare = {"models": [{"path": str(GRADIENT), "min_replicas": 1, "max_replicas": 2,
                                "warm_spares": 0, "downscale_delay_s": 1,
                                "admission_timeout_s": 120, "cpus_per_replica": 0.5}]}
        serve.run(build_app(no_spare), name="cold", route_prefix="/cold")
        cold = f"http://127.0.0.1:{port}/cold/models/gradient"
        scale_up = []
        for _ in range(max(1, rounds // 2)):
            await _wait_replicas("cold", "model-gradient", 1)
            holder = await connect(cold)
            await holder.next_frame(timeout=30)
            waited, _ = await _timed_session(cold)  # waits for a new replica
            scale_up.append(waited)
            await holder.close()
            sessions += 2
        serve.delete("cold")
    finally:
        serve.shutdown()
        ray.shutdown()

    local_signaling = await _reactor_run_signaling(rounds)
    sessions += rounds
    return {
        "ttff_ms_warm": round(statistics.median(warm) * 1000, 1),
        "ttff_ms_queued_spare": round(statistics.median(spare) * 1000, 1),
        "ingress_overhead_ms": round(
            (statistics.median(serve_signaling) - statistics.median(local_signaling)) * 1000, 1
        ),
        "scale_up_s": round(statistics.median(scale_up), 2),
        "sessions": sessions,
        "signaling_ms_serve": round(statistics.median(serve_signaling) * 1000, 1),
        "signaling_ms_reactor_run": round(statistics.median(local_signaling) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="sessions per measurement")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.rounds))))


if __name__ == "__main__":
    main()
