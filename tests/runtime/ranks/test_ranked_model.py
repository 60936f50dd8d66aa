"""A model whose own class runs on every rank (`rank_mode: model`), in a real model
process with real rank processes in a gloo group: what the client sees comes from the
output rank, once; commands and input reach every rank at the same steps; the model's
own errors end the session and keep the ranks, ranks that disagree restart them all."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import numpy as np
import pytest
from paths import TEST_MODELS
from rank_processes import model_copy

from reactor_serve.runtime.host import ModelLoadError
from reactor_serve.runtime.isolation.model_process import ModelProcess
from reactor_serve.runtime.stepping import StepFailure

# Only a guard against a hang: each test starts a model process and its ranks, which a
# loaded machine slows down many times over, and every wait inside has its own deadline.
pytestmark = pytest.mark.timeout(600)

ECHO = TEST_MODELS / "ranked"


class Sink:
    def __init__(self):
        self.messages, self.ends = [], []

    def message(self, envelope):
        self.messages.append(envelope)

    def ended(self, reason, detail):
        self.ends.append((reason, detail))


@pytest.fixture
def echo(tmp_path):
    hosts = []

    def start(**config):
        host = ModelProcess(model_copy(ECHO, tmp_path / f"h{len(hosts)}", **config))
        hosts.append(host)
        host.start(120)
        return host

    yield start
    for host in hosts:
        host.shutdown()


async def frames(host, count, timeout=60.0):
    """The next `count` frames the host made, as (red, green, blue) of their corner."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} frames were made"
        got += [tuple(int(v) for v in item.video["main_video"][0, 0])
                for item in host.output_buffer.drain()]
        await asyncio.sleep(0.01)  # the poll interval of a wait with a deadline
    return got


async def ended(host, sink, timeout=60.0):
    """How the session ended, reading its frames meanwhile as a client would."""
    deadline = time.monotonic() + timeout
    while not sink.ends:
        assert time.monotonic() < deadline, "the session never ended"
        list(host.output_buffer.drain())
        await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline
    return sink.ends[0]


def application(sink):
    return [m["data"] for m in sink.messages if m["scope"] == "application"]


async def test_the_output_rank_makes_the_frames_and_its_messages_cross_once(echo):
    host = echo(output_rank=1)
    sink = Sink()
    session = await host.open_session(sink)
    assert {red for red, green, _ in await frames(host, 5)} == {0}
    assert {green for _, green, _ in await frames(host, 5)} == {1}  # rank 1's frames
    assert application(sink) == [{"type": "hello", "rank": 1, "world_size": 2, "device": "cpu"}]
    session.command("set_level", {"level": 7})
    session.command("bump", {"by": 3})
    deadline = time.monotonic() + 60
    while (await frames(host, 1))[-1][0] != 10:
        assert time.monotonic() < deadline, "the commands never showed in the frames"
    await session.close()
    assert await ended(host, sink) == ("client_closed", None)


async def test_a_model_error_on_every_rank_ends_the_session_with_its_words_and_keeps_the_ranks(echo):
    host = echo()
    before = [rank.pid for rank in host.rank_processes()]
    assert len(before) == 2
    sink = Sink()
    session = await host.open_session(sink)
    await frames(host, 2)
    session.command("boom")
    reason, detail = await ended(host, sink)
    assert reason == "error"
    assert "boom() raised ValueError: boom on rank 0" in detail, detail
    again = Sink()
    second = await host.open_session(again)
    # A fresh session of the same ranks' models: its steps count from 1.
    assert [steps for _, _, steps in await frames(host, 3)][:3] == [1, 2, 3]
    await second.close()
    assert [rank.pid for rank in host.rank_processes()] == before
    assert host.restarts == 0


@pytest.mark.parametrize("command, said", [
    # The model raises on one rank only.
    (("boom_on", {"rank": 1}), ["rank 1 raised RankSessionFailed",
                                "boom_on() raised ValueError: boom on rank 1 alone"]),
    # One rank's step waits for input while the other's made its frame.
    (("stall_on", {"rank": 1}), ["the ranks disagree: rank 0 made its unit; "
                                 "rank 1 waits for input"]),
], ids=["one-raises", "parting-ways"])
async def test_ranks_that_disagree_are_a_desync_naming_them_and_all_restart(echo, command, said):
    host = echo()
    before = {rank.pid for rank in host.rank_processes()}
    sink = Sink()
    session = await host.open_session(sink)
    await frames(host, 2)
    session.command(*command)
    reason, detail = await ended(host, sink)
    assert reason == "error"
    assert "RankDesync" in detail and all(part in detail for part in said), detail
    deadline = time.monotonic() + 120
    while not (len(host.rank_processes()) == 2
               and not {rank.pid for rank in host.rank_processes()} & before):
        assert time.monotonic() < deadline, "the ranks were not all started afresh"
        await asyncio.sleep(0.2)  # the poll interval of a wait with a deadline
    again = Sink()
    second = await host.open_session(again)
    assert [steps for _, _, steps in await frames(host, 3)][:3] == [1, 2, 3]
    await second.close()


async def test_a_step_waiting_for_input_goes_on_with_the_same_frame_on_every_rank(echo):
    host = echo(wait_for_input=True, output_rank=1)
    sink = Sink()
    session = await host.open_session(sink)
    # Negative checks: a loaded machine can only make fewer frames in the window.
    await asyncio.sleep(0.5)
    assert list(host.output_buffer.drain()) == []  # every rank waits for a frame
    for level in (20, 30, 40):
        frame = np.zeros((8, 8, 3), np.uint8)
        frame[..., 0] = level
        session.push_input("frames", frame)
        [(red, green, steps)] = await frames(host, 1)
        assert (red, green) == (level, 1)
        await asyncio.sleep(0.2)  # a negative check, as above
        assert list(host.output_buffer.drain()) == []  # and waits again
    assert steps == 3
    await session.close()


async def test_a_stepped_session_steps_every_rank_with_the_steps_state_and_commands(echo):
    host = echo()
    sink = Sink()
    session = await host.open_session(sink, stepped=True)
    await asyncio.sleep(0.3)  # a negative check: load can only make fewer frames in it
    assert list(host.output_buffer.drain()) == []
    outcome = await host.step(session, {"level": 5}, [("bump", {"by": 2})])
    assert outcome.failure is None
    assert await frames(host, 1) == [(7, 0, 1)]
    assert (await host.step(session, {}, [("bump", {})])).failure is None
    assert await frames(host, 1) == [(8, 0, 2)]
    refused = await host.step(session, {"level": 500}, [])
    assert refused.failure == StepFailure.REFUSED and refused.entry == "state.level"
    await session.close()


@pytest.mark.parametrize("config, field", [
    ({"rank_mode": "everywhere"}, "rank_mode"),
    ({"output_rank": 2}, "output_rank"),
    ({"rank_step_timeout_s": 0}, "rank_step_timeout_s"),
    ({"sessions_per_replica": 2}, "rank_mode"),
])
def test_wrong_rank_settings_are_refused_naming_the_field(tmp_path, config, field):
    with pytest.raises(ValueError, match=field):
        ModelProcess(model_copy(ECHO, tmp_path, **config))


def test_a_batched_model_is_refused_on_every_rank_saying_why(tmp_path):
    copy = tmp_path / "batched"
    shutil.copytree(TEST_MODELS / "serve" / "batched_probe", copy)
    (copy / "reactor.yaml").write_text(
        "model: pipeline:BatchedProbe\nname: batched-probe\n"
        "config:\n  ranks: 2\n  rank_mode: model\n")
    host = ModelProcess(copy)
    try:
        with pytest.raises(ModelLoadError, match="@batched model has nothing to batch"):
            host.start(120)
    finally:
        host.shutdown()


async def test_a_killed_rank_ends_the_session_naming_it_before_the_model_process_goes(echo):
    # The model process exits on broken ranks only once the session was told why: its
    # watchdog must not take the broken host for a dead one and leave first.
    host = echo()
    victim = host.rank_processes()[0].pid
    sink = Sink()
    await host.open_session(sink)
    await frames(host, 2)
    os.kill(victim, signal.SIGKILL)
    reason, detail = await ended(host, sink)
    assert reason == "error"
    assert f"WorkerCrashed: generate: rank 0 (pid {victim}) was killed by SIGKILL" in detail, \
        detail
