"""Several sessions on one `reactor run` (sessions_per_replica), over real WebRTC:
each steered on its own and checked from its own frames' stamps."""

from __future__ import annotations

import asyncio
import importlib.util

import httpx
import pytest
from conftest import DevServer
from paths import TEST_MODELS

from reactor_serve.client import SessionRefused, connect

STAMPED = TEST_MODELS / "viewer" / "stamped"
_spec = importlib.util.spec_from_file_location("_stamped_model_seats", STAMPED / "model.py")
_stamped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stamped)
SEATS = 3
# Three sessions' model work and aiortc peers on a loaded machine: waits are for what
# the frames carry, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server():
    with DevServer(STAMPED, seats=SEATS) as running:
        yield running


def tint_of(image) -> float:
    return float(image[_stamped.HEIGHT // 2 + 8:, :, :].mean())


async def wait_tint(client, tint: int, timeout: float = DEADLINE_S) -> list[int]:
    """Frames until the bottom half shows `tint`; then the stamps of ten more."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while abs(tint_of((await client.next_frame(timeout=timeout)).image) - tint) > 12:
        assert loop.time() < deadline, f"no frame with tint {tint}"
    stamps = []
    for _ in range(10):
        frame = await client.next_frame(timeout=timeout)
        assert abs(tint_of(frame.image) - tint) <= 12
        stamps.append(_stamped.read_stamp(frame.image))
    return stamps


async def test_each_seat_is_steered_on_its_own_and_a_full_replica_says_so(server):
    clients = [await connect(server.url) for _ in range(SEATS)]
    try:
        tints = (30, 128, 225)
        for client, tint in zip(clients, tints):
            client.send_command("set_tint", {"tint": tint})
        for client, tint in zip(clients, tints):
            stamps = await wait_tint(client, tint)
            # Its own counter, advancing: a frame stream of its own.
            assert stamps == sorted(stamps) and len(set(stamps)) > 5
        # Every applied command came back to its own session only.
        for client, tint in zip(clients, tints):
            applied = [m["data"]["data"]["args"]["tint"] for m in client.peer.messages
                       if m.get("scope") == "application"
                       and m["data"].get("type") == "applied"]
            assert applied == [tint]
        with pytest.raises(SessionRefused) as refused:
            await connect(server.url)
        assert refused.value.status == 409
        assert f"all {SEATS} seats" in str(refused.value)
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            summary = (await http.get(server.url, headers={"Accept": "application/json"})).json()
        capacity = summary["capacity"]
        assert capacity["seats_per_replica"] == SEATS
        assert capacity["seats_used"] == SEATS and capacity["seats_free"] == 0
    finally:
        for client in clients:
            await client.close()


async def test_a_session_joining_and_leaving_does_not_stall_the_others(server):
    first, second = await connect(server.url), await connect(server.url)
    try:
        first.send_command("set_tint", {"tint": 40})
        second.send_command("set_tint", {"tint": 200})
        await wait_tint(first, 40)
        await wait_tint(second, 200)
        before = [_stamped.read_stamp((await c.next_frame(timeout=DEADLINE_S)).image) for c in (first, second)]
        # A third joins, streams and leaves while the two stream on.
        third = await connect(server.url)
        third.send_command("set_tint", {"tint": 120})
        await wait_tint(third, 120)
        await third.close()
        # The two kept their own streams and tints throughout: their counters moved on.
        after = [_stamped.read_stamp((await c.next_frame(timeout=DEADLINE_S)).image) for c in (first, second)]
        assert all(a > b for a, b in zip(after, before)), (before, after)
        await wait_tint(first, 40)
        await wait_tint(second, 200)
        assert first.state == second.state == "streaming"
    finally:
        await first.close()
        await second.close()


async def test_hostile_commands_in_one_session_never_reach_another(server):
    attacker, bystander = await connect(server.url), await connect(server.url)
    try:
        bystander.send_command("set_tint", {"tint": 99})
        await wait_tint(bystander, 99)
        marker = len(bystander.peer.messages)
        for name, data in [
            ("set_tint", {"tint": "NaN"}), ("set_tint", {"tint": 10 ** 40}),
            ("set_tint", {"tint": -1}), ("no_such_command", {}),
            ("set_tint", {"tint": [[[[[[1]]]]]]}), ("set_tint", {"tint": "\ud800"}),
        ]:
            attacker.send_command(name, data)
        attacker.peer.send_raw("{not json")
        attacker.peer.send_raw(b"\x00\xff" * 100)
        attacker.send_command("set_tint", {"tint": 7})
        await wait_tint(attacker, 7)
        errors = [m for m in attacker.peer.messages
                  if m.get("data", {}).get("type") == "commandError"]
        assert len(errors) >= 5
        # The bystander saw none of it: no errors, no applied echo, same tint.
        seen = bystander.peer.messages[marker:]
        assert not [m for m in seen if m.get("data", {}).get("type") in ("commandError", "applied")]
        await wait_tint(bystander, 99)
        assert attacker.state == bystander.state == "streaming"
    finally:
        await attacker.close()
        await bystander.close()
