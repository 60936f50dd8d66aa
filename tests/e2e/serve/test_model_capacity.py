"""Each model's capacity in `GET /models` (Serve's replica counts, the session
directory's live and waiting sessions), the picker page showing it, and the operator
listing naming the node a session runs on; on a real local Ray with the Python client
and headless Chromium. One app serves every Serve test here."""

import asyncio
import time

import httpx
import pytest
from browser_pages import wait_for

from reactor_serve.client import connect

pytestmark = pytest.mark.timeout(300)

GRADIENT = "examples/gradient"
OPERATOR = {"X-Operator-Token": "op"}
APP = "capacity"
# How long a wait for media (a frame, a message, an end) may take on a loaded machine.
MEDIA = 60
# How long a replica started from zero (a Ray worker, the model loaded) may take.
COLD_START_S = 180


@pytest.fixture(scope="module")
def capacity_app(ray_serve):
    """One gradient replica at most: a second session has to wait for the first."""
    url = ray_serve.deploy(APP, {"operator_token": "op", "models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    yield url
    ray_serve.delete(APP)


async def capacity(url):
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.get(f"{url}/models")
    assert reply.status_code == 200, reply.text
    [model] = reply.json()["models"]
    return model["capacity"]


async def settles_at(url, expected, what, timeout=MEDIA):
    """`GET /models` reports `expected` (the readings behind it are reused for ~2 s)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await capacity(url)
        if all(last[key] == value for key, value in expected.items()):
            return last
        await asyncio.sleep(0.3)  # the poll interval of a wait bounded by `timeout`
    raise AssertionError(f"timed out waiting for {what}: {expected} (last: {last})")


IDLE = {"replicas": 1, "starting": 0, "busy": 0, "free": 1, "waiting": 0, "max_replicas": 1,
        "seats_per_replica": 1, "seats_used": 0, "seats_free": 1}


async def test_capacity_counts_live_and_waiting_sessions(capacity_app):
    model = f"{capacity_app}/models/gradient"
    assert await settles_at(capacity_app, IDLE, "a fresh app's one free replica") == IDLE

    first = await connect(model)
    second_task = None
    try:
        await first.next_frame(timeout=MEDIA)
        await settles_at(capacity_app, {"replicas": 1, "busy": 1, "free": 0, "waiting": 0},
                         "the live session's replica to count as busy")

        # Every slot busy and max_replicas reached: the next session waits.
        queued = []
        second_task = asyncio.create_task(connect(model, timeout=120, on_queue=queued.append))
        await settles_at(capacity_app, {"replicas": 1, "busy": 1, "free": 0, "waiting": 1},
                         "the second session to count as waiting")
        # The client hears of its place at its next poll of the answer, which a loaded
        # machine may run after the count above already says it waits.
        deadline = time.monotonic() + MEDIA
        while not queued:
            assert time.monotonic() < deadline, "the client was never told it waits"
            await asyncio.sleep(0.1)  # the poll interval of this bounded wait
        assert not second_task.done()

        await first.close()
        second = await asyncio.wait_for(second_task, 120)
        try:
            await second.next_frame(timeout=MEDIA)
            await settles_at(capacity_app, {"busy": 1, "free": 0, "waiting": 0},
                             "the waiting session to take the freed replica")
        finally:
            await second.close()
        assert await settles_at(capacity_app, IDLE, "the replica to be free again") == IDLE
    finally:
        await first.close()
        if second_task is not None and not second_task.done():
            second_task.cancel()


async def test_operator_listing_names_the_node_a_session_runs_on(capacity_app):
    import ray

    model = f"{capacity_app}/models/gradient"
    client = await connect(model)
    try:
        await client.next_frame(timeout=MEDIA)
        async with httpx.AsyncClient(timeout=30) as http:
            [listed] = (await http.get(f"{model}/sessions", headers=OPERATOR)).json()["sessions"]
        # This test's Ray has one node: the replica runs on it.
        assert listed["node_id"] == ray.get_runtime_context().get_node_id()
        assert listed["node_ip"] == ray.util.get_node_ip_address()
        # `replica` is the Serve replica id, the last part of its actor's name.
        actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        assert f"SERVE_REPLICA::{APP}#model-gradient#{listed['replica']}" in actors
    finally:
        await client.close()
    await settles_at(capacity_app, IDLE, "the replica to be free again")


async def test_reactor_run_reports_its_one_slot(reactor_run):
    run = reactor_run(GRADIENT)

    async def summary():
        async with httpx.AsyncClient(timeout=30) as http:
            return (await http.get(f"{run.url}/", headers={"Accept": "application/json"})).json()

    assert (await summary())["capacity"] == IDLE
    client = await connect(run.url)
    try:
        await client.next_frame(timeout=MEDIA)
        assert (await summary())["capacity"] == {**IDLE, "busy": 1, "free": 0, "seats_used": 1,
                                                 "seats_free": 0}
    finally:
        await client.close()
    deadline = time.monotonic() + MEDIA
    while (await summary())["capacity"]["busy"]:
        assert time.monotonic() < deadline, "the slot was not freed after the session closed"
        await asyncio.sleep(0.2)  # the poll interval of this bounded wait
    assert (await summary())["capacity"] == IDLE


# Playwright's sync API drives its own loop: this test comes after the async ones.
def test_picker_shows_capacity_and_updates_it(browser, capacity_app):
    card = ".model-card:has-text('gradient') .capacity"
    picker_context, player_context = browser.new_context(), browser.new_context()
    try:
        picker = picker_context.new_page()
        picker.goto(capacity_app + "/")
        wait_for(lambda: picker.locator(card).count() == 1, 30, "the gradient card")
        wait_for(lambda: picker.inner_text(card).startswith("1 free · 0 busy · 0 waiting"), MEDIA,
                 "the idle capacity")
        assert picker.inner_text(card) == "1 free · 0 busy · 0 waiting · up to 1 replica"

        player = player_context.new_page()
        player.goto(capacity_app + "/models/gradient/")
        wait_for(lambda: player.inner_text("#connection") == "connected", 60,
                 "the player page to connect")
        # The open picker refreshes by itself.
        wait_for(lambda: picker.inner_text(card).startswith("0 free · 1 busy"), MEDIA,
                 "the picker to show the busy replica")
        player.click("#stop")
        wait_for(lambda: picker.inner_text(card).startswith("1 free · 0 busy"), MEDIA,
                 "the picker to show the replica free again")

        # A hidden tab stops polling; shown again, it refreshes at once.
        # The page's own clock says which fetches began after it was hidden: a refresh
        # already in flight then is told apart by when it began, not by how long the
        # test waited for its event to arrive.
        visibility = """(state) => {
            const at = performance.now();
            performance.clearResourceTimings();
            Object.defineProperty(document, "visibilityState", { configurable: true, get: () => state });
            document.dispatchEvent(new Event("visibilitychange"));
            return at;
        }"""
        fetched_since = """(since) => performance.getEntriesByType("resource")
            .filter(e => e.name.endsWith("/models") && e.startTime >= since).length"""
        hidden_at = picker.evaluate(visibility, "hidden")
        # Longer than the page's 3 s interval: a negative check, which a loaded machine
        # can only make pass more easily.
        picker.wait_for_timeout(4000)
        assert picker.evaluate(fetched_since, hidden_at) == 0
        shown_at = picker.evaluate(visibility, "visible")
        wait_for(lambda: picker.evaluate(fetched_since, shown_at), MEDIA,
                 "a refresh when the tab is shown again")
    finally:
        picker_context.close()
        player_context.close()


@pytest.mark.timeout(COLD_START_S + 300)  # the deploy, the cold start, then media
def test_a_model_scaled_to_zero_says_so_and_its_first_session_starts_a_replica(browser, ray_serve):
    url = ray_serve.deploy("capacity-cold", {"models": [
        {"path": GRADIENT, "min_replicas": 0, "max_replicas": 1, "warm_spares": 0,
         # The first session waits while a replica starts: as long as the test does.
         "admission_timeout_s": COLD_START_S,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    card = ".model-card:has-text('gradient') .capacity"
    picker_context, player_context = browser.new_context(), browser.new_context()
    try:
        [model] = httpx.get(f"{url}/models", timeout=30).json()["models"]
        # No replica has run yet, so none has published the deployment's max_replicas.
        assert model["capacity"] == {"replicas": 0, "starting": 0, "busy": 0, "free": 0,
                                     "waiting": 0, "max_replicas": None,
                                     "seats_per_replica": 1, "seats_used": 0, "seats_free": 0}
        picker = picker_context.new_page()
        picker.goto(url + "/")
        wait_for(lambda: picker.locator(card).count() == 1, 30, "the gradient card")
        assert picker.inner_text(card) == "scales from zero — first session starts a replica"

        player = player_context.new_page()
        player.goto(url + "/models/gradient/")
        # A replica started from zero (a Ray worker, the model loaded) before the
        # session can connect: a deployment's wait, not a media one.
        wait_for(lambda: player.inner_text("#connection") == "connected", COLD_START_S,
                 "the first session to start a replica and connect")
        wait_for(lambda: picker.inner_text(card) == "0 free · 1 busy · 0 waiting · up to 1 replica",
                 MEDIA, "the picker to show the started replica busy")
        player.click("#stop")
    finally:
        picker_context.close()
        player_context.close()
        ray_serve.delete("capacity-cold")
