"""The model in a process of its own: crash isolation, restarts, health, shared memory
that never outlives anything, and media that keeps its pace while the model holds
its GIL. Real child processes throughout."""

import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import connected
from dev_shm import dev_shm_entries
from paths import ROOT, TEST_MODELS, TESTS

from reactor_serve.runtime.host import ModelLoadError
from reactor_serve.runtime.isolation.model_process import ModelProcess, hosted_model
from reactor_serve.runtime.local_client import LocalClient

MODELS = TEST_MODELS / "process"
REFERENCE = TEST_MODELS / "reference"


def _memfd_maps(pid="self"):
    """Our shared-memory mappings in a process (rings are memfds named reactor-*)."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if "memfd:reactor-" in line]


def _copy_model(tmp_path, name, config=None):
    target = tmp_path / name
    shutil.copytree(MODELS / name, target)
    if config is not None:
        manifest = (target / "reactor.yaml").read_text()
        (target / "reactor.yaml").write_text(manifest + "config: " + json.dumps(config) + "\n")
    return target


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _processes_running(word):
    """The live processes (zombies left out) whose command line holds `word`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _process_state(entry) not in (None, "Z"):
            try:
                if word in Path(f"/proc/{entry}/cmdline").read_bytes().decode():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _process_state(pid):
    """The one-letter state of `pid` (`T`: stopped), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # the poll interval of a wait with a deadline


async def _until_async(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # the poll interval of a wait with a deadline


async def _opens_once_released(model, release, held):
    """Open a session while something holds the model back; it must not open until
    `release()` is called, then it opens, streams the model's own frames, and its
    client never hears that it ended."""
    client = LocalClient(model)
    opening = asyncio.ensure_future(client.connect())
    # A negative check: while held, nothing can open however long this lasts.
    await asyncio.sleep(0.5)
    assert not opening.done(), (held, opening.exception())
    release()
    await asyncio.wait_for(opening, 60)
    try:
        frame = await client.next_frame(timeout=30)
        assert frame.image[0, 0, 0] == 7 and client.end_reason is None
        assert not [m for m in client.messages if m.get("data", {}).get("type") == "sessionEnded"]
    finally:
        await client.close()


@pytest.fixture
def process_of():
    started = []

    def start(path, **attributes):
        process = ModelProcess(path)
        for name, value in attributes.items():
            setattr(process, name, value)
        process.start(timeout=60)
        started.append(process)
        return process

    yield start
    for process in started:
        process.shutdown()


@pytest.mark.parametrize(
    "how, says",
    [
        ("segfault", "was killed by SIGSEGV (signal 11)"),
        ("exit", "exited with code 3"),
        ("kill", "was killed by SIGKILL (signal 9)"),
        ("sys.exit", "exited with code 1"),
    ],
)
def test_a_dying_model_process_ends_the_session_with_how_it_died_and_the_next_session_works(
    tmp_path, process_of, how, says
):
    model = process_of(_copy_model(tmp_path, "crashing"), RESTART_BACKOFF_S=(0.05,))
    first_pid = model.pid

    async def scenario():
        async with connected(model) as client:
            frame = await client.next_frame(timeout=30)
            assert frame.image[0, 0, 0] == 7  # a torch tensor from the model process
            client.send_command("crash", {"how": how})
            assert await client.wait_closed(timeout=60) == "error"
            assert says in client.end_detail
            ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=60)
            assert ended["data"] == {"reason": "error", "message": client.end_detail}
        # The replica stayed healthy through the restart, and the next session works.
        assert model.healthy
        async with connected(model) as client:
            frame = await client.next_frame(timeout=30)
            assert frame.image[0, 0, 0] == 7
            assert client.session.stats()["new_frames"] >= 1

    asyncio.run(scenario())
    assert model.pid != first_pid and not _alive(first_pid)
    assert model.crashes == 1 and model.model_errors == 1


def test_a_session_opening_while_the_model_process_dies_opens_on_the_next_one(
    tmp_path, process_of
):
    # The process dies with the open sent and not yet answered (stopped, then killed):
    # the session is opened again on the restarted process, and its client never
    # hears that it ended.
    model = process_of(_copy_model(tmp_path, "crashing"), RESTART_BACKOFF_S=(0.05,))
    dying = model.pid

    async def scenario():
        os.kill(dying, signal.SIGSTOP)
        await _opens_once_released(model, lambda: os.kill(dying, signal.SIGKILL),
                                   "a stopped process cannot have answered the open")

    asyncio.run(scenario())
    assert model.pid != dying and model.crashes == 1


def test_a_session_opening_while_the_model_process_exits_opens_on_the_next_one(
    tmp_path, process_of
):
    # The process has closed its end of the channel and has not exited yet (a process
    # tearing down its ranks): the open cannot be sent, and waits for the next process
    # rather than failing with "the model process is gone".
    model = process_of(_copy_model(tmp_path, "crashing"), RESTART_BACKOFF_S=(0.05,))
    exiting = model.pid

    async def scenario():
        async with connected(model) as first:
            await first.next_frame(timeout=30)
            first.send_command("crash", {"how": "close_channel_and_stop"})
            await _until_async(lambda: _process_state(exiting) == "T",
                               "the model process to close its channel and stop")
        await _opens_once_released(model, lambda: os.kill(exiting, signal.SIGKILL),
                                   "the stopped process cannot exit")

    asyncio.run(scenario())
    assert model.pid != exiting and model.crashes == 1


def test_a_session_waits_out_a_reload_and_is_told_why_one_failed(tmp_path, process_of):
    # A reload takes what the first load took, which no fixed window knows: a session
    # opened meanwhile waits for the restart, and for as long as it is on.
    hold, fail = tmp_path / "hold-load", tmp_path / "fail-load"
    model = process_of(
        _copy_model(tmp_path, "crashing",
                    {"hold_load_while": str(hold), "fail_load_if": str(fail)}),
        RESTART_BACKOFF_S=(0.05,), UNHEALTHY_AFTER=1,
    )

    async def crash():
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            client.send_command("crash", {"how": "exit"})
            await client.wait_closed(timeout=60)

    async def scenario():
        hold.write_text("now")
        await crash()
        await _opens_once_released(model, hold.unlink,
                                   "the session opened on a model that is not loaded")
        # The reload after the next crash fails (UNHEALTHY_AFTER is 1 here): the
        # session waiting for it is refused with the model's own error.
        hold.write_text("now")
        await crash()
        waiting = LocalClient(model)
        opening = asyncio.ensure_future(waiting.connect())
        fail.write_text("now")
        hold.unlink()
        with pytest.raises(RuntimeError, match="did not load again: .*simulated load failure"):
            await asyncio.wait_for(opening, 60)

    asyncio.run(scenario())
    assert not model.healthy


def test_an_exception_in_a_handler_ends_only_the_session(tmp_path, process_of):
    model = process_of(_copy_model(tmp_path, "crashing"))
    pid = model.pid

    async def scenario():
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            client.send_command("crash", {"how": "raise"})
            assert await client.wait_closed(timeout=60) == "error"
            assert "simulated handler failure: raise" in client.end_detail
        async with connected(model) as client:
            await client.next_frame(timeout=30)

    asyncio.run(scenario())
    assert model.pid == pid and model.crashes == 0 and model.model_errors == 1
    # The handler's error is carried across a crash, once, also while the model
    # process waits to be started again.
    seen = set()

    def restarted():
        if model.crashes:
            seen.add(model.model_errors)
        return model.pid not in (None, pid)

    os.kill(pid, signal.SIGKILL)
    _wait_until(restarted, 60, "the model process to restart")
    assert model.crashes == 1 and seen == {2} and model.model_errors == 2


def test_a_model_stuck_in_a_forward_pass_is_restarted_when_its_session_cannot_end(
    tmp_path, process_of
):
    hanging = tmp_path / "hanging"
    model = process_of(_copy_model(tmp_path, "crashing", {"hanging_marker": str(hanging)}),
                       END_WAIT_S=1.0, RESTART_BACKOFF_S=(0.05,))
    stuck_pid = model.pid

    async def scenario():
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            client.send_command("crash", {"how": "hang"})
            # The session ends only once the forward pass is stuck, not before the
            # command got there.
            await asyncio.to_thread(_wait_until, hanging.exists, 60, "the forward pass to hang")
        assert client.end_reason == "client_closed"
        async with connected(model) as client:
            await client.next_frame(timeout=30)

    asyncio.run(scenario())
    assert not _alive(stuck_pid) and model.pid != stuck_pid


# Three failed loads in a row, each a fresh process start (Python and torch imported
# again), before the host turns unhealthy: on a loaded machine a start alone has taken
# over 20 s, so each wait is bounded per start, and the whole test past their sum.
START_S = 60.0


@pytest.mark.timeout(900)
def test_a_model_that_keeps_failing_to_load_turns_unhealthy_with_the_reason_and_recovers(
    tmp_path, process_of
):
    marker = tmp_path / "fail-load"
    model = process_of(
        _copy_model(tmp_path, "crashing", {"fail_load_if": str(marker)}),
        RESTART_BACKOFF_S=(0.05,),
    )
    marker.write_text("now")

    async def crash():
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            client.send_command("crash", {"how": "exit"})
            await client.wait_closed(timeout=60)

    asyncio.run(crash())
    _wait_until(lambda: not model.healthy, model.UNHEALTHY_AFTER * START_S,
                f"the host to turn unhealthy after {model.UNHEALTHY_AFTER} failed loads")
    assert "simulated load failure" in str(model.load_error)
    assert "RuntimeError" in model.load_error.traceback
    marker.unlink()
    _wait_until(lambda: model.healthy, START_S, "the host to load again")

    async def works():
        async with connected(model) as client:
            await client.next_frame(timeout=30)

    asyncio.run(works())


def test_a_failing_first_load_raises_with_the_models_traceback_and_leaves_no_process(tmp_path):
    marker = tmp_path / "fail-load"
    marker.write_text("now")
    model = ModelProcess(_copy_model(tmp_path, "crashing", {"fail_load_if": str(marker)}))
    with pytest.raises(ModelLoadError, match="simulated load failure") as raised:
        model.start(timeout=60)
    assert "Crashing.load(config) raised RuntimeError" in str(raised.value)
    assert "pipeline.py" in raised.value.traceback
    assert not model.healthy and model.pid is None
    model.shutdown()


def test_a_start_given_up_on_stops_the_loading_process_and_names_the_wait(tmp_path):
    hold = tmp_path / "hold-load"
    hold.write_text("now")
    model_dir = _copy_model(tmp_path, "crashing", {"hold_load_while": str(hold)})
    model = ModelProcess(model_dir)
    # The load is held for as long as the marker exists: the start is given up on.
    with pytest.raises(TimeoutError, match="model 'crashing' did not load within 1 s"):
        model.start(timeout=1.0)
    assert not model.healthy and model.pid is None
    # Nothing goes on loading behind the caller's back.
    _wait_until(lambda: not _processes_running(str(model_dir)), 30,
                "the loading model process to be stopped")
    model.shutdown()


def test_no_shared_memory_is_left_after_sessions_a_crash_and_shutdown(tmp_path):
    before = dev_shm_entries()
    gc.collect()
    # Other tests in this process may still hold frames of their own models.
    mapped_before = set(_memfd_maps())
    model = ModelProcess(_copy_model(tmp_path, "crashing"))
    model.RESTART_BACKOFF_S = (0.05,)
    model.start(timeout=60)

    async def scenario():
        for _ in range(2):
            async with connected(model) as client:
                for _ in range(10):
                    await client.next_frame(timeout=30)
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            client.send_command("crash", {"how": "kill"})
            await client.wait_closed(timeout=60)
        async with connected(model) as client:
            await client.next_frame(timeout=30)

    asyncio.run(scenario())
    assert _memfd_maps(model.pid), "the frames should cross in memfd rings"
    model.shutdown()
    gc.collect()
    assert set(_memfd_maps()) <= mapped_before
    assert dev_shm_entries() == before


def test_the_model_process_dies_with_a_killed_replica_and_leaves_no_shared_memory(tmp_path):
    before = dev_shm_entries()
    model_dir = _copy_model(tmp_path, "crashing")
    # A replica stand-in: starts the model, holds frames, prints the model's pid.
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "support")!r}]
        from conftest import connected
        from reactor_serve.runtime.isolation.model_process import ModelProcess
        model = ModelProcess({str(model_dir)!r})
        model.start(timeout=60)
        async def main():
            async with connected(model) as client:
                await client.next_frame(timeout=60)
                print(model.pid, flush=True)
                await asyncio.sleep(3600)
        asyncio.run(main())
        """
    )
    replica = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(replica.stdout.readline())
        assert _memfd_maps(child_pid) and _memfd_maps(replica.pid)
        replica.send_signal(signal.SIGKILL)
        replica.wait(60)
        _wait_until(lambda: not _alive(child_pid), 60, "the model process to die with its parent")
    finally:
        replica.kill()
        replica.wait()
    assert dev_shm_entries() == before


def test_a_model_holding_the_gil_does_not_stop_the_media_clock(tmp_path, process_of):
    # Each forward pass holds the model process's GIL for 1.2 s. In one process the
    # media loop would present nothing for that long; here it keeps presenting at
    # its own pace.
    model = process_of(_copy_model(tmp_path, "gil_holding"))

    def hold(frame):
        """When the forward pass that made this frame held the GIL (the model stamps it)."""
        return tuple(np.ascontiguousarray(frame.image[0, :16, 0]).view(np.float64))

    async def scenario():
        async with connected(model) as client:
            holds = {hold(await client.next_frame(timeout=60))}
            while len(holds) < 4:
                holds.add(hold(await client.next_frame(timeout=60)))
            return sorted(holds), [f.presented_at for f in client.frames]

    holds, times = asyncio.run(scenario())
    # Frames were presented while each later pass held the model process's GIL (the
    # first one may have begun before the session did): told from the model's own
    # stamps of each hold, not from how far apart the presentations were.
    for began, ended in holds[1:]:
        assert any(began < t < ended for t in times), \
            "nothing was presented while the model held its GIL"


def test_input_frames_commands_and_messages_cross_to_the_model_process(process_of):
    model = process_of(REFERENCE / "v2v")
    spec = model.spec
    track = spec.inputs[0].name

    async def feed(client, value, stop):
        frame = np.full((48, 64, 3), value, np.uint8)
        while not stop.is_set():
            client.send_frame(track, frame)
            await asyncio.sleep(0.02)  # a camera's pace: what it shows is asserted, not when

    async def shows(client, value):
        for _ in range(100):
            out = await client.next_frame(timeout=60)
            if int(out.image[10, 10, 0]) == value:
                return
        raise AssertionError(f"the model never showed {value}")

    async def scenario():
        async with connected(model) as client:
            stop = asyncio.Event()
            feeder = asyncio.create_task(feed(client, 200, stop))
            await shows(client, 200)  # the camera frame, styled "none"
            client.send_command("set_style", {"style": "sketch"})
            await shows(client, 55)  # inverted by the handler's new style
            client.send_command("set_style", {"style": "watercolour"})
            error = await client.next_message("commandError", scope="runtime", timeout=60)
            assert error["data"]["command"] == "set_style"
            assert client.session.stats()["commands_rejected"] == 1
            stop.set()
            await feeder

    asyncio.run(scenario())
    assert model.inputs_dropped == 0


def test_in_process_mode_runs_the_model_on_a_thread_for_debuggers(monkeypatch):
    from reactor_serve.runtime.host import ModelHost

    monkeypatch.setenv("REACTOR_IN_PROCESS", "1")
    assert isinstance(hosted_model(REFERENCE / "generator"), ModelHost)
    monkeypatch.setenv("REACTOR_IN_PROCESS", "0")
    assert isinstance(hosted_model(REFERENCE / "generator"), ModelProcess)
    assert isinstance(hosted_model(REFERENCE / "generator", in_process=True), ModelHost)


def test_cuda_tensors_cross_with_one_device_to_host_copy(tmp_path, process_of):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine: the CUDA frame path is checked on a GPU host")
    model_dir = _copy_model(tmp_path, "crashing")
    source = (model_dir / "pipeline.py").read_text()
    (model_dir / "pipeline.py").write_text(
        source.replace("dtype=torch.uint8)", "dtype=torch.uint8, device='cuda')")
    )
    model = process_of(model_dir)

    async def scenario():
        async with connected(model) as client:
            frame = await client.next_frame(timeout=30)
            assert frame.image[0, 0, 0] == 7 and frame.image.shape == (48, 64, 3)

    asyncio.run(scenario())


def test_the_model_process_yields_the_cpu_to_the_media_process(process_of, monkeypatch):
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    model = process_of(REFERENCE / "generator")
    assert os.getpriority(os.PRIO_PROCESS, model.pid) == min(19, ours + 10)
    monkeypatch.setenv("REACTOR_MODEL_NICE", "0")
    equal = process_of(REFERENCE / "generator")
    assert os.getpriority(os.PRIO_PROCESS, equal.pid) == ours


EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize(
    "model_dir, command",
    [
        (EXAMPLES / "gradient", None),
        (EXAMPLES / "audio_tone", None),
        (EXAMPLES / "world", ("key_down", {"key": "w"})),
        (EXAMPLES / "webcam_style", ("set_style", {"style": "sketch"})),
        (EXAMPLES / "legacy_blocks", ("set_prompt", {"prompt": "a lighthouse"})),
        (REFERENCE / "generator", ("set_prompt", {"prompt": "cat"})),
        (REFERENCE / "run_loop", ("set_prompt", {"prompt": "dog"})),
        (REFERENCE / "v2v", ("set_style", {"style": "sketch"})),
        (REFERENCE / "legacy_blocks", ("set_prompt", {"prompt": "a tree"})),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_every_example_and_reference_model_runs_in_its_model_process(
    process_of, model_dir, command
):
    # The white-box tests of these models (test_examples_run, test_reference_models)
    # read the model instance, so they run it on a thread; here each runs as it is
    # served, in its own process, seen only from the client's side.
    model = process_of(model_dir)
    video_inputs = [t.name for t in model.spec.inputs if t.kind == "video"]

    async def scenario():
        async with connected(model) as client:
            if command is not None:
                client.send_command(*command)
            camera = np.full((48, 64, 3), 120, np.uint8)
            received = []
            deadline = time.monotonic() + 60
            while len(received) < 5 and time.monotonic() < deadline:
                for track in video_inputs:
                    client.send_frame(track, camera)
                try:
                    # The pace of the camera's frames; the wait has the deadline above.
                    received.append(await client.next_frame(timeout=0.05))
                except TimeoutError:
                    continue
            assert len(received) >= 5, "the model did not produce five frames"
            assert not [m for m in client.messages if m["data"].get("type") == "commandError"]
            assert not client.closed

    asyncio.run(scenario())


@pytest.mark.parametrize("in_process", [False, True], ids=["model process", "in process"])
@pytest.mark.parametrize("drop_stale", [True, False], ids=["drop stale", "keep all"])
def test_a_state_change_drops_the_frames_made_before_it_unless_the_model_keeps_them(
    tmp_path, drop_stale, in_process
):
    model_dir = _copy_model(tmp_path, "levels")
    if not drop_stale:
        (model_dir / "reactor.yaml").write_text("model: pipeline:LevelsKeepAll\nname: levels\n")
    model = hosted_model(model_dir, in_process=in_process)
    model.start(timeout=60)

    async def scenario():
        async with connected(model) as client:
            # Wait for the buffer to fill with frames of the first level.
            await client.next_frame(timeout=30)
            await _until_async(lambda: client.session.stats()["queue_depth"] >= 20,
                               "the output buffer to fill")
            client.send_command("set_level", {"level": 200})
            old = 0
            while True:
                frame = await client.next_frame(timeout=30)
                if int(frame.image[0, 0, 0]) == 200:
                    return old, client.session.stats()["stale_dropped"]
                old += 1

    try:
        old_frames, stale_dropped = asyncio.run(scenario())
    finally:
        model.shutdown()
    if drop_stale:
        # Most of the full queue was dropped, and fewer of its frames were shown
        # while the command waited for the next yield than were dropped (how many
        # depends on how soon the model process ran again, not on the behaviour).
        assert stale_dropped >= 15 and old_frames < stale_dropped, (old_frames, stale_dropped)
    else:
        assert old_frames >= 20 and stale_dropped == 0


def test_a_command_that_changes_nothing_drops_no_frames(tmp_path):
    model = hosted_model(_copy_model(tmp_path, "levels"), in_process=True)
    model.start(timeout=60)

    async def scenario():
        async with connected(model) as client:
            await client.next_frame(timeout=30)
            # Frames queued, so that a stale drop would show.
            await _until_async(lambda: client.session.stats()["queue_depth"] >= 20,
                               "the output buffer to fill")
            client.send_command("set_level", {"level": 40})  # the level it has
            client.send_command("set_level", {"level": 40})
            for _ in range(5):
                assert int((await client.next_frame(timeout=30)).image[0, 0, 0]) == 40
            return client.session.stats()["stale_dropped"]

    try:
        assert asyncio.run(scenario()) == 0
    finally:
        model.shutdown()
