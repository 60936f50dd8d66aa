"""Seats on a real local Ray Serve: a replica serves `sessions_per_replica` sessions
on its one loaded model, two sessions on one replica never see each other's input
frames, commands or messages, Serve fills the oldest replica's seats first, a
scale-down stops only an idle replica, and a crash of the model process ends every
session on it, each told why."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import httpx
import numpy as np
import pytest
from paths import TEST_MODELS

from reactor_serve.client import connect

pytestmark = pytest.mark.timeout(300)

STAMPED = TEST_MODELS / "viewer" / "stamped"
OPERATOR = {"X-Operator-Token": "op"}
# How long a wait for media (a frame, a message, an end) may take on a loaded machine.
MEDIA = 60
_spec = importlib.util.spec_from_file_location("_stamped_model_serve_seats", STAMPED / "model.py")
_stamped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stamped)


def tint_of(image) -> float:
    return float(image[_stamped.HEIGHT // 2 + 8:, :, :].mean())


async def shows_tint(client, tint: int, timeout: float = MEDIA) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while abs(tint_of((await client.next_frame(timeout=timeout)).image) - tint) > 12:
        assert loop.time() < deadline, f"no frame with tint {tint} within {timeout} s"


async def placements(model_url: str) -> list[str]:
    async with httpx.AsyncClient(timeout=30) as http:
        listed = (await http.get(f"{model_url}/sessions", headers=OPERATOR)).json()["sessions"]
    return sorted(entry["replica"] for entry in listed)


async def capacity(url: str) -> dict:
    async with httpx.AsyncClient(timeout=30) as http:
        [model] = (await http.get(f"{url}/models")).json()["models"]
    return model["capacity"]


async def test_seats_fill_a_busy_replica_first_and_each_session_is_its_own(ray_serve):
    url = ray_serve.deploy("seats", {"operator_token": "op", "models": [
        {"path": "tests/models/viewer/stamped", "min_replicas": 2, "max_replicas": 2, "warm_spares": 0,
         "sessions_per_replica": 2, "cpus_per_replica": 0.5,
         "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/stamped"
    clients = []
    try:
        for tint in (30, 220):
            client = await connect(model)
            clients.append(client)
            client.send_command("set_tint", {"tint": tint})
            await shows_tint(client, tint)
        # Both sessions share one replica: the other stays idle, whole.
        first, second = await placements(model)
        assert first == second
        for client, tint in zip(clients, (30, 220)):
            await shows_tint(client, tint)
        # The next takes the idle replica's seat.
        third = await connect(model)
        clients.append(third)
        third.send_command("set_tint", {"tint": 128})
        await shows_tint(third, 128)
        assert len(set(await placements(model))) == 2
        deadline = time.monotonic() + MEDIA
        while (seats := await capacity(url))["seats_used"] != 3:
            assert time.monotonic() < deadline, f"the capacity never counted 3 seats: {seats}"
            await asyncio.sleep(0.5)  # the poll interval of this bounded wait
        assert (seats["seats_per_replica"], seats["seats_used"], seats["seats_free"]) == (2, 3, 1)
        assert (seats["busy"], seats["free"]) == (1, 1)
    finally:
        for client in clients:
            await client.close()
        ray_serve.delete("seats")


RED, BLUE = (200, 40, 40), (40, 40, 200)


def colour_of(image) -> tuple[int, int, int]:
    return tuple(int(round(c)) for c in image.reshape(-1, 3).mean(axis=0))


def near(colour, expected, tolerance: int = 30) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, expected))


async def frames_show(client, expected, count: int, timeout: float = MEDIA) -> None:
    """The next frame of `expected` colour comes within `timeout`, and so do the
    `count` after it, every one of them that colour."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not near(colour_of((await client.next_frame(timeout=timeout)).image), expected):
        assert loop.time() < deadline, f"no frame of {expected} within {timeout} s"
    for _ in range(count):
        colour = colour_of((await client.next_frame(timeout=timeout)).image)
        assert near(colour, expected), f"a frame of {colour} among frames of {expected}"


async def test_two_seats_of_one_replica_never_see_each_others_frames_or_hostile_commands(ray_serve):
    # The reference video-to-video model, unchanged, with two seats on one replica.
    url = ray_serve.deploy("seats-apart", {"operator_token": "op", "models": [
        {"path": "tests/models/reference/v2v", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "sessions_per_replica": 2, "cpus_per_replica": 0.5,
         "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/v2v"
    red = np.full((96, 128, 3), RED, np.uint8)
    blue = np.full((96, 128, 3), BLUE, np.uint8)
    attacker = bystander = None
    try:
        attacker = await connect(model, inputs={"camera": red}, timeout=90)
        bystander = await connect(model, inputs={"camera": blue}, timeout=90)
        first, second = await placements(model)
        assert first == second, "both sessions must share the one replica"
        # Each sees its own camera only, frame after frame.
        await frames_show(attacker, RED, 30)
        await frames_show(bystander, BLUE, 30)
        marker = len(bystander.peer.messages)
        for name, data in [
            ("set_style", {"style": "NaN"}), ("set_style", {"style": 10 ** 40}),
            ("set_style", {"style": None}), ("no_such_command", {}),
            ("set_style", {"style": [[[[[[1]]]]]]}), ("set_style", {"style": "\ud800"}),
        ]:
            attacker.send_command(name, data)
        attacker.peer.send_raw("{not json")
        attacker.peer.send_raw(b"\x00\xff" * 100)
        # A valid command too: "sketch" inverts the attacker's picture, not the other's.
        attacker.send_command("set_style", {"style": "sketch"})
        await frames_show(attacker, tuple(255 - c for c in RED), 20)
        errors = [m for m in attacker.peer.messages
                  if m.get("data", {}).get("type") == "commandError"]
        assert len(errors) >= 5, errors
        await frames_show(bystander, BLUE, 30)
        seen = [m.get("data", {}).get("type") for m in bystander.peer.messages[marker:]]
        assert "commandError" not in seen, seen
        assert attacker.state == bystander.state == "streaming"
    finally:
        for client in (attacker, bystander):
            if client is not None:
                await client.close()
        ray_serve.delete("seats-apart")


def replica_states(app: str) -> dict[str, int]:
    from ray import serve

    return dict(serve.status().applications[app].deployments["model-stamped"].replica_states)


async def held(predicate, seconds: float, what: str) -> None:
    """`predicate` stays true for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        await asyncio.sleep(0.25)  # the poll interval of a negative check


async def eventually(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        await asyncio.sleep(0.25)  # the poll interval of a wait bounded by `seconds`


async def replica_of(model_url: str, client) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        listed = (await http.get(f"{model_url}/sessions", headers=OPERATOR)).json()["sessions"]
    # Operators see the first four characters of an id.
    [entry] = [e for e in listed if e["session"] == client.session_id[:4] + "…"]
    return entry["replica"]


async def test_a_scale_down_waits_for_the_newest_replica_to_empty_and_new_sessions_go_to_the_oldest(
    ray_serve,
):
    # Serve stops the newest replica first. With the oldest idle and the newest holding
    # a session, the seat count alone would stop the newest and drain a busy replica;
    # the policy holds both, the router sends the next session to the oldest, and the
    # newest goes once its session ends.
    url = ray_serve.deploy("seats-down", {"operator_token": "op", "models": [
        {"path": "tests/models/viewer/stamped", "min_replicas": 1, "max_replicas": 2,
         "warm_spares": 0, "sessions_per_replica": 2, "downscale_delay_s": 1,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/stamped"
    running = lambda: replica_states("seats-down").get("RUNNING", 0)  # noqa: E731
    clients = []
    try:
        await eventually(lambda: running() == 1, 120, "one replica")
        for tint in (30, 90, 160):
            client = await connect(model, timeout=90)
            clients.append(client)
            client.send_command("set_tint", {"tint": tint})
            await shows_tint(client, tint)
        old, new = (await replica_of(model, clients[0]), await replica_of(model, clients[2]))
        assert await replica_of(model, clients[1]) == old
        assert old != new and running() == 2
        # The old replica's two sessions leave; the new one's stays.
        for client in clients[:2]:
            await client.close()
        # Well past the downscale delay and the metrics' look-back: nothing stops. A
        # negative check: a loaded machine can only make Serve slower to stop one.
        await held(lambda: replica_states("seats-down") == {"RUNNING": 2}, 8.0,
                   "two running replicas, none stopping")
        await shows_tint(clients[2], 160)
        # A new session takes the old replica's seat, though the new one is fuller.
        fourth = await connect(model)
        clients.append(fourth)
        fourth.send_command("set_tint", {"tint": 220})
        await shows_tint(fourth, 220)
        assert await replica_of(model, fourth) == old
        # The new replica's session ends: now it is idle, and it goes.
        await clients[2].close()
        await eventually(lambda: replica_states("seats-down") == {"RUNNING": 1}, 120,
                         "a scale-down to one replica")
        await shows_tint(fourth, 220)
        assert await replica_of(model, fourth) == old
        assert await placements(model) == [old]
    finally:
        for client in clients:
            await client.close()
        ray_serve.delete("seats-down")


# Past the module's bound: the deploy, the crash and the reload each wait on a loaded machine.
@pytest.mark.timeout(600)
async def test_a_crash_ends_every_session_of_the_replica_and_it_serves_again(ray_serve):
    url = ray_serve.deploy("seats-crash", {"operator_token": "op", "models": [
        {"path": "tests/models/process/crashing", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "sessions_per_replica": 2, "cpus_per_replica": 0.5,
         "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/crashing"
    try:
        victims = [await connect(model), await connect(model)]
        for victim in victims:
            await victim.next_frame(timeout=MEDIA)
        victims[0].send_command("crash", {"how": "segfault"})
        for victim in victims:
            await victim.wait_closed(timeout=MEDIA)
            assert victim.end_reason == "error"
            assert "the model process was killed by SIGSEGV" in victim.end_message
        # Both wait for the model process to reload (a fresh process importing torch),
        # three media windows as every test after a crash or a killed rank gives it.
        survivors = [await connect(model, timeout=3 * MEDIA) for _ in range(2)]
        for survivor in survivors:
            assert (await survivor.next_frame(timeout=MEDIA)).image.shape == (48, 64, 3)
            await survivor.close()
        for victim in victims:
            await victim.close()
    finally:
        ray_serve.delete("seats-crash")
