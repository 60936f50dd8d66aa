"""Multi-rank models on a real local Ray Serve (logical GPUs), a runner-driven one and
one whose own class runs on every rank: the replica reserves a GPU per rank, each rank
sees only its own, frames stream, and a killed rank ends the session naming it while
the replica serves the next one with fresh ranks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from paths import EXAMPLES
from rank_counts import RANK_COUNTS
from rank_logs import rank_logs, ranks_logged
from rank_processes import model_copy
from waits import model_frame

from reactor_serve.client import connect

# A hang guard past the sum of the waits inside, each of which fails first naming what
# it awaited: a deploy of ranked replicas, five media windows and a reload's three.
pytestmark = pytest.mark.timeout(900)

OPERATOR = {"X-Operator-Token": "op"}
# How long a wait for media (a frame, a message, an end) may take on a loaded machine.
MEDIA = 60


async def a_gpu_each(model: str, logs: Path, ranks: int) -> list[list[str]]:
    """Check that the session's replica holds one GPU per rank and that each rank saw
    one of them only, on the CPU; each rank's log header, split."""
    async with httpx.AsyncClient(timeout=30) as http:
        listed = (await http.get(f"{model}/sessions", headers=OPERATOR)).json()["sessions"]
    [session] = listed
    assert len(session["gpu_ids"]) == ranks
    headers = [log[0].split() for log in rank_logs(logs, ranks)]
    seen = sorted(header[header.index("gpu") + 1] for header in headers)
    assert seen == sorted(str(g) for g in session["gpu_ids"]), (headers, session)
    assert all(header[header.index("device") + 1] == "cpu" for header in headers)
    return headers


async def painted_frame(client, timeout=MEDIA):
    return await model_frame(client, (96, 128, 3), timeout)


@pytest.mark.parametrize("ranks", RANK_COUNTS)
async def test_each_rank_gets_a_gpu_of_the_replica_and_a_killed_rank_restarts_them_all(
    ray_serve, tmp_path, ranks
):
    logs = tmp_path / "logs"
    logs.mkdir()
    model_dir = model_copy(EXAMPLES / "split_painter", tmp_path, rank_log_dir=str(logs))
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
            deadline = time.monotonic() + MEDIA
            while abs(float((await client.next_frame(timeout=MEDIA)).image.mean())
                      - float(first.mean())) < 8:
                assert time.monotonic() < deadline, "the hue command never showed"
            headers = await a_gpu_each(model, logs, ranks)
            victim = int(headers[1][headers[1].index("pid") + 1])
            os.kill(victim, signal.SIGKILL)
            ended = await client.next_message("sessionEnded", scope="runtime", after=0,
                                              timeout=MEDIA)
        finally:
            await client.close()
        assert ended["data"]["reason"] == "error"
        assert f"rank 1 (pid {victim})" in ended["data"]["message"], ended
        assert "SIGKILL" in ended["data"]["message"], ended
        # The same replica serves the next session, on fresh ranks. Its session waits
        # for every rank to load again, which takes what the first load took.
        again = await connect(model, timeout=3 * MEDIA)
        try:
            await painted_frame(again)
            # Enough steps to compare, as every rank logged them since the restart,
            # however slowly a loaded machine ran them.
            await ranks_logged(again, logs, ranks, lambda steps: len(steps) > 5,
                               "more than five steps on every rank", MEDIA)
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


def camera(colour: int) -> np.ndarray:
    frame = np.zeros((96, 128, 3), np.uint8)
    frame[..., 2] = colour
    frame[: 4 + colour % 64] = 180
    return frame


@pytest.mark.parametrize("ranks", RANK_COUNTS)
async def test_a_model_run_on_every_rank_streams_through_serve_and_restarts_its_ranks_together(
    ray_serve, tmp_path, ranks
):
    logs = tmp_path / "logs"
    logs.mkdir()
    model_dir = model_copy(EXAMPLES / "ranked_filter", tmp_path, rank_log_dir=str(logs),
                           wait_for_camera=True, output_rank=ranks - 1)
    app = f"ranked{ranks}"
    url = ray_serve.deploy(app, {"operator_token": "op", "models": [
        {"path": str(model_dir), "ranks": ranks, "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/ranked-filter"
    frames = (camera(c % 250) for c in range(10**6))
    try:
        client = await connect(model, inputs={"camera": frames})
        try:
            await painted_frame(client)
            client.send_command("flash", {"frames": 4})
            deadline = time.monotonic() + MEDIA
            while float((await client.next_frame(timeout=MEDIA)).image.mean()) < 240:
                assert time.monotonic() < deadline, "the flash never showed"
            client.send_command("set_strength", {"strength": 0.5})
            # The ranks say when the new strength applied: awaited in their logs, with
            # steps enough to compare, rather than assumed after a number of frames.
            await ranks_logged(
                client, logs, ranks,
                lambda steps: len(steps) > 20 and any("strength 0.5000" in s for s in steps),
                "the new strength and more than twenty steps on every rank", MEDIA)
            headers = await a_gpu_each(model, logs, ranks)
            # Every rank's model ran the same steps on the same camera frames, the
            # event and the new strength at the same step.
            steps = [log[1:] for log in rank_logs(logs, ranks)]
            shortest = min(len(s) for s in steps)
            assert shortest > 20 and all(s[:shortest] == steps[0][:shortest] for s in steps)
            assert "flash 4" in steps[0][:shortest]
            victim = int(headers[0][headers[0].index("pid") + 1])
            os.kill(victim, signal.SIGKILL)
            ended = await client.next_message("sessionEnded", scope="runtime", after=0,
                                              timeout=MEDIA)
        finally:
            await client.close()
        assert ended["data"]["reason"] == "error"
        assert f"rank 0 (pid {victim})" in ended["data"]["message"], ended
        # As above: the next session waits for every rank to load again.
        again = await connect(model, inputs={"camera": frames}, timeout=3 * MEDIA)
        try:
            for _ in range(10):
                await painted_frame(again)
        finally:
            await again.close()
        fresh = [int(log[0].split()[5]) for log in rank_logs(logs, ranks)]
        assert victim not in fresh and len(set(fresh)) == ranks
    finally:
        ray_serve.delete(app)
