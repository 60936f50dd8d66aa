"""Seats: several sessions on one loaded model (runtime/seats.py), in this process and
in a model process of its own."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import pytest
from paths import ROOT

from reactor_serve.interface import InputField, InputState, ReactorPipeline
from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.isolation.model_process import ModelProcess
from reactor_serve.runtime.local_client import LocalClient
from reactor_serve.runtime.seats import seat_count
from reactor_serve.runtime.shared_state import SharedState, SharedStateChanged

EXAMPLES = ROOT / "examples"
MODELS = ROOT / "tests" / "models"


@pytest.fixture(autouse=True)
def _isolate_imports(isolated_imports):
    """Tests here load model directories; undo what that adds."""


@dataclass
class Level(InputState):
    level: int = InputField(default=40, ge=0, le=255, description="Pixel value")


class Shades(ReactorPipeline):
    """Each frame is the session's level; what load() made is one array for all."""

    state: Level
    fps = 20

    def load(self, config):
        self.palette = np.arange(256, dtype=np.uint8)
        self.loads = getattr(type(self), "loads", 0) + 1
        type(self).loads = self.loads

    def inference(self):
        while True:
            yield np.full((8, 8, 3), self.palette[self.state.level], np.uint8)


class Hoarder(Shades):
    """Keeps its history in a list load() made: shared by every seat."""

    def load(self, config):
        super().load(config)
        self.history = []

    def inference(self):
        while True:
            self.history.append(self.state.level)
            yield np.full((8, 8, 3), self.state.level, np.uint8)


async def _level_of(client: LocalClient, wanted: int, timeout: float = 60.0) -> int:
    """The level the client is shown once it shows `wanted` (or the last one seen)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    value = -1
    while loop.time() < deadline and value != wanted:
        value = int((await client.next_frame(timeout=timeout)).image[0, 0, 0])
    return value


async def test_each_seat_has_its_own_state_and_the_model_loads_once(host_of):
    Shades.loads = 0
    host = host_of(Shades, seats=3)
    assert [seat is host for seat in host.seats] == [True, False, False]
    assert Shades.loads == 1
    # What load() made is the same object on every seat; what a seat binds is its own.
    models = [seat.model for seat in host.seats]
    assert all(m.palette is models[0].palette for m in models)
    assert len({id(m.state) for m in models}) == 3
    clients = [LocalClient(seat) for seat in host.seats]
    for client in clients:
        await client.connect()
    try:
        for client, level in zip(clients, (10, 120, 250)):
            client.send_command("set_level", {"level": level})
        for client, level in zip(clients, (10, 120, 250)):
            assert await _level_of(client, level) == level
        # A command to one seat changed nothing on the others.
        clients[1].send_command("set_level", {"level": 77})
        assert await _level_of(clients[1], 77) == 77
        assert await _level_of(clients[0], 10) == 10
        assert await _level_of(clients[2], 250) == 250
    finally:
        for client in clients:
            await client.close()


async def test_a_seat_is_one_session_at_a_time_and_frees_on_close(host_of):
    host = host_of(Shades, seats=2)
    first = LocalClient(host.seats[0])
    await first.connect()
    with pytest.raises(Exception, match="busy"):
        await LocalClient(host.seats[0]).connect()
    # The other seat takes a session meanwhile.
    async with LocalClient(host.seats[1]) as other:
        await other.next_frame(timeout=60)
    await first.close()
    async with LocalClient(host.seats[0]) as again:
        await again.next_frame(timeout=60)


async def test_changing_what_load_made_in_place_ends_the_session_naming_it(host_of):
    host = host_of(Hoarder, seats=2)
    async with LocalClient(host.seats[0]) as client:
        reason = await client.wait_closed(timeout=60)
    assert reason == "error"
    assert "self.history" in client.end_detail
    assert "sessions_per_replica" in client.end_detail
    # The model is still there for the next session.
    assert host.healthy


async def test_one_seat_keeps_todays_behaviour_and_watches_nothing(host_of):
    host = host_of(Hoarder, seats=1)
    assert host.shared_state is None
    async with LocalClient(host) as client:
        for _ in range(30):
            await client.next_frame(timeout=60)
        assert client.end_reason is None


def test_shared_state_sees_in_place_changes_only():
    torch = pytest.importorskip("torch")

    class Loaded:
        pass

    model = Loaded()
    model.weights = torch.zeros(4)
    model.net = torch.nn.Linear(2, 2)
    model.cache = {}
    model.names = ["a"]
    model.size = 3
    shared = SharedState(model, "Loaded")
    assert sorted(shared.watched) == ["cache", "names", "net", "weights"]
    shared.check()
    # Reading, and rebinding an attribute (what a seat's copy does), change nothing.
    _ = model.weights + 1
    model.size = 4
    shared.check()
    model.weights.add_(1)
    with pytest.raises(SharedStateChanged, match=r"self\.weights"):
        shared.check()
    shared.check()  # reported once
    with torch.no_grad():
        model.net.weight.mul_(2)
    model.cache["k"] = 1
    with pytest.raises(SharedStateChanged) as changed:
        shared.check()
    assert "self.net" in str(changed.value) and "self.cache" in str(changed.value)


@pytest.mark.parametrize("value", [0, -1, 65, 1.5, "2", True, [2]])
def test_seat_count_names_the_field_for_a_bad_value(value):
    with pytest.raises(ValueError, match="sessions_per_replica: expected a whole number"):
        seat_count({"sessions_per_replica": value}, "m")
    with pytest.raises(ValueError, match="model m: sessions_per_replica"):
        seat_count({}, "m", value)


def test_seat_count_defaults_to_one_and_an_override_wins():
    assert seat_count(None, "m") == 1
    assert seat_count({"sessions_per_replica": 3}, "m") == 3
    assert seat_count({"sessions_per_replica": 3}, "m", 2) == 2


# ---- every example, unchanged, at 2 and 4 seats ------------------------------------


def _feed(client: LocalClient, host: ModelHost) -> None:
    for track in host.spec.inputs:
        if track.kind == "video":
            client.send_frame(track.name, np.full((48, 64, 3), 90, np.uint8))


@pytest.mark.parametrize("seats", [2, 4])
@pytest.mark.parametrize("example", [
    *(EXAMPLES / name for name in ("gradient", "webcam_style", "audio_tone", "legacy_blocks",
                                   "world")),
    # The reference pages' models, as written there.
    *(MODELS / "reference" / name for name in ("generator", "legacy_blocks", "run_loop", "v2v")),
], ids=lambda path: f"{path.parent.name}/{path.name}")
async def test_every_example_serves_every_seat_at_once(host_of, example, seats):
    host = host_of(example, seats=seats)
    assert len(host.seats) == seats
    clients = [LocalClient(seat) for seat in host.seats]
    try:
        for client in clients:
            await client.connect()
            if "set_prompt" in host.spec.commands:  # legacy_blocks waits for one
                client.send_command("set_prompt", {"prompt": "seats"})
        for _ in range(3):
            for client, seat in zip(clients, host.seats):
                _feed(client, seat)
                frame = await client.next_frame(timeout=30)
                assert frame.video
                assert client.end_reason is None, client.end_detail
    finally:
        for client in clients:
            await client.close()


# ---- seats in a model process ----------------------------------------------------------


async def test_a_model_process_serves_its_seats_and_a_crash_ends_them_all(tmp_path):
    process = ModelProcess(MODELS / "process" / "crashing", seats=2)
    await asyncio.to_thread(process.start)
    try:
        assert len(process.seats) == 2
        clients = [LocalClient(seat) for seat in process.seats]
        for client in clients:
            await client.connect()
            assert (await client.next_frame(timeout=60)).image.shape == (48, 64, 3)
        clients[0].send_command("crash", {"how": "segfault"})
        for client in clients:
            assert await client.wait_closed(timeout=60) == "error"
            assert "killed by SIGSEGV" in client.end_detail
        # The process restarts and both seats serve again.
        again = [LocalClient(seat) for seat in process.seats]
        for client in again:
            await client.connect()
            assert (await client.next_frame(timeout=60)).image.shape == (48, 64, 3)
        for client in again:
            await client.close()
    finally:
        await asyncio.to_thread(process.shutdown)


async def test_a_handler_error_ends_only_its_own_seats_session():
    process = ModelProcess(MODELS / "process" / "crashing", seats=2)
    await asyncio.to_thread(process.start)
    try:
        failing, other = LocalClient(process.seats[0]), LocalClient(process.seats[1])
        await failing.connect()
        await other.connect()
        failing.send_command("crash", {"how": "raise"})
        assert await failing.wait_closed(timeout=60) == "error"
        assert "simulated handler failure" in failing.end_detail
        for _ in range(10):
            await other.next_frame(timeout=60)
        assert other.end_reason is None
        await other.close()
    finally:
        await asyncio.to_thread(process.shutdown)


class ThreadCountingShades(Shades):
    def load(self, config):
        import torch

        super().load(config)
        torch.set_num_threads(1)

    def inference(self):
        import torch

        while True:
            self.threads = torch.get_num_threads()  # per seat: assigned
            yield np.full((8, 8, 3), 1, np.uint8)


async def test_every_seat_runs_with_the_torch_threads_load_set(host_of):
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() == 1:
        pytest.skip("this machine's torch starts with one thread: nothing to tell apart")
    host = host_of(ThreadCountingShades, seats=2)
    async with LocalClient(host.seats[1]) as client:
        await client.next_frame(timeout=60)
        assert host.seats[1].model.threads == 1


def test_torch_thread_settings_carry_from_one_thread_to_another():
    torch = pytest.importorskip("torch")
    import threading

    from reactor_serve.runtime.seats import TorchThreadSettings

    seen: dict[str, object] = {}
    loaded = threading.Event()

    def seat() -> None:
        # A thread already running when load() changed the setting, as a seat's is,
        # with a count of its own (a new thread's starts from the last one set).
        torch.set_num_threads(2)
        seen["before"] = torch.get_num_threads()
        seen["loaded"] = loaded.wait(60)
        seen["unchanged"] = torch.get_num_threads()
        seen["settings"].apply()
        seen["after"] = torch.get_num_threads()

    def loader() -> None:
        torch.set_num_threads(1)
        seen["settings"] = TorchThreadSettings.of_this_thread()
        loaded.set()

    threads = [threading.Thread(target=seat), threading.Thread(target=loader)]
    threads[0].start()
    deadline = time.monotonic() + 60
    while "before" not in seen:
        assert time.monotonic() < deadline, "the seat's thread never set its count"
        time.sleep(0.01)  # the poll interval of a wait with a deadline
    threads[1].start()
    for thread in threads:
        thread.join()
    assert seen["loaded"], "the loader's settings never came"
    assert seen["before"] == seen["unchanged"] == 2
    assert seen["after"] == 1
    # Reading the settings never initialises CUDA (on a machine without it, or before
    # the model used it, there is no device to carry).
    assert seen["settings"].cuda_device is None
    assert not torch.cuda.is_initialized()
