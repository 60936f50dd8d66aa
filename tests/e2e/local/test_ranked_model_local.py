"""A model whose own class runs on every rank (`rank_mode: model`), on `reactor run`
over real WebRTC: the ranked filter example with R = 2 and 3 processes in a real gloo
group. It waits for the client's camera, so every step is fed the same frames; each
rank's own log shows the same steps, state and events in the same order, and nothing is
left behind. (A killed or stopped rank: test_ranks_local.py, for both kinds of
multi-rank model.)"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from dev_shm import dev_shm_entries
from paths import EXAMPLES
from rank_counts import RANK_COUNTS
from rank_logs import rank_logs, ranks_logged
from rank_processes import (
    model_copy,
    wait_for_ranks,
    wait_until_gone,
)
from waits import model_frame

from reactor_serve.client import connect

FILTER = EXAMPLES / "ranked_filter"


def camera(colour: int) -> np.ndarray:
    frame = np.zeros(PAINTED, np.uint8)
    frame[..., 0] = colour
    frame[:, : 4 + colour % 64] = 200
    return frame


# Rank processes in a gloo group share two loaded cores with the server and the client:
# every wait on them is for an event, bounded only to fail with a message.
DEADLINE_S = 60.0
# The model's frame size: until its first frame, a session shows black at another.
PAINTED = (96, 128, 3)
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


async def until_white(client, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no frame showed the flash command"
        if float((await client.next_frame(timeout=remaining)).image.mean()) >= 240:
            return


@pytest.mark.parametrize("ranks", RANK_COUNTS)
async def test_every_rank_runs_the_model_on_the_same_inputs_in_the_same_order(
    reactor_run, tmp_path, ranks
):
    logs = tmp_path / "logs"
    logs.mkdir()
    run = reactor_run(model_copy(FILTER, tmp_path, rank_log_dir=str(logs), wait_for_camera=True),
                      "--ranks", str(ranks))
    pids = wait_for_ranks(run.process.pid, ranks)
    health = httpx.get(f"{run.url}/health", timeout=DEADLINE_S).json()
    assert health["ranks"]["expected"] == ranks
    assert {int(k): v["pid"] for k, v in health["ranks"]["running"].items()} == pids
    client = await connect(run.url, inputs={"camera": (camera(c % 250) for c in range(10**6))})
    try:
        assert (await model_frame(client, PAINTED, DEADLINE_S)).std() > 3
        client.send_command("set_strength", {"strength": 0.25})
        client.send_command("flash", {"frames": 5})
        await until_white(client)
        # Steps enough to compare, awaited in the ranks' own logs: a count of frames
        # received would also count a slow step's frame shown twice.
        await ranks_logged(client, logs, ranks,
                           lambda steps: "flash 5" in steps and len(steps) > 20,
                           "the flash and more than twenty steps on every rank", DEADLINE_S)
    finally:
        await client.close()
    logged = rank_logs(logs, ranks)
    assert [log[0].split()[:4] for log in logged] == [
        ["rank", str(rank), "of", str(ranks)] for rank in range(ranks)]
    steps = [log[1:] for log in logged]
    shortest = min(len(s) for s in steps)
    assert shortest > 20
    # The same steps, on the same camera frames, with the commands at the same step.
    assert all(s[:shortest] == steps[0][:shortest] for s in steps)
    seen = steps[0][:shortest]
    assert "flash 5" in seen
    strengths = [line.split()[3] for line in seen if line.startswith("step")]
    assert strengths[0] == "1.0000" and "0.2500" in strengths
    cameras = {line.split()[5] for line in seen if line.startswith("step")}
    assert "-1" not in cameras and len(cameras) > 3  # the client's frames, changing
    shm_before = dev_shm_entries()
    run.stop()
    wait_until_gone(pids.values(), timeout=DEADLINE_S)
    assert dev_shm_entries() <= shm_before
