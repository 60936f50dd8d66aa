"""Models served by Ray Serve (a real local Ray with logical GPUs), through the HTTP
ingress, with the Python client over WebRTC."""

import asyncio
import time

import httpx
import numpy as np
import pytest
import yaml
from paths import ROOT

from reactor_serve.client import SessionRefused, connect

# A hang guard past the waits inside: deploying an app and scaling replicas takes tens
# of seconds on a loaded machine, and `serve run` of every example starts a Ray and six
# models of its own.
pytestmark = pytest.mark.timeout(480)
GRADIENT = "examples/gradient"
# How long a wait for media (a frame, a message, an end) may take on a loaded machine.
MEDIA = 60


def running_replicas(app, deployment):
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return status.replica_states.get("RUNNING", 0)


async def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.2)  # the poll interval of a wait bounded by `timeout`
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


OPERATOR = {"X-Operator-Token": "op"}


async def sessions_of(url):
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{url}/sessions", headers=OPERATOR)
        assert reply.status_code == 200, reply.text
        return reply.json()["sessions"]


async def test_concurrent_sessions_land_on_replicas_with_their_own_gpu(ray_serve):
    url = ray_serve.deploy("pair", {"operator_token": "op", "models": [
        {"path": GRADIENT, "min_replicas": 2, "max_replicas": 2, "warm_spares": 0,
         "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    first = await connect(model)
    second = await connect(model)
    try:
        assert (await first.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        assert (await second.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        live = await sessions_of(model)
        assert len(live) == 2
        assert live[0]["replica"] != live[1]["replica"]
        assert all(len(s["gpu_ids"]) == 1 for s in live)  # auto: one GPU each
        assert live[0]["gpu_ids"] != live[1]["gpu_ids"]
    finally:
        await first.close()
        await second.close()
        ray_serve.delete("pair")


async def test_warm_spares_scale_up_and_down_without_cutting_a_live_session(ray_serve):
    url = ray_serve.deploy("scale", {"models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 3, "warm_spares": 1,
         "downscale_delay_s": 1, "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    replicas = lambda: running_replicas("scale", "model-gradient")  # noqa: E731
    try:
        await wait_until(lambda: replicas() == 1, 120, "1 replica (a warm spare, no session)")
        a = await connect(model)
        await a.next_frame(timeout=MEDIA)
        await wait_until(lambda: replicas() == 2, 120, "2 replicas for 1 session + 1 spare")
        b = await connect(model)
        await b.next_frame(timeout=MEDIA)
        await wait_until(lambda: replicas() == 3, 120, "3 replicas for 2 sessions + 1 spare")
        # One session leaves: Serve scales down while b is live, and b must not notice.
        await a.close()
        received = []
        b.peer.on_video = received.append
        await wait_until(lambda: replicas() == 2, 120, "scale down to 2")
        # Counted, not timed: the stream goes on after the scale-down, however slowly
        # a loaded machine encodes it.
        mark = len(received)
        await b.peer.wait_for(lambda: len(received) - mark > 20 or b.peer.closed, MEDIA,
                              "frames after the scale-down")
        assert not b.peer.closed, "the live session ended during the scale-down"
        assert len(received) - mark > 20, "frames stopped during the scale-down"
        await b.close()
        await wait_until(lambda: replicas() == 1, 120, "scale down to 1 after both left")
    finally:
        ray_serve.delete("scale")


async def _offer_and_poll(http, model, sid, sdp, mapping, statuses):
    path = f"{model}/sessions/{sid}/transport/webrtc/sdp_params"
    reply = await http.post(path, json={"sdp_offer": sdp, "track_mapping": mapping})
    assert reply.status_code == 202
    while True:
        poll = await http.get(path)
        if poll.status_code == 200:
            return poll.json()["sdp_answer"]
        if poll.status_code != 202:
            raise SessionRefused(poll.json()["detail"], poll.status_code)
        statuses.append(poll.json())
        # The poll interval; the server's admission timeout ends the wait.
        await asyncio.sleep(0.2)


async def test_full_model_queues_reports_position_then_503_and_admits_after_a_slot_frees(ray_serve):
    from reactor_serve.client.peer import ClientPeer

    url = ray_serve.deploy("queue", {"models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "admission_timeout_s": 3, "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    holder = await connect(model)
    try:
        await holder.next_frame()
        async with httpx.AsyncClient(timeout=30) as http:
            descriptor = (await http.post(f"{model}/start_session", json={})).json()
            waiter = ClientPeer(descriptor["capabilities"])
            statuses = []
            started = time.monotonic()

            async def signal(sdp, mapping):
                return await _offer_and_poll(http, model, descriptor["session_id"], sdp,
                                             mapping, statuses)

            with pytest.raises(SessionRefused) as refused:
                await waiter.connect(signal, timeout=MEDIA)
            assert refused.value.status == 503
            # A lower bound only, the admission_timeout_s this app is configured with:
            # the waiter was held that long, not refused at once. Load can only
            # lengthen it.
            assert time.monotonic() - started >= 3
            assert statuses and statuses[-1]["status"] == "queued"
            assert statuses[-1]["position"] == 1
            assert "eta_s" in statuses[-1]
            poll = await http.get(
                f"{model}/sessions/{descriptor['session_id']}/transport/webrtc/sdp_params")
            assert poll.status_code == 503 and int(poll.headers["retry-after"]) >= 1
            await waiter.close()

        # A waiter is let in once the live session frees the slot: freed only once the
        # waiter has been told it is queued, however long its offer took to get there.
        queued = []

        async def free_the_slot():
            await holder.peer.wait_for(lambda: queued, MEDIA, "the late session to be queued")
            await holder.close()

        freeing = asyncio.create_task(free_the_slot())
        try:
            late = await connect(model, on_queue=queued.append, timeout=MEDIA)
        finally:
            await freeing
        assert queued and queued[0]["position"] == 1
        assert (await late.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        await late.close()
    finally:
        await holder.close()
        ray_serve.delete("queue")


async def test_run_error_ends_that_session_and_the_replica_serves_the_next(ray_serve):
    url = ray_serve.deploy("raising", {"models": [
        {"path": "tests/models/serve/raising", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5}]})
    model = f"{url}/models/raising"
    try:
        try:
            first = await connect(model)
        except SessionRefused as refused:
            # The model failed before the client's channel opened (a loaded machine):
            # connect() then says why, at once.
            assert "(error: " in str(refused) and "simulated CUDA error" in str(refused)
        else:
            ended = await first.next_message("sessionEnded", scope="runtime", after=0,
                                             timeout=MEDIA)
            assert ended["data"]["reason"] == "error"
            assert "simulated CUDA error" in ended["data"]["message"]
            await first.wait_closed(timeout=MEDIA)
            await first.close()
        second = await connect(model)
        # Black at the default size until the model's first frame, for as many frames
        # as a loaded machine takes to make it.
        track = second.peer.default_video()
        model_frames = lambda: [f for f in second.peer.video.get(track, ())  # noqa: E731
                                if f.image.shape == (48, 64, 3)]
        await second.peer.wait_for(lambda: model_frames() or second.peer.closed, MEDIA,
                                   "a frame of the model's size")
        assert model_frames(), (second.end_reason, second.end_message)
        # The model raised after its first session's tenth frame: frames past the tenth
        # of this one, the session still open, show it serves on.
        await second.peer.wait_for(lambda: len(model_frames()) > 20 or second.peer.closed,
                                   MEDIA, "frames past the model's tenth")
        assert not second.peer.closed, (second.end_reason, second.end_message)
        await second.close()
    finally:
        ray_serve.delete("raising")


async def test_a_killed_replica_ends_its_session_and_the_next_lands_on_a_healthy_one(ray_serve):
    import ray

    url = ray_serve.deploy("kill", {"operator_token": "op", "models": [
        {"path": GRADIENT, "min_replicas": 2, "max_replicas": 2, "warm_spares": 0,
         "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    try:
        victim_client = await connect(model)
        await victim_client.next_frame(timeout=MEDIA)
        [live] = await sessions_of(model)
        # Serve names replica actors SERVE_REPLICA::<app>#<deployment>#<replica id>.
        actor = ray.get_actor(f"SERVE_REPLICA::kill#model-gradient#{live['replica']}",
                              namespace="serve")
        ray.kill(actor, no_restart=True)
        await victim_client.wait_closed(timeout=MEDIA)
        await victim_client.close()
        survivor = await connect(model)
        assert (await survivor.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        [now_live] = await sessions_of(model)
        assert now_live["replica"] != live["replica"]
        await survivor.close()
    finally:
        ray_serve.delete("kill")


async def test_metrics_reach_rays_metrics_endpoint_with_deployment_tags(ray_serve):
    url = ray_serve.deploy("metrics", {"models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    try:
        client = await connect(model)
        endpoint = f"http://127.0.0.1:{ray_serve.metrics_port}/metrics"
        # What a live session reports (its output rate among them) is awaited while it
        # is live, rather than assuming a fixed stretch of streaming was enough; what
        # its end reports, after the end.
        while_live = [
            "ray_reactor_sessions_started",
            "ray_reactor_output_fps",
            "ray_reactor_time_to_first_frame_seconds",
            "ray_reactor_admission_wait_seconds",
        ]
        wanted = [*while_live, "ray_reactor_sessions_ended"]
        async with httpx.AsyncClient(timeout=30) as http:
            async def exported(names):
                text = (await http.get(endpoint)).text
                ours = [line for line in text.splitlines() if 'application="metrics"' in line]
                found = all(any(line.startswith(name) for line in ours) for name in names)
                return text if found else None

            async def appeared(names, what):
                deadline = time.monotonic() + 90
                text = None
                while text is None and time.monotonic() < deadline:
                    text = await exported(names)
                    if text is None:
                        await asyncio.sleep(1)  # the poll interval of this bounded wait
                assert text is not None, f"{what} did not appear on Ray's metrics endpoint"
                return text

            try:
                await client.next_frame(timeout=MEDIA)
                await appeared(while_live, "a live session's metrics")
            finally:
                await client.close()
            text = await appeared(wanted, "the ended session's metrics")
        started = [line for line in text.splitlines()
                   if line.startswith("ray_reactor_sessions_started")]
        assert any('deployment="model-gradient"' in line and 'application="metrics"' in line
                   and 'model="gradient"' in line for line in started), started
    finally:
        ray_serve.delete("metrics")


async def test_token_unknown_model_and_malformed_offer(ray_serve):
    url = ray_serve.deploy("secure", {"auth_token": "s3cret", "models": [
        {"path": GRADIENT, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5}]})
    model = f"{url}/models/gradient"
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(f"{model}/start_session", json={})).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await http.post(f"{model}/start_session", json={}, headers=wrong)).status_code == 401
            assert (await http.get(f"{url}/health")).status_code == 200
            good = {"Authorization": "Bearer s3cret"}
            reply = await http.post(f"{url}/models/nope/start_session", json={}, headers=good)
            assert reply.status_code == 404 and "nope" in reply.json()["detail"]
            reply = await http.post(f"{url}/t/s3cret/models/gradient/start_session", json={})
            assert reply.status_code == 200
            sid = reply.json()["session_id"]
            path = f"{model}/sessions/{sid}/transport/webrtc/sdp_params"
            reply = await http.post(path, json={"sdp_offer": "garbage", "track_mapping": []},
                                    headers=good)
            deadline = time.monotonic() + MEDIA
            while reply.status_code == 202:
                assert time.monotonic() < deadline, "no answer to the malformed offer"
                await asyncio.sleep(0.1)  # the poll interval of this bounded wait
                reply = await http.get(path, headers=good)
            assert reply.status_code == 400, reply.text
        client = await connect(model, token="s3cret")
        assert (await client.next_frame(timeout=MEDIA)).image.shape == (480, 640, 3)
        await client.close()
    finally:
        ray_serve.delete("secure")


# A hang guard, not a speed: six models' replicas start at once, which on a 2-core
# machine whose cores are held took longer than the module's 240 s (the deploy alone).
@pytest.mark.timeout(600)
async def test_serve_config_yaml_serves_every_example(ray_serve):
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    [app] = config["applications"]
    args = app["args"]
    for entry in args["models"]:
        # Small logical footprints so every example fits this test's cluster at once.
        entry.update({"min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
                      "cpus_per_replica": 0.5})
    url = ray_serve.deploy("examples", args)
    try:
        # A bound, not a speed: six models' replicas have just started on this machine.
        async with httpx.AsyncClient(timeout=60) as http:
            listing = (await http.get(f"{url}/models")).json()["models"]
        names = [m["name"] for m in listing]
        assert set(names) == {"gradient", "webcam-style", "audio-tone", "legacy-blocks", "world",
                              "split-painter"}
        camera = np.full((96, 128, 3), 120, np.uint8)
        for name in names:
            client = await connect(f"{url}/models/{name}", inputs={"camera": camera})
            try:
                if name == "legacy-blocks":
                    client.send_command("set_prompt", {"prompt": "a forest"})
                frame = await client.next_frame(timeout=MEDIA)
                assert frame.image.ndim == 3 and frame.image.shape[2] == 3
            finally:
                await client.close()
    finally:
        ray_serve.delete("examples")


async def test_a_load_failure_is_reported_with_its_traceback_and_admits_no_session(ray_serve):
    from ray import serve

    args = {"models": [{"path": "tests/models/serve/broken", "min_replicas": 1,
                        "max_replicas": 1, "warm_spares": 0, "cpus_per_replica": 0.5}]}
    with pytest.raises(RuntimeError, match="model-broken"):
        ray_serve.deploy("broken", args)
    status = serve.status().applications["broken"]
    assert status.status in ("DEPLOY_FAILED", "UNHEALTHY")
    # What an operator sees for the deployment: the model's own error and traceback.
    message = status.deployments["model-broken"].message
    assert "checkpoint /weights/model.pt is missing" in message
    assert "Traceback" in message and "load(config)" in message
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{ray_serve.base}/broken/models/broken/start_session", json={})
    assert reply.status_code == 503
    assert "not available" in reply.json()["detail"]
    ray_serve.delete("broken")
