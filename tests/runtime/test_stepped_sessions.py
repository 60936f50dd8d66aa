"""Stepped sessions on every model kind: nothing is made until a step, each step applies
its state and commands and then runs one unit (a yield, an emit, an emit_block)."""

import asyncio

import numpy as np
import pytest
from paths import TEST_MODELS

from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.isolation.model_process import ModelProcess
from reactor_serve.runtime.stepping import StepFailure, StepGate, StepOutcome

REFERENCE = TEST_MODELS / "reference"


class Sink:
    def __init__(self):
        self.messages, self.ended = [], []

    def message(self, envelope):
        self.messages.append(envelope)

    def ended(self, reason, detail):
        self.ended.append(reason)


def levels(host):
    return [int(item.video["main_video"].flat[0]) for item in host.output_buffer.drain()]


@pytest.fixture
def hosted():
    hosts = []

    def start(model, in_process=True):
        path = REFERENCE / model
        host = ModelHost.from_manifest(path) if in_process else ModelProcess(path)
        host.start(120)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.shutdown()


@pytest.mark.parametrize("in_process", [True, False], ids=["thread", "process"])
async def test_a_pipeline_makes_one_yield_per_step_with_the_steps_state(hosted, in_process):
    host = hosted("generator", in_process)
    session = await host.open_session(Sink(), stepped=True)
    await asyncio.sleep(0.3)  # a negative check: load can only make fewer frames in it
    assert levels(host) == []  # nothing streams
    # With no prompt it yields Idle: that is the step's unit, and it made nothing.
    idle = await host.step(session, {}, [])
    assert idle.failure is None and levels(host) == []
    first = await host.step(session, {"prompt": "ab"}, [])
    assert first.failure is None and first.elapsed_s >= 0
    assert levels(host) == [40, 40, 40]  # one yield: the batch of three
    await asyncio.sleep(0.3)  # a negative check: load can only make fewer frames in it
    assert levels(host) == []  # and nothing after it
    assert (await host.step(session, {"prompt": "abcd"}, [])).failure is None
    assert levels(host) == [80, 80, 80]
    assert (await host.step(session, {}, [])).failure is None
    assert levels(host) == [80, 80, 80]
    # Refused whole: the first value would have applied, but nothing does.
    refused = await host.step(session, {"prompt": "a"}, [("set_prompt", {"prompt": "x" * 60})])
    assert refused.failure == StepFailure.REFUSED and refused.entry == "set_prompt"
    assert "prompt" in refused.message and "max_length" in refused.message
    assert (await host.step(session, {"speed": 1}, [])).entry == "state.speed"
    assert levels(host) == []
    assert (await host.step(session, {}, [])).failure is None
    assert levels(host) == [80, 80, 80]  # still "abcd"
    await host.end_session(session, "client_closed")
    assert (await host.step(session, {}, [])).failure == StepFailure.SESSION_ENDED


async def test_a_run_loop_makes_one_emit_per_step_after_its_commands(hosted):
    host = hosted("run_loop")
    session = await host.open_session(Sink(), stepped=True)
    await asyncio.sleep(0.2)  # a negative check: load can only make fewer frames in it
    assert levels(host) == []
    assert (await host.step(session, {}, [("set_prompt", {"prompt": "ab"})])).failure is None
    assert levels(host) == [20] * 10
    assert (await host.step(session, {}, [("set_prompt", {"prompt": "abc"})])).failure is None
    assert levels(host) == [31] * 10
    unknown = await host.step(session, {}, [("fly", {})])
    assert unknown.failure == StepFailure.REFUSED and "unknown command 'fly'" in unknown.message
    await host.end_session(session, "client_closed")


@pytest.mark.parametrize("in_process", [True, False], ids=["thread", "process"])
async def test_a_step_brings_its_frames_at_once_so_a_waiting_read_takes_the_latest(
    hosted, in_process
):
    # The model already waits in `read(1)` when a step's frames come: it must wake on
    # all of them, not on the first while the rest are still on their way.
    host = hosted("v2v", in_process)
    session = await host.open_session(Sink(), stepped=True)
    await asyncio.sleep(0.2)  # any wait lets the model reach its read
    for batch in ([10, 20, 30, 40], [50, 60]):
        session.push_inputs("camera", [np.full((8, 8, 3), v, np.uint8) for v in batch])
        assert (await host.step(session, {}, [])).failure is None
        assert levels(host) == [batch[-1]]
    await host.end_session(session, "client_closed")


async def test_the_older_api_makes_one_block_per_step(hosted):
    host = hosted("legacy_blocks")
    session = await host.open_session(Sink(), stepped=True)
    await asyncio.sleep(0.2)  # a negative check: load can only make fewer frames in it
    assert levels(host) == []  # not even the placeholder picture
    assert (await host.step(session, {}, [("set_prompt", {"prompt": "a"})])).failure is None
    assert levels(host) == [11, 21, 31, 41]
    assert (await host.step(session, {}, [])).failure is None
    assert levels(host) == [51, 61, 71, 81]
    await host.end_session(session, "client_closed")
    assert session.ended.is_set()


async def test_a_streamed_session_is_refused_a_step(hosted):
    host = hosted("generator")
    session = await host.open_session(Sink())
    refused = await host.step(session, {}, [])
    assert refused.failure == StepFailure.REFUSED and "stepped" in refused.message
    await host.end_session(session, "client_closed")


async def test_the_gate_runs_one_step_at_a_time_and_answers_it_when_closed():
    gate = StepGate()
    answers = []
    assert gate.arm(answers.append) and gate.busy
    assert not gate.arm(answers.append)  # one at a time: the second is not ready
    gate.started = True
    gate.produced(0.5)
    assert answers == [StepOutcome(elapsed_s=0.5)] and not gate.busy
    waiting = asyncio.ensure_future(gate.wait())
    await asyncio.sleep(0.01)  # a negative check: a busy loop can only wake it later
    assert not waiting.done()  # the next unit waits for the next step
    assert gate.arm(answers.append)
    await asyncio.wait_for(waiting, 30)  # the armed step lets the waiter go
    gate.close(StepOutcome(StepFailure.SESSION_ENDED, "gone"))
    assert answers[-1].failure == StepFailure.SESSION_ENDED
    assert not gate.arm(answers.append)
    await asyncio.wait_for(gate.wait(), 30)  # closed: never waits again


async def test_a_command_that_comes_as_its_session_ends_is_answered(hosted):
    # Not a step matter, but the same host: a wire v1 client waits for every answer.
    host = hosted("generator")
    sink = Sink()
    session = await host.open_session(sink)
    session.mark_stopping()
    session.command("set_prompt", {"prompt": "late"}, "c9", reply=True)
    session.command("set_prompt", {"prompt": "unasked"}, "c10")  # v0: nothing waits
    errors = [m["data"]["data"] for m in sink.messages if m["data"]["type"] == "commandError"]
    assert [(e["id"], e["errors"][0]["rule"]) for e in errors] == [("c9", "session_ending")]
    assert "ending" in errors[0]["message"]
    await host.end_session(session, "client_closed")
