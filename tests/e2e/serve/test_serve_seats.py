"""Seats on a real local Ray Serve: a replica serves `sessions_per_replica` sessions
on its one loaded model, Serve fills a busy replica's seats before an idle one's, and a
crash of the model process ends every session on it, each told why."""

from __future__ import annotations

import asyncio
import importlib.util

import httpx
import pytest
from paths import TEST_MODELS

from reactor_serve.client import connect

pytestmark = pytest.mark.timeout(300)

STAMPED = TEST_MODELS / "viewer" / "stamped"
OPERATOR = {"X-Operator-Token": "op"}
_spec = importlib.util.spec_from_file_location("_stamped_model_serve_seats", STAMPED / "model.py")
_stamped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stamped)


def tint_of(image) -> float:
    return float(image[_stamped.HEIGHT // 2 + 8:, :, :].mean())


async def shows_tint(client, tint: int, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while abs(tint_of((await client.next_frame()).image) - tint) > 12:
        assert loop.time() < deadline, f"no frame with tint {tint} within {timeout} s"


async def placements(model_url: str) -> list[str]:
    async with httpx.AsyncClient(timeout=10) as http:
        listed = (await http.get(f"{model_url}/sessions", headers=OPERATOR)).json()["sessions"]
    return sorted(entry["replica"] for entry in listed)


async def capacity(url: str) -> dict:
    async with httpx.AsyncClient(timeout=10) as http:
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
        for _ in range(20):
            seats = await capacity(url)
            if seats["seats_used"] == 3:
                break
            await asyncio.sleep(0.5)
        assert (seats["seats_per_replica"], seats["seats_used"], seats["seats_free"]) == (2, 3, 1)
        assert (seats["busy"], seats["free"]) == (1, 1)
    finally:
        for client in clients:
            await client.close()
        ray_serve.delete("seats")


async def test_a_crash_ends_every_session_of_the_replica_and_it_serves_again(ray_serve):
    url = ray_serve.deploy("seats-crash", {"operator_token": "op", "models": [
        {"path": "tests/models/process/crashing", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "sessions_per_replica": 2, "cpus_per_replica": 0.5,
         "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/crashing"
    try:
        victims = [await connect(model), await connect(model)]
        for victim in victims:
            await victim.next_frame()
        victims[0].send_command("crash", {"how": "segfault"})
        for victim in victims:
            await victim.wait_closed(timeout=30)
            assert victim.end_reason == "error"
            assert "the model process was killed by SIGSEGV" in victim.end_message
        survivors = [await connect(model), await connect(model)]
        for survivor in survivors:
            assert (await survivor.next_frame(timeout=60)).image.shape == (48, 64, 3)
            await survivor.close()
        for victim in victims:
            await victim.close()
    finally:
        ray_serve.delete("seats-crash")
