"""Viewers: watch-only links to a session, served with one shared encode per codec.

Real parts: `reactor run` as a subprocess, the Python client's aiortc peers for the
owner and every viewer, Serve on the test session's local Ray, headless Chromium.
The model (tests/models/viewer/stamped) stamps each frame's number into it as big
blocks, so what a viewer saw can be matched frame by frame with what the owner saw.
"""

import asyncio
import contextlib
import importlib.util
import re

import httpx
import numpy as np
import pytest
from paths import TEST_MODELS

from reactor_serve.client import SessionRefused, ViewerCannotCommand, connect, watch

STAMPED = TEST_MODELS / "viewer" / "stamped"

_spec = importlib.util.spec_from_file_location("_stamped_model", STAMPED / "model.py")
# Servers, the shared encoder, several aiortc peers (and Chromium) on a loaded machine:
# waits are for what the frames and messages show, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def read_stamp(image):
    # The model's own decoder, loaded without importing the model package.
    module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(module)
    return module.read_stamp(image)


async def collect(client, count):
    """{stamp: image} of the next `count` frames `client` receives."""
    seen = {}
    for _ in range(count):
        frame = await client.next_frame(timeout=DEADLINE_S)
        seen[read_stamp(frame.image)] = frame.image
    return seen


async def stats_with(client, predicate, timeout=DEADLINE_S):
    """The first `stats` of the session that satisfies `predicate`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        stats = client.stats
        if stats and predicate(stats):
            return stats
        await asyncio.sleep(0.1)  # the poll interval of a wait with a deadline
    raise AssertionError(f"no stats matching within {timeout} s; last: {client.stats}")


async def test_a_viewer_sees_the_owners_frames_and_cannot_steer(reactor_run):
    run = reactor_run(STAMPED)
    owner = await connect(run.url)
    viewer = None
    try:
        await owner.next_frame(timeout=DEADLINE_S)
        link = await owner.viewer_link()
        token = link["viewer_token"]
        assert token != owner.session_id and owner.session_id not in str(link)
        assert link["max_viewers"] == 4
        assert link["url"].endswith(f"/?watch={token}")
        viewer = await watch(link["url"])  # the page URL works as well as base + token

        # The same frames: the viewer's stamps are the owner's, and each picture is the
        # same within the codecs' loss.
        mine, theirs = await asyncio.gather(collect(owner, 45), collect(viewer, 30))
        common = sorted(set(mine) & set(theirs))
        assert len(common) >= 10, (sorted(mine), sorted(theirs))
        for stamp in common:
            difference = np.abs(mine[stamp].astype(int) - theirs[stamp].astype(int)).mean()
            assert difference < 12, (stamp, difference)
        # Consecutive stamps in order: a stream, not stray frames. (How many stamps lie
        # between two frames is how many the shared encoder skipped while busy, which a
        # loaded machine makes more of: the rate is for benchmarks.)
        stamps = [read_stamp((await viewer.next_frame(timeout=DEADLINE_S)).image) for _ in range(10)]
        assert all(0 < (b - a) % 1024 < 512 for a, b in zip(stamps, stamps[1:])), stamps

        # A viewer's command is refused by the client, and by the server if sent anyway:
        # the model never applies it (it echoes every command it applies).
        with pytest.raises(ViewerCannotCommand):
            viewer.send_command("set_tint", {"tint": 7})
        mark = len(viewer.peer.messages)
        viewer.peer.send_command("set_tint", {"tint": 7})
        error = await viewer.next_message("commandError", scope="runtime", after=mark,
                                          timeout=DEADLINE_S)
        assert error["data"]["command"] == "set_tint"
        assert "viewers cannot send commands" in error["data"]["message"]
        # Garbage on a viewer's channel is dropped; the viewer and the session go on.
        for raw in (b"\xff\xfe", "null", "[]", "{" * 300, '{"scope": "application"}',
                    '{"scope": "application", "data": {"type": "set_tint", "data": {"tint": NaN}}}'):
            viewer.peer.send_raw(raw)
        before = (await viewer.next_frame(timeout=DEADLINE_S)).index
        assert (await viewer.next_frame(timeout=DEADLINE_S)).index > before and not viewer.closed
        # The owner's command is applied; the viewer sees the model's echo of it too.
        owner_mark, viewer_mark = len(owner.peer.messages), len(viewer.peer.messages)
        owner.send_command("set_tint", {"tint": 200})
        applied = await owner.next_message("applied", after=owner_mark, timeout=DEADLINE_S)
        assert applied["data"]["args"] == {"tint": 200}
        echoed = await viewer.next_message("applied", after=viewer_mark, timeout=DEADLINE_S)
        assert echoed["data"]["args"] == {"tint": 200}
        everything = [e.get("data", {}) for e in owner.peer.messages + viewer.peer.messages]
        assert not any(m.get("type") == "applied" and m["data"]["args"]["tint"] == 7
                       for m in everything)
        # The viewer sees the owner's change in the picture.
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while (await viewer.next_frame(timeout=DEADLINE_S)).image[96:, :].mean() <= 180:
            assert asyncio.get_running_loop().time() < deadline, \
                "the owner's tint never showed on the viewer"
        stats = await stats_with(viewer, lambda s: s.get("viewers") == 1)
        assert "session_id" not in stats

        # The viewer leaving leaves the session streaming for its owner.
        await viewer.close()
        viewer = None
        await stats_with(owner, lambda s: s.get("viewers") == 0)
        before = (await owner.next_frame(timeout=DEADLINE_S)).index
        assert (await owner.next_frame(timeout=DEADLINE_S)).index > before
        assert owner.state == "streaming"
    finally:
        if viewer is not None:
            await viewer.close()
        await owner.close()


async def test_one_encode_per_frame_whatever_the_viewers_and_a_limit(reactor_run):
    run = reactor_run(STAMPED)
    owner = await connect(run.url)
    viewers = []
    try:
        await owner.next_frame(timeout=DEADLINE_S)
        link = await owner.viewer_link()
        assert (await owner.viewer_link())["viewer_token"] == link["viewer_token"]
        for count in (1, 2, 4):
            while len(viewers) < count:
                viewers.append(await watch(run.url, link["viewer_token"]))
            for v in viewers:
                await v.next_frame(timeout=DEADLINE_S)
            stats = await stats_with(owner, lambda s: s.get("viewers") == count)
            start = stats["viewer_encoding"]
            stats = await stats_with(
                owner, lambda s: s["viewer_encoding"]["presented"] >= start["presented"] + 15)
            encoding = stats["viewer_encoding"]
            # One encoder (one output track, one codec), and at most one encode per
            # presented frame however many watch: not one per viewer.
            assert encoding["encoders"] == 1
            presented = encoding["presented"] - start["presented"]
            encodes = encoding["encodes"] - start["encodes"]
            assert 0 < encodes <= presented + 1, (count, encoding, start)
            for v in viewers:
                await v.next_frame(timeout=DEADLINE_S)

        # The fifth viewer is refused, naming the limit; the four go on.
        with pytest.raises(SessionRefused) as refused:
            await watch(run.url, link["viewer_token"])
        assert refused.value.status == 429 and "max_viewers" in str(refused.value)
        for v in viewers:
            await v.next_frame(timeout=DEADLINE_S)

        # The session ending ends every viewer with sessionEnded.
        marks = [len(v.peer.messages) for v in viewers]
        await owner.close()
        for v, mark in zip(viewers, marks):
            ended = await v.next_message("sessionEnded", scope="runtime", after=mark,
                                         timeout=DEADLINE_S)
            assert ended["data"]["reason"] == "client_closed"
            await v.wait_closed(timeout=DEADLINE_S)
        # Its token died with it.
        with pytest.raises(SessionRefused) as gone:
            await watch(run.url, link["viewer_token"])
        assert gone.value.status == 404
    finally:
        for v in viewers:
            await v.close()
        await owner.close()


async def test_a_viewer_token_is_no_session_id_and_bad_input_is_refused(reactor_run):
    run = reactor_run(STAMPED)
    owner = await connect(run.url)
    try:
        await owner.next_frame(timeout=DEADLINE_S)
        link = await owner.viewer_link()
        token = link["viewer_token"]
        async with httpx.AsyncClient(base_url=run.url, timeout=DEADLINE_S) as http:
            # The token opens nothing of the session's own routes.
            assert (await http.post("/stop_session", json={"session_id": token})).status_code == 404
            assert (await http.get("/session", params={"session_id": token})).status_code == 404
            put = await http.put(f"/sessions/{token}/transport/webrtc/sdp_params",
                                 json={"sdp_offer": "v=0", "track_mapping": []})
            assert put.status_code in (400, 404)
            assert (await http.post(f"/sessions/{token}/viewers")).status_code == 404
            # What a viewer reads names the model and its outputs, never the session.
            described = await http.get(f"/watch/{token}")
            assert described.status_code == 200
            assert owner.session_id not in described.text
            assert described.json()["capabilities"]["commands"] == []
            # Bad tokens, bad ids and hostile bodies: 4xx naming the problem.
            for path in ("/watch/nope", "/watch/" + "x" * 300, "/watch/%00%ff"):
                assert (await http.get(path)).status_code == 404, path
            assert (await http.post("/watch/nope/sdp_params",
                                    json={"sdp_offer": "v=0", "track_mapping": []})).status_code == 404
            for body in (b"null", b"[]", b"{\"sdp_offer\": 5}", b"{" * 5000, b"\xff\xfe",
                         b"{\"sdp_offer\": \"v=0\", \"track_mapping\": [1, 2]}",
                         b"{\"sdp_offer\": \"garbage\", \"track_mapping\": []}"):
                reply = await http.post(f"/watch/{token}/sdp_params", content=body,
                                        headers={"content-type": "application/json"})
                assert 400 <= reply.status_code < 500, (body[:20], reply.status_code, reply.text)
                assert reply.json()["detail"]
            for query in ("", "?connection_id=abc", "?connection_id=123", "?connection_id=-1"):
                reply = await http.get(f"/watch/{token}/sdp_params{query}")
                assert 400 <= reply.status_code < 500, (query, reply.status_code)
            # Revoked, the link is dead; a new one is another token.
            assert (await http.delete(f"/sessions/{owner.session_id}/viewers")).json() == {"revoked": True}
            assert (await http.get(f"/watch/{token}")).status_code == 404
        again = await owner.viewer_link()
        assert again["viewer_token"] != token
        # The owner's session never noticed any of it.
        before = (await owner.next_frame(timeout=DEADLINE_S)).index
        assert (await owner.next_frame(timeout=DEADLINE_S)).index > before and owner.state == "streaming"
    finally:
        await owner.close()


async def test_owner_reconnect_keeps_its_viewers(reactor_run):
    run = reactor_run(STAMPED)
    owner = await connect(run.url)
    viewer = None
    try:
        await owner.next_frame(timeout=DEADLINE_S)
        viewer = await watch(run.url, (await owner.viewer_link())["viewer_token"])
        await viewer.next_frame(timeout=DEADLINE_S)
        # The owner's transport drops; it reconnects on the same session.
        await owner.peer.pc.close()
        await owner.wait_state("reconnecting", timeout=DEADLINE_S)
        await owner.wait_state("streaming", timeout=DEADLINE_S)
        first = read_stamp((await viewer.next_frame(timeout=DEADLINE_S)).image)
        later = read_stamp((await viewer.next_frame(timeout=DEADLINE_S)).image)
        assert first != later and not viewer.closed
    finally:
        if viewer is not None:
            await viewer.close()
        await owner.close()


async def test_viewers_through_serve(ray_serve):
    from reactor_serve.serve.session_directory import SessionDirectory

    url = ray_serve.deploy("viewers", {"models": [
        {"path": "tests/models/viewer/stamped", "min_replicas": 1, "max_replicas": 2,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    model = f"{url}/models/stamped"
    owner = await connect(model)
    viewer = None
    try:
        await owner.next_frame(timeout=DEADLINE_S)
        link = await owner.viewer_link()
        assert owner.session_id not in str(link)
        assert link["url"].startswith(model + "/?watch=")
        viewer = await watch(model, link["viewer_token"])
        mine, theirs = await asyncio.gather(collect(owner, 30), collect(viewer, 20))
        assert len(set(mine) & set(theirs)) >= 5, (sorted(mine), sorted(theirs))
        # Refused on the replica, never applied by the model.
        mark = len(viewer.peer.messages)
        viewer.peer.send_command("set_tint", {"tint": 9})
        error = await viewer.next_message("commandError", scope="runtime", after=mark,
                                          timeout=DEADLINE_S)
        assert "viewers cannot send commands" in error["data"]["message"]
        owner_mark = len(owner.peer.messages)
        owner.send_command("set_tint", {"tint": 31})
        applied = await owner.next_message("applied", after=owner_mark, timeout=DEADLINE_S)
        assert applied["data"]["args"] == {"tint": 31}
        assert not any((e.get("data") or {}).get("type") == "applied"
                       and e["data"]["data"]["args"]["tint"] == 9 for e in owner.peer.messages)
        # A viewer is no session: the directory counts one live session, no waiting one
        # (which is what the autoscaling policy and the admission see).
        counts = await SessionDirectory("viewers").session_counts("stamped")
        assert (counts["live"], counts["waiting"]) == (1, 0)
        assert sum(counts["by_replica"].values()) == 1
        # The replica's viewers gauge counts it.
        pattern = re.compile(r'^ray_reactor_viewers\{[^}]*application="viewers"[^}]*\} 1(\.0)?$', re.M)
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            for _ in range(60):
                exported = (await http.get(f"http://127.0.0.1:{ray_serve.metrics_port}/metrics")).text
                if pattern.search(exported):
                    break
                await asyncio.sleep(1)  # the poll interval of a wait of a minute for the gauge
            else:
                raise AssertionError("ray_reactor_viewers never showed the viewer")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            token = link["viewer_token"]
            assert (await http.post(f"{model}/stop_session",
                                    json={"session_id": token})).status_code == 404
            described = await http.get(f"{model}/watch/{token}")
            assert described.status_code == 200 and owner.session_id not in described.text
            assert (await http.get(f"{model}/watch/nope")).status_code == 404
            # The root's viewer link leads to the first model's page in viewer mode.
            root = await http.get(f"{url}/?watch={token}", follow_redirects=False)
            assert root.status_code == 307
            assert root.headers["location"].endswith(f"models/stamped/?watch={token}")
        # The session ending ends its viewer with sessionEnded.
        mark = len(viewer.peer.messages)
        await owner.close()
        ended = await viewer.next_message("sessionEnded", scope="runtime", after=mark,
                                          timeout=DEADLINE_S)
        assert ended["data"]["reason"] == "client_closed"
        with pytest.raises(SessionRefused) as gone:
            await watch(model, token)
        assert gone.value.status == 404 and owner.session_id not in str(gone.value)
    finally:
        if viewer is not None:
            await viewer.close()
        await owner.close()
        ray_serve.delete("viewers")


@contextlib.asynccontextmanager
async def app_server(**settings):
    """`reactor run`'s app on a thread of this process, with transport settings the
    model's config does not have."""
    import threading
    import time

    import uvicorn
    from conftest import free_port

    from reactor_serve.local.app import create_app

    port = free_port()
    app = create_app(STAMPED, settings_override={"loopback_candidates": True, **settings})
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 30)


async def test_h264_viewers_share_one_h264_encode():
    async with app_server(codec="h264") as base:
        owner = await connect(base)
        viewers = []
        try:
            await owner.next_frame(timeout=DEADLINE_S)
            token = (await owner.viewer_link())["viewer_token"]
            viewers = [await watch(base, token), await watch(base, token)]
            mine, *theirs = await asyncio.gather(
                collect(owner, 40), *(collect(v, 25) for v in viewers))
            for seen in theirs:
                common = set(mine) & set(seen)
                assert len(common) >= 8
                for stamp in common:
                    assert np.abs(mine[stamp].astype(int) - seen[stamp].astype(int)).mean() < 12
            stats = await stats_with(owner, lambda s: s.get("viewers") == 2)
            assert stats["viewer_encoding"]["codecs"] == ["h264"]
            assert stats["viewer_encoding"]["encoders"] == 1

            # Revoking ends the viewers (sessionEnded: revoked) and the owner goes on.
            marks = [len(v.peer.messages) for v in viewers]
            assert await owner.revoke_viewer_link() is True
            for v, mark in zip(viewers, marks):
                ended = await v.next_message("sessionEnded", scope="runtime", after=mark,
                                             timeout=DEADLINE_S)
                assert ended["data"]["reason"] == "revoked"
                await v.wait_closed(timeout=DEADLINE_S)
            await stats_with(owner, lambda s: s.get("viewers") == 0)
            before = (await owner.next_frame(timeout=DEADLINE_S)).index
            assert (await owner.next_frame(timeout=DEADLINE_S)).index > before and owner.state == "streaming"
        finally:
            for v in viewers:
                await v.close()
            await owner.close()


async def test_a_viewer_slower_to_come_up_than_the_idle_timeout_is_kept():
    from reactor_serve.client.peer import ClientPeer
    from reactor_serve.client.signalling import (
        checked_json, host_candidates_for, http_client, watch_signal, watch_url)

    # Silence counts from the moment a viewer's connection is up. The owner's client
    # pings every 5 s, so the idle timeout is well past that; the viewer applies its
    # answer later than the idle timeout (load only makes that later).
    idle_s = 15.0
    async with app_server(idle_timeout_s=idle_s) as base:
        owner = await connect(base)
        http = http_client(None)
        viewer = None
        try:
            await owner.next_frame(timeout=DEADLINE_S)
            link = watch_url(base, (await owner.viewer_link())["viewer_token"])
            descriptor = checked_json(await http.get(link), 200)
            viewer = ClientPeer(descriptor["capabilities"],
                                host_candidates=host_candidates_for(base, None))
            answered = watch_signal(http, link, DEADLINE_S)

            async def late(sdp_offer, track_mapping):
                answer = await answered(sdp_offer, track_mapping)
                await asyncio.sleep(idle_s + 2)
                return answer

            await viewer.connect(late, timeout=DEADLINE_S)
            await viewer.next_frame(viewer.default_video(), timeout=DEADLINE_S)
            await stats_with(owner, lambda s: s.get("viewers") == 1)
        finally:
            if viewer is not None:
                await viewer.close()
            await http.aclose()
            await owner.close()


async def test_a_model_without_viewers_refuses_links():
    async with app_server(max_viewers=0) as base:
        owner = await connect(base)
        try:
            await owner.next_frame(timeout=DEADLINE_S)
            with pytest.raises(SessionRefused) as refused:
                await owner.viewer_link()
            assert refused.value.status == 409 and "max_viewers" in str(refused.value)
            assert owner.state == "streaming"
        finally:
            await owner.close()


# --------------------------------------------------------------------------- the page


def test_the_page_shares_a_view_and_opens_it_in_viewer_mode(browser, page, reactor_run):
    from browser_pages import brightness, frame_count, wait_for

    video = "#outputs video"
    run = reactor_run("examples/gradient")
    page.goto(run.url + "/")
    wait_for(lambda: page.inner_text("#connection") == "connected", DEADLINE_S, "the owner's page")
    wait_for(lambda: frame_count(page, video) > 10, DEADLINE_S, "the owner's frames")
    # The controls come with the schema, asked for again on a reconnect: on a loaded
    # machine the page may have had to reconnect once.
    page.wait_for_selector("#control-set_brightness", state="attached", timeout=DEADLINE_S * 1000)

    # "Share view" gets the session's viewer link and shows it.
    page.click("#share")
    page.wait_for_selector("#share-link", state="visible", timeout=DEADLINE_S * 1000)
    link = page.input_value("#share-link")
    assert "?watch=" in link and link.startswith(run.url)
    session_id = page.evaluate("window.reactorSession.sessionId")
    assert session_id not in link

    viewer_context = browser.new_context(viewport={"width": 1280, "height": 760})
    try:
        viewer = viewer_context.new_page()
        viewer.on("console", lambda message: print(f"[viewer console.{message.type}] {message.text}"))
        viewer.goto(link)
        wait_for(lambda: viewer.inner_text("#connection") == "connected", DEADLINE_S,
                 "the viewer's page")
        wait_for(lambda: frame_count(viewer, video) > 10, DEADLINE_S, "the viewer's frames")
        # Watch only: no controls, no inputs, no share button, no camera asked for.
        assert viewer.query_selector("#control-set_brightness") is None
        assert not viewer.is_visible("#controls") and not viewer.is_visible("#share")
        assert viewer.evaluate("window.reactorSession.viewer") is True
        assert viewer.evaluate("window.reactorSession.inputs.size") == 0
        refused = viewer.evaluate(
            "() => { try { window.reactorSession.send('set_brightness', {brightness: 0}); return null; }"
            " catch (err) { return err.message; } }")
        assert refused == "viewers cannot send commands"
        # The stats overlay runs in viewer mode too.
        wait_for(lambda: viewer.inner_text("#stat-fps") not in ("", "–"), DEADLINE_S,
                 "the viewer's fps")

        # The owner darkens the picture: the viewer sees it.
        bright = wait_for(lambda: brightness(viewer, video), DEADLINE_S, "a picture")
        page.eval_on_selector("#control-set_brightness", """(input) => {
            input.value = "0.2";
            input.dispatchEvent(new Event("input", { bubbles: true }));
            input.dispatchEvent(new Event("change", { bubbles: true }));
        }""")
        wait_for(lambda: (brightness(viewer, video) or 255) < bright * 0.5, DEADLINE_S,
                 "the owner's change to show on the viewer's page")

        # The viewer leaves; the owner's session goes on.
        viewer.click("#stop")
        shown = frame_count(page, video)
        wait_for(lambda: frame_count(page, video) > shown + 15, DEADLINE_S,
                 "the owner's frames after")
        assert page.inner_text("#connection") == "connected"
    finally:
        viewer_context.close()
