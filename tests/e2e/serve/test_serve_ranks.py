"""A multi-rank model on a real local Ray Serve (logical GPUs): the replica reserves a
GPU per rank, each rank sees only its own, frames stream, and a killed rank ends the
session naming it while the replica serves the next one with fresh ranks."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from paths import EXAMPLES

from reactor_serve.client import connect

pytestmark = pytest.mark.timeout(300)

OPERATOR = {"X-Operator-Token": "op"}


def rank_logs(logs: Path, ranks: int) -> list[list[str]]:
    return [(logs / f"rank-{rank}.log").read_text().splitlines() for rank in range(ranks)]


async def painted_frame(client, timeout=30.0):
    deadline = time.monotonic() + timeout
    while (image := (await client.next_frame()).image).shape != (96, 128, 3):
        assert time.monotonic() < deadline, f"no painted frame within {timeout} s"
    return image


@pytest.mark.parametrize("ranks", [2, 3])
async def test_each_rank_gets_a_gpu_of_the_replica_and_a_killed_rank_restarts_them_all(
    ray_serve, tmp_path, ranks
):
    model_dir = tmp_path / "split_painter"
    shutil.copytree(EXAMPLES / "split_painter", model_dir)
    logs = tmp_path / "logs"
    logs.mkdir()
    with (model_dir / "config.yml").open("a") as config:
        config.write(f"\nrank_log_dir: {str(logs)!r}\n")
    app = f"ranks{ranks}"
    url = ray_serve.deploy(app, {"operator_token": "op", "models": [
        {"path": str(model_dir), "ranks": ranks, "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/split-painter"
    try:
        client = await connect(model)
        try:
            first = await painted_frame(client)
            client.send_command("set_hue", {"hue": 0.6})
            deadline = time.monotonic() + 20
            while abs(float((await client.next_frame()).image.mean()) - float(first.mean())) < 8:
                assert time.monotonic() < deadline, "the hue command never showed"
            async with httpx.AsyncClient(timeout=10) as http:
                listed = (await http.get(f"{model}/sessions", headers=OPERATOR)).json()["sessions"]
            [session] = listed
            # The replica holds one GPU per rank, and each rank sees one of them only.
            assert len(session["gpu_ids"]) == ranks
            headers = [log[0].split() for log in rank_logs(logs, ranks)]
            seen = sorted(header[header.index("gpu") + 1] for header in headers)
            assert seen == sorted(str(g) for g in session["gpu_ids"]), (headers, session)
            assert all(header[header.index("device") + 1] == "cpu" for header in headers)
            victim = int(headers[1][headers[1].index("pid") + 1])
            os.kill(victim, signal.SIGKILL)
            ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=30)
        finally:
            await client.close()
        assert ended["data"]["reason"] == "error"
        assert f"rank 1 (pid {victim})" in ended["data"]["message"], ended
        assert "SIGKILL" in ended["data"]["message"], ended
        # The same replica serves the next session, on fresh ranks.
        again = await connect(model, timeout=90)
        try:
            await painted_frame(again)
            # Ten more frames, each a step every rank ran: enough steps to compare,
            # however slowly a loaded machine made the first ones.
            for _ in range(10):
                await painted_frame(again)
        finally:
            await again.close()
        fresh = [int(log[0].split()[5]) for log in rank_logs(logs, ranks)]
        assert victim not in fresh and len(set(fresh)) == ranks
        # The steps every rank logged since the restart are the same, in order.
        steps = [log[1:] for log in rank_logs(logs, ranks)]
        shortest = min(len(s) for s in steps)
        assert shortest > 5 and all(s[:shortest] == steps[0][:shortest] for s in steps)
    finally:
        ray_serve.delete(app)
