"""A flood of setters ends on the client's last value, through the model process
(`reactor run`) and through Serve, for a pipeline and a run loop (issue 19, item 4)."""

import asyncio

import pytest
from paths import TEST_MODELS

from reactor_serve.client import connect

MODELS = TEST_MODELS / "coalesce"
KINDS = ["shade_pipeline", "shade_loop"]


# The model process (or a Serve replica) and the client share a loaded machine: waits
# are for a condition, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def shades(client):
    return [
        m["data"]["brightness"]
        for m in client.peer.messages
        if m.get("scope") == "application" and m["data"].get("type") == "shade"
    ]


async def flood_ends_on_the_last_value(url):
    client = await connect(url)
    try:
        await client.peer.wait_for(lambda: shades(client), DEADLINE_S, "the first shade")
        # 1000 values in one burst, well past the rate limit's burst of 400 and the
        # 64-command queue; none of them is the last, 0.25.
        for i in range(999):
            client.send_command("set_brightness", {"brightness": 0.4 + (i % 150) / 100})
        client.send_command("set_brightness", {"brightness": 0.25})
        await client.peer.wait_for(lambda: shades(client)[-1:] == [0.25], DEADLINE_S,
                                     "the last value")
        # Nothing older lands after it: a stale value arriving late would show here. A
        # negative check: a busy machine can only make it pass more easily, never fail.
        await asyncio.sleep(1.0)
        assert shades(client)[-1] == 0.25
        errors = [
            m["data"]["data"] for m in client.peer.messages
            if m.get("scope") == "runtime" and m["data"].get("type") == "commandError"
        ]
        assert errors == []
        # The stats say how many values gave way to newer ones.
        await client.peer.wait_for(
            lambda: (client.stats or {}).get("commands_coalesced", 0) > 0, DEADLINE_S,
            "stats counting the coalesced values",
        )
    finally:
        await client.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_setter_flood_ends_on_the_last_value_on_reactor_run(reactor_run, kind):
    run = reactor_run(MODELS / kind)
    await flood_ends_on_the_last_value(run.url)


async def test_a_setter_flood_ends_on_the_last_value_through_serve(ray_serve):
    loopback = {"loopback_candidates": True}
    url = ray_serve.deploy("coalesce", {"models": [
        {"path": f"tests/models/coalesce/{kind}", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": loopback}
        for kind in KINDS
    ]})
    try:
        for name in ("shade-pipeline", "shade-loop"):
            await flood_ends_on_the_last_value(f"{url}/models/{name}")
    finally:
        ray_serve.delete("coalesce")
