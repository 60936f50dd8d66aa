"""Cluster benchmark: prints one JSON line.

A real multi-node Ray cluster on this machine (tests/support/local_cluster.py): a head with no
GPUs and Ray's fake multi-node autoscaler with one GPU worker type, `min_workers: 0`.
The app is shipped with `reactor deploy` (model min_replicas 0, gpus_per_replica auto,
REACTOR_GPU_NODES=autoscaled on the nodes), then one session is opened through the
head's HTTP proxy while no GPU node exists.

  scale_from_zero_s       session request -> its first frame, with no GPU node up
  phases_s                where that time goes, from the same clocks:
    node_launch           request -> the GPU node is alive (the autoscaler and the
                          fake provider: a real cloud VM takes minutes here instead)
    replica_start         node alive -> the model replica actor is alive (Ray worker
                          start, runtime_env unpacking, our replica __init__ and the
                          model's load())
    first_frame           replica alive -> first frame (admission, WebRTC negotiation,
                          the first emitted frame): ours
  ours_s                  replica_start + first_frame: the part a faster runtime can cut
  session_on_worker_node  the session's replica ran on the new node, not the head
  ttff_ms_on_new_node     a second session on that node's warm replica: request ->
                          first frame
  scale_to_zero_s         the last session closed -> the GPU node removed; includes the
                          configured downscale_delay_s and idle timeout (`config`)
  nodes_peak              most nodes alive at once (the head and one GPU node: 2)

Progress goes to stderr; the JSON line to stdout. Every process started here is
stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from local_cluster import LocalCluster, write_project  # noqa: E402

from reactor_serve.client.session import connect  # noqa: E402

MODEL = ROOT / "tests" / "models" / "serve" / "where"
DOWNSCALE_DELAY_S = 5.0
IDLE_TIMEOUT_S = 6.0


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


class Watcher:
    """Polls the cluster in a thread: when the GPU node and the replica first appear,
    and the most nodes seen at once."""

    def __init__(self, cluster: LocalCluster, head: str) -> None:
        self.cluster, self.head = cluster, head
        self.node_up: float | None = None
        self.replica_up: float | None = None
        self.nodes_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            nodes = self.cluster.alive_nodes()
            now = time.monotonic()
            self.nodes_peak = max(self.nodes_peak, len(nodes))
            if self.node_up is None and any(n["node_id"] != self.head for n in nodes):
                self.node_up = now
            if self.replica_up is None and self.cluster.replica_nodes("model-where"):
                self.replica_up = time.monotonic()
            time.sleep(0.2)


async def first_frame(url: str) -> tuple[float, dict]:
    """Seconds from the request to the first frame, and where the session ran."""
    start = time.monotonic()
    client = await connect(url, timeout=300)
    try:
        await client.next_frame(timeout=60)
        elapsed = time.monotonic() - start
        for _ in range(100):
            hits = [m["data"] for m in client.peer.messages
                    if isinstance(m.get("data"), dict) and m["data"].get("type") == "where"]
            if hits:
                return elapsed, hits[0]
            await asyncio.sleep(0.1)
        raise RuntimeError("the model never said where it runs")
    finally:
        await client.close()


async def run() -> dict:
    cluster = LocalCluster(
        head_cpus=2,
        worker_types={"gpu": {"resources": {"CPU": 2, "GPU": 1},
                              "min_workers": 0, "max_workers": 1}},
        idle_timeout_s=IDLE_TIMEOUT_S,
        env={"REACTOR_GPU_NODES": "autoscaled"},
    )
    with tempfile.TemporaryDirectory() as scratch:
        try:
            log("starting the head")
            await asyncio.to_thread(cluster.start)
            project = write_project(Path(scratch), cluster.http_port, MODEL, min_replicas=0,
                                    max_replicas=1, warm_spares=0, admission_timeout_s=300,
                                    downscale_delay_s=DOWNSCALE_DELAY_S)
            log("reactor deploy")
            result = await asyncio.to_thread(cluster.deploy, project / "serve_config.yaml")
            if result.returncode != 0:
                raise RuntimeError(f"reactor deploy failed: {result.stderr[-2000:]}")
            await asyncio.to_thread(cluster.wait_for, cluster.app_running, 180, "the app")
            head = await asyncio.to_thread(cluster.head_node_id)
            watcher = Watcher(cluster, head)
            watcher.start()

            log("first session, no GPU node up")
            requested = time.monotonic()
            scale_from_zero_s, place = await first_frame(f"{cluster.http}/models/where")
            framed = requested + scale_from_zero_s
            log("second session, on the warm replica")
            ttff_s, second = await first_frame(f"{cluster.http}/models/where")
            closed = time.monotonic()

            log("waiting for the GPU node to go")
            await asyncio.to_thread(
                cluster.wait_for,
                lambda: [n["node_id"] for n in cluster.alive_nodes()] == [head], 300,
                "the GPU node to be removed", 0.2)
            scale_to_zero_s = time.monotonic() - closed
            watcher.stop()
        finally:
            await asyncio.to_thread(cluster.stop)

    node_up = watcher.node_up or framed
    replica_up = watcher.replica_up or framed
    phases = {
        "node_launch": round(node_up - requested, 2),
        "replica_start": round(replica_up - node_up, 2),
        "first_frame": round(framed - replica_up, 2),
    }
    return {
        "scale_from_zero_s": round(scale_from_zero_s, 2),
        "session_on_worker_node": place["node_id"] != head and second["node_id"] == place["node_id"],
        "ttff_ms_on_new_node": round(ttff_s * 1000, 1),
        "scale_to_zero_s": round(scale_to_zero_s, 2),
        "nodes_peak": watcher.nodes_peak,
        "phases_s": phases,
        "ours_s": round(phases["replica_start"] + phases["first_frame"], 2),
        "gpus_given": len(place["gpu_ids"]),
        "config": {"downscale_delay_s": DOWNSCALE_DELAY_S, "idle_timeout_s": IDLE_TIMEOUT_S,
                   "provider": "fake_multinode (nodes are raylets on this machine)"},
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main()
