"""Sessions that survive the control plane: a stateless ingress of two replicas, sessions
owned by their model replicas, on a real local Ray with the Python client over WebRTC."""

import asyncio
import logging
import time

import httpx
import numpy as np
import pytest

from reactor_serve.client import connect
from waits import until

pytestmark = pytest.mark.timeout(300)
GRADIENT = "examples/gradient"
# How long a wait for media (a frame, a message, an end) may take on a loaded machine.
MEDIA = 60
OPERATOR = {"X-Operator-Token": "op"}


def replica_states(app, deployment):
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return status.replica_states


def replica_actors(app, deployment):
    """Serve names replica actors SERVE_REPLICA::<app>#<deployment>#<replica id>."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))


def kill(actor_name):
    import ray

    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)


def in_daemon_thread(function, *args):
    """`function(*args)` on a daemon thread, as an awaitable. Not the loop's executor:
    a call that never returns (a deploy waiting on an application this test deletes
    after a failure) must not hold the event loop's shutdown, and the run, forever."""
    import concurrent.futures
    import threading

    future = concurrent.futures.Future()

    def run():
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to the awaiting test
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return asyncio.wrap_future(future)


async def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.2)  # the poll interval of a wait bounded by `timeout`
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def frames_flow(client, count=15, timeout=MEDIA):
    """`count` more frames arrive and the session stays open.

    Counted, not timed: on a loaded 2-core machine the encoder runs slower than
    the gradient's 30 fps, and a rate would measure the machine, not the path.
    """
    received = []
    previous = client.peer.on_video
    client.peer.on_video = received.append
    try:
        await wait_until(lambda: len(received) >= count, timeout, f"{count} frames")
    finally:
        client.peer.on_video = previous
    assert not client.closed, (client.end_reason, client.end_message)


async def mean_brightness(client):
    frame = await client.next_frame(timeout=MEDIA)
    for _ in range(10):
        frame = await client.next_frame(timeout=MEDIA)
    return float(np.mean(frame.image))


async def dimmed(client, below):
    """The mean brightness of the first frame of `client` darker than `below`: the
    frames themselves say when the brightness command has applied."""
    deadline = time.monotonic() + MEDIA
    while (level := float(np.mean((await client.next_frame(timeout=MEDIA)).image))) >= below:
        assert time.monotonic() < deadline, f"no frame darker than {below} after set_brightness"
    return level


async def test_two_ingress_replicas_a_killed_one_loses_no_session(ray_serve):
    url = ray_serve.deploy("ha", {"operator_token": "op", "ingress_replicas": 2, "models": [
        {"path": GRADIENT, "min_replicas": 3, "max_replicas": 3, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/gradient"
    assert replica_states("ha", "ReactorIngress").get("RUNNING") == 2
    first = await connect(model)
    second = await connect(model)
    try:
        first.send_command("set_brightness", {"brightness": 0.2})
        await dimmed(first, 0.5 * await mean_brightness(second))
        dark = await mean_brightness(first)
        assert dark < 0.5 * await mean_brightness(second)

        ingress = replica_actors("ha", "ReactorIngress")
        assert len(ingress) == 2
        kill(ingress[0])
        await frames_flow(first)
        await frames_flow(second)
        # A network drop after the kill: the client offers again and the session,
        # with its state, answers through the surviving ingress replica.
        await first.peer.pc.close()
        await wait_until(lambda: first.reconnects >= 1 and first.state == "streaming", MEDIA,
                         "the first client to reconnect")
        assert await mean_brightness(first) < 0.5 * await mean_brightness(second)
        third = await connect(model)
        await third.next_frame(timeout=MEDIA)
        await third.close()

        # Every ingress replica gone at once: media never passed through them.
        for name in replica_actors("ha", "ReactorIngress"):
            kill(name)
        await frames_flow(first, count=40)
        await frames_flow(second, count=10)
        await wait_until(lambda: replica_states("ha", "ReactorIngress").get("RUNNING") == 2,
                         120, "Serve to restart the ingress")
        # The restarted ingress replicas' first answers can be slow on a loaded machine
        # (Serve's controller is still busy with the restart); ask as a client would,
        # again after a timeout.
        async def listed_sessions():
            # A per-request timeout inside a bounded wait: a slow answer is asked again.
            async with httpx.AsyncClient(timeout=10) as http:
                try:
                    reply = await http.get(f"{model}/sessions", headers=OPERATOR)
                except httpx.TimeoutException:
                    return None
                return reply.json()["sessions"] if reply.status_code == 200 else None

        listed = await wait_until(listed_sessions, 90, "the restarted ingress to list sessions")
        assert len(listed) == 2 and all(s["state"] == "placed" for s in listed)
        await second.peer.pc.close()
        await wait_until(lambda: second.reconnects >= 1 and second.state == "streaming", MEDIA,
                         "the second client to reconnect through the new ingress")
        await frames_flow(second)
    finally:
        await first.close()
        await second.close()
        ray_serve.delete("ha")


async def test_changing_one_models_settings_leaves_the_other_models_sessions_alive(
    ray_serve, caplog,
):
    # Each reconnect attempt's failure is logged at INFO: shown if this test fails.
    caplog.set_level(logging.INFO, logger="reactor_serve.client")
    def args(max_tone_replicas):
        return {"ingress_replicas": 2, "models": [
            {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
             "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}},
            {"path": "examples/audio_tone", "min_replicas": 1,
             "max_replicas": max_tone_replicas, "warm_spares": 0, "cpus_per_replica": 0.5,
             "webrtc": {"loopback_candidates": True}},
        ]}

    url = ray_serve.deploy("change", args(1))
    states: list[tuple[float, str, dict]] = []
    client = await connect(f"{url}/models/gradient",
                           on_state=lambda s, d: states.append((time.monotonic(), s, d)))
    try:
        bright = await mean_brightness(client)
        client.send_command("set_brightness", {"brightness": 0.2})
        await dimmed(client, 0.5 * bright)
        dark = await mean_brightness(client)
        ingress_before = replica_actors("change", "ReactorIngress")
        # Serve restarts an application's deployments when its args change; the
        # ingress holds nothing, and the busy gradient replica drains: its session
        # streams on, and reconnects through the new ingress with its state. (The
        # deploy completes once the drained replica is gone, after the session ends.)
        redeploy = in_daemon_thread(ray_serve.deploy, "change", args(2))
        await wait_until(lambda: replica_actors("change", "ReactorIngress") != ingress_before
                         and replica_states("change", "ReactorIngress").get("RUNNING") == 2,
                         120, "the ingress to be redeployed")
        await frames_flow(client, count=30)
        await client.peer.pc.close()
        closed_at = time.monotonic()
        try:
            # The first requests through a fresh ingress on a loaded machine can be
            # slow; the client itself gives up after its policy's 30 s.
            await wait_until(lambda: client.reconnects >= 1 and client.state == "streaming",
                             45, "a reconnect after the redeploy")
        except AssertionError as exc:
            seen = [(round(t - closed_at, 2), s, d) for t, s, d in states]
            raise AssertionError(f"{exc}; the client's states since the close: {seen}; "
                                 f"ingress: {replica_states('change', 'ReactorIngress')}, "
                                 f"gradient: {replica_states('change', 'model-gradient')}")
        assert await mean_brightness(client) <= dark * 1.2 + 1
        await client.close()
        await asyncio.wait_for(redeploy, 180)
        other = await connect(f"{url}/models/gradient")
        await other.next_frame(timeout=MEDIA)
        await other.close()
    finally:
        await client.close()
        ray_serve.delete("change")


async def test_a_killed_replicas_client_is_told_why(ray_serve):
    url = ray_serve.deploy("died", {"operator_token": "op", "models": [
        {"path": GRADIENT, "min_replicas": 2, "max_replicas": 2, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/gradient"
    try:
        victim = await connect(model)
        await victim.next_frame(timeout=MEDIA)
        async with httpx.AsyncClient(timeout=30) as http:
            [live] = (await http.get(f"{model}/sessions", headers=OPERATOR)).json()["sessions"]
        kill(f"SERVE_REPLICA::died#model-gradient#{live['replica']}")
        await victim.wait_closed(timeout=MEDIA)
        assert victim.end_reason == "error"
        # Ray kills a worker's child processes before the worker exits, so the replica
        # may live just long enough to tell its client that its model process was
        # killed; otherwise the ingress tells the client the replica died. Both name
        # the cause.
        message = victim.end_message or ""
        assert ("replica" in message and "died" in message) or \
            "model process was killed by SIGKILL" in message, message
        # The directory learns of the death on its own path (the ingress's check on the
        # replica), which can come after the client heard: awaited, not assumed done.
        async with httpx.AsyncClient(timeout=30) as http:
            async def described():
                reply = await http.get(f"{model}/session",
                                       params={"session_id": victim.session_id})
                assert reply.status_code == 200, reply.text
                return reply.json()["state"] == "ended"

            await wait_until(described, MEDIA, "the directory to mark the session ended")
        survivor = await connect(model)
        assert (await survivor.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        await survivor.close()
        await victim.close()
    finally:
        ray_serve.delete("died")


async def test_session_lists_need_the_operator_token_and_mask_ids(ray_serve):
    url = ray_serve.deploy("ops", {"operator_token": "op", "models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/gradient"
    client = await connect(model)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{model}/sessions")).status_code == 403
            wrong = {"X-Operator-Token": "nope"}
            assert (await http.get(f"{model}/sessions", headers=wrong)).status_code == 403
            listed = (await http.get(f"{model}/sessions", headers=OPERATOR)).json()["sessions"]
            assert len(listed) == 1
            assert client.session_id not in str(listed)
            # Nothing else discloses the id either.
            assert (await http.get(f"{model}/session")).status_code == 400
            assert client.session_id not in (await http.get(f"{url}/models")).text
        await client.close()
        # The replica's log says how each session ended, naming it only as far as
        # telling it apart.
        ended = f"session {client.session_id[:4]}… ended: client_closed"
        await until(lambda: ended in ray_serve.replica_logs("ops", "model-gradient"),
                    "the session's end in the replica's log", timeout=MEDIA)
        assert client.session_id not in ray_serve.replica_logs("ops", "model-gradient")
        assert client.session_id not in ray_serve.replica_logs("ops", "ReactorIngress")
    finally:
        await client.close()
        ray_serve.delete("ops")


# Past the module's bound: the deploy, the crash and the reload each wait on a loaded machine.
@pytest.mark.timeout(600)
async def test_a_crashing_model_process_ends_the_session_and_the_same_replica_serves_the_next(
    ray_serve,
):
    url = ray_serve.deploy("crash", {"operator_token": "op", "models": [
        {"path": "tests/models/process/crashing", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/crashing"
    try:
        before = replica_actors("crash", "model-crashing")
        victim = await connect(model)
        await victim.next_frame(timeout=MEDIA)
        victim.send_command("crash", {"how": "segfault"})
        await victim.wait_closed(timeout=MEDIA)
        assert victim.end_reason == "error"
        assert "the model process was killed by SIGSEGV" in victim.end_message
        # The replica stayed up (it reloads the model in a new process) and serves. The
        # session waits for that reload, which takes what the first load took (a fresh
        # process importing torch): as long as the ranks tests give theirs.
        survivor = await connect(model, timeout=3 * MEDIA)
        # Until the reloaded model's first frame the runtime shows black, at the size
        # the model made before; then the model's own frames come.
        assert (await survivor.next_frame(timeout=MEDIA)).image.shape == (48, 64, 3)
        made = await survivor.peer.wait_for(
            lambda: next((f for f in survivor.peer.video.get(survivor.peer.default_video(), ())
                          if f.image.mean() > 16), None),
            MEDIA, "a frame the reloaded model made",
        )
        assert made.image.shape == (48, 64, 3)
        await survivor.close()
        await victim.close()
        assert replica_actors("crash", "model-crashing") == before
        assert replica_states("crash", "model-crashing") == {"RUNNING": 1}
    finally:
        ray_serve.delete("crash")
