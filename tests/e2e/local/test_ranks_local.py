"""A multi-rank model on `reactor run`, over real WebRTC: the split painter example with
R = 2 and 3 rank processes in a real gloo group. Frames stream, every rank logs the
same steps, a killed or stopped rank ends the session naming it and the next session
works (for the ranked filter example too, whose own class runs on every rank), and
nothing is left behind."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from dev_shm import dev_shm_entries
from paths import EXAMPLES
from rank_counts import RANK_COUNTS
from rank_logs import rank_logs, ranks_logged
from rank_processes import (
    check_failure_named,
    fail_rank,
    model_copy,
    rank_pids,
    wait_for_ranks,
    wait_until_gone,
)
from waits import model_frame

from reactor_serve.client import connect

PAINTER = EXAMPLES / "split_painter"


def painter_copy(tmp_path: Path, **config) -> Path:
    return model_copy(PAINTER, tmp_path, **config)


# Rank processes in a gloo group share two loaded cores with the server and the client:
# every wait on them is for an event, bounded only to fail with a message.
DEADLINE_S = 60.0
# The model's frame size: until its first frame, a session shows black at another.
PAINTED = (96, 128, 3)
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


async def frames_until_hue_changes(client, timeout=DEADLINE_S):
    first = await model_frame(client, PAINTED, timeout)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no frame showed the set_hue command"
        frame = (await client.next_frame(timeout=remaining)).image
        if abs(float(frame.mean()) - float(first.mean())) > 8:
            return first, frame


@pytest.mark.parametrize("ranks", RANK_COUNTS)
async def test_a_multi_rank_model_streams_and_every_rank_sees_the_same_steps(
    reactor_run, tmp_path, ranks
):
    logs = tmp_path / "logs"
    logs.mkdir()
    run = reactor_run(painter_copy(tmp_path, rank_log_dir=str(logs)), "--ranks", str(ranks))
    pids = wait_for_ranks(run.process.pid, ranks)
    health = httpx.get(f"{run.url}/health", timeout=DEADLINE_S).json()
    assert health["ranks"]["expected"] == ranks
    assert {int(k): v["pid"] for k, v in health["ranks"]["running"].items()} == pids
    client = await connect(run.url)
    try:
        assert (await model_frame(client, PAINTED, DEADLINE_S)).std() > 5  # a picture, not a flat fill
        for hue in (0.5, 0.9):
            client.send_command("set_hue", {"hue": hue})
            await frames_until_hue_changes(client)
        # Steps enough to compare, awaited in the ranks' own logs: a count of frames
        # received would also count a slow step's frame shown twice.
        await ranks_logged(client, logs, ranks,
                           lambda steps: len(steps) > 20 and steps[-1].split()[1] == "0.9000",
                           "the last hue and more than twenty steps on every rank", DEADLINE_S)
    finally:
        await client.close()
    # Each rank's own log: the same steps, in the same order, hue changes included.
    logged = rank_logs(logs, ranks)
    assert [line.split()[:4] for line in (log[0] for log in logged)] == [
        ["rank", str(rank), "of", str(ranks)] for rank in range(ranks)]
    steps = [log[1:] for log in logged]
    shortest = min(len(s) for s in steps)
    assert shortest > 20
    assert all(s[:shortest] == steps[0][:shortest] for s in steps)
    hues = [line.split()[1] for line in steps[0][:shortest]]
    assert hues.index("0.5000") < hues.index("0.9000")
    shm_before = dev_shm_entries()
    run.stop()
    wait_until_gone(pids.values(), timeout=DEADLINE_S)
    assert dev_shm_entries() <= shm_before


# Each way of running ranks meets each failure once between the default run and the
# matrix: the default run pairs each way with one failure, so both ways and both
# failures run there (docs/testing.md).
@pytest.mark.parametrize("example, timeout_key, failure", [
    ("split_painter", "step_timeout_s", "stopped"),       # a runner inside the model
    ("ranked_filter", "rank_step_timeout_s", "killed"),   # the model on every rank
    pytest.param("split_painter", "step_timeout_s", "killed", marks=pytest.mark.matrix),
    pytest.param("ranked_filter", "rank_step_timeout_s", "stopped", marks=pytest.mark.matrix),
])
async def test_a_failed_rank_ends_the_session_naming_it_and_the_next_session_works(
    reactor_run, tmp_path, failure, example, timeout_key
):
    # The step timeout is what detects a stopped rank, so it is a wall-time bound in the
    # product: long enough that a healthy step on a loaded machine never reaches it
    # (which would end the session before the failure, naming no victim), while the
    # wait for the sessionEnded it causes is longer still.
    step_timeout_s = 10.0
    run = reactor_run(model_copy(EXAMPLES / example, tmp_path, **{timeout_key: step_timeout_s}),
                      "--ranks", "2")
    pids = wait_for_ranks(run.process.pid, 2)
    client = await connect(run.url)
    try:
        await model_frame(client, PAINTED, DEADLINE_S)
        victim = pids[1]
        fail_rank(victim, failure)
        ended = await client.next_message("sessionEnded", scope="runtime", after=0,
                                          timeout=step_timeout_s + DEADLINE_S)
    finally:
        await client.close()
    check_failure_named(ended, failure, victim, rank=1, timeout_s=step_timeout_s)
    # Every rank of the failed group is gone; the model restarted with fresh ones.
    fresh = wait_for_ranks(run.process.pid, 2, avoid=set(pids.values()), timeout=DEADLINE_S)
    wait_until_gone(pids.values(), timeout=DEADLINE_S)
    # Fresh rank processes exist before they have loaded: the next session waits for
    # every rank to load again, which takes what the first load took (three windows,
    # as the Serve ranks tests give theirs).
    again = await connect(run.url, timeout=3 * DEADLINE_S)
    try:
        await model_frame(again, PAINTED, DEADLINE_S)
    finally:
        await again.close()
    assert rank_pids(run.process.pid) == fresh
