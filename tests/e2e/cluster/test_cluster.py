"""The app on multi-node Ray clusters: GPU nodes that scale from zero, and a fixed
GPU worker node. Each cluster is a real `ray start --head` with real worker raylets
on this machine (tests/support/local_cluster.py); the model code reaches the nodes only
through `reactor deploy`, which ships it from a project directory that is deleted
before any replica starts."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from local_cluster import LocalCluster, write_project
from paths import TEST_MODELS

from reactor_serve.client.session import connect

WHERE_MODEL = TEST_MODELS / "serve" / "where"

pytestmark = pytest.mark.timeout(600)

ANNOUNCED = "203.0.113.9"  # TEST-NET-3: an address that is surely not this machine's
PORTS = "46100-46199"


def host_candidates(sdp: str) -> list[tuple[str, int]]:
    """(address, port) of each host candidate in an SDP."""
    found = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:") and " typ host" in line:
            fields = line.split()
            found.append((fields[4], int(fields[5])))
    return found


def deploy_and_forget_the_files(cluster: LocalCluster, project: Path) -> None:
    result = cluster.deploy(project / "serve_config.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gcs://_ray_pkg_" in result.stdout
    # Nothing on this machine serves the model's files from here on but the package.
    shutil.rmtree(project)
    cluster.wait_for(cluster.app_running, 180, "the application to run")


async def where(client, timeout: float = 60.0) -> dict[str, Any]:
    """The `where` message the model sends when its session connects."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for envelope in client.peer.messages:
            data = envelope.get("data") if isinstance(envelope, dict) else None
            if isinstance(data, dict) and data.get("type") == "where":
                return data
        await asyncio.sleep(0.1)  # the poll interval of a wait bounded by `timeout`
    raise AssertionError(f"no 'where' message; got {json.dumps(client.peer.messages)[:500]}")


def assert_shipped(cluster: LocalCluster, place: dict[str, Any]) -> None:
    # Loaded from the package Ray unpacked for the app on that node.
    runtime_resources = str(cluster.temp_dir)
    assert place["file"].startswith(runtime_resources), place
    assert "/runtime_resources/working_dir_files/_ray_pkg_" in place["file"], place
    assert place["file"] == str(Path(place["cwd"]) / "models" / "where" / "pipeline.py")


async def test_a_waiting_session_brings_up_a_gpu_node_that_goes_away_when_idle(tmp_path):
    cluster = LocalCluster(
        head_cpus=2,
        worker_types={"gpu": {"resources": {"CPU": 2, "GPU": 1},
                              "min_workers": 0, "max_workers": 1}},
        idle_timeout_s=6,
        # What the deploy manifests set on a cluster whose GPU nodes scale from zero.
        env={"REACTOR_GPU_NODES": "autoscaled"},
    )
    try:
        await asyncio.to_thread(cluster.start)
        project = write_project(tmp_path, cluster.http_port, WHERE_MODEL, min_replicas=0, max_replicas=1,
                               warm_spares=0, admission_timeout_s=240, downscale_delay_s=2)
        await asyncio.to_thread(deploy_and_forget_the_files, cluster, project)
        head = await asyncio.to_thread(cluster.head_node_id)
        assert [n["node_id"] for n in await asyncio.to_thread(cluster.alive_nodes)] == [head]
        assert await asyncio.to_thread(cluster.replica_nodes, "model-where") == []

        # Through the head's HTTP proxy, as a browser would come.
        client = await connect(f"{cluster.http}/models/where", timeout=240)
        try:
            frame = await client.next_frame(timeout=60)
            assert frame.image.shape == (96, 128, 3)
            place = await where(client)
            assert place["node_id"] != head
            # "auto" asked for a GPU, and Ray gave the replica the new node's GPU.
            assert len(place["gpu_ids"]) == 1
            assert_shipped(cluster, place)
            nodes = await asyncio.to_thread(cluster.alive_nodes)
            assert {n["node_id"] for n in nodes} == {head, place["node_id"]}
            assert await asyncio.to_thread(cluster.replica_nodes, "model-where") == [
                place["node_id"]]
        finally:
            await client.close()

        # The session ended: the replica is scaled away, then the idle node removed.
        await asyncio.to_thread(
            cluster.wait_for, lambda: not cluster.replica_nodes("model-where"), 90,
            "the replica to be scaled down")
        await asyncio.to_thread(
            cluster.wait_for,
            lambda: [n["node_id"] for n in cluster.alive_nodes()] == [head], 120,
            "the idle GPU node to be removed")
    finally:
        await asyncio.to_thread(cluster.stop)


async def test_sessions_run_on_the_gpu_worker_of_a_fixed_two_node_cluster(tmp_path):
    cluster = LocalCluster(head_cpus=2)
    try:
        await asyncio.to_thread(cluster.start)
        # The worker's own media settings, as a cloud node with a public address and a
        # firewall opened for a port range would have them.
        await asyncio.to_thread(cluster.add_node, cpus=2, gpus=1, env={
            "REACTOR_ANNOUNCED_ADDRESS": ANNOUNCED, "REACTOR_UDP_PORT_RANGE": PORTS})
        head = await asyncio.to_thread(cluster.head_node_id)
        worker = next(n["node_id"] for n in await asyncio.to_thread(cluster.alive_nodes)
                      if n["node_id"] != head)
        # No declaration: "auto" sees the GPU that is up.
        project = write_project(tmp_path, cluster.http_port, WHERE_MODEL, min_replicas=1, max_replicas=1,
                               warm_spares=0, admission_timeout_s=120)
        await asyncio.to_thread(deploy_and_forget_the_files, cluster, project)
        assert await asyncio.to_thread(cluster.replica_nodes, "model-where") == [worker]
        # The app brought its Grafana dashboard to the head, where Ray's Grafana reads.
        dashboards = cluster.temp_dir / "session_latest" / "metrics" / "grafana" / "dashboards"
        await asyncio.to_thread(
            cluster.wait_for,
            lambda: (dashboards / "reactor_serve_grafana_dashboard.json").is_file(), 60,
            "the Grafana dashboard on the head")

        for _ in range(2):  # the replica serves one session after another
            client = await connect(f"{cluster.http}/models/where", timeout=120)
            try:
                await client.next_frame(timeout=60)
                place = await where(client)
                assert place["node_id"] == worker
                assert len(place["gpu_ids"]) == 1
                assert_shipped(cluster, place)
                # The replica on the worker answered with that node's media settings.
                hosts = host_candidates(client.peer.pc.remoteDescription.sdp)
                low, high = map(int, PORTS.split("-"))
                assert hosts and all(ip == ANNOUNCED and low <= port <= high
                                     for ip, port in hosts), hosts
            finally:
                await client.close()
    finally:
        await asyncio.to_thread(cluster.stop)
