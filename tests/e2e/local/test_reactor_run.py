"""`reactor run`'s server end to end: HTTP signaling, WebRTC media and the Python client."""

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import DevServer, free_port
from paths import ROOT

from reactor_serve.client import SessionRefused, connect

EXAMPLES = ROOT / "examples"
# `reactor run`, its model process and the client share a loaded machine: waits are for
# what the frames and messages show, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


async def frame_where(client, predicate, what, timeout=DEADLINE_S):
    """The first frame from now on that satisfies `predicate`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, f"no frame showed {what}"
        frame = await client.next_frame(timeout=remaining)
        if predicate(frame):
            return frame



@pytest.fixture(scope="module")
def gradient_server():
    with DevServer(EXAMPLES / "gradient") as server:
        yield server


async def test_gradient_over_http_and_webrtc(gradient_server):
    base = gradient_server.base
    client = await connect(base)
    try:
        # Before the model's first frame the client sees black, for longer on a loaded
        # machine: the gradient is what it paints.
        first = await frame_where(client, lambda f: f.image.mean() > 60, "the gradient")
        assert first.image.shape == (480, 640, 3)
        # It moves: a later frame differs.
        later = await frame_where(client, lambda f: not np.array_equal(first.image, f.image),
                                  "the gradient moving")
        bright = later.image.mean()
        client.send_command("set_brightness", {"brightness": 0.2})
        await frame_where(client, lambda f: f.image.mean() < bright * 0.4,
                          "the picture darkened after set_brightness 0.2")
        # The single-session server refuses a second client while this one is live.
        with pytest.raises(SessionRefused) as refused:
            await connect(base)
        assert refused.value.status == 409 and "busy" in str(refused.value)
        schema = await client.request_schema()
        assert "/events/set_brightness" in schema["paths"]
    finally:
        await client.close()
    # The slot is free again for the next client.
    again = await connect(base)
    try:
        assert (await again.next_frame(timeout=DEADLINE_S)).image.shape == (480, 640, 3)
    finally:
        await again.close()


async def test_stop_session_route_ends_the_session_for_the_client(gradient_server):
    client = await connect(gradient_server.base)
    await client.next_frame(timeout=DEADLINE_S)
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        reply = await http.post(
            f"{gradient_server.base}/stop_session", json={"session_id": client.session_id}
        )
    assert reply.status_code == 200
    ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=DEADLINE_S)
    assert ended["data"]["reason"] == "client_closed"
    await client.wait_closed(timeout=DEADLINE_S)
    await client.close()


async def test_malformed_offer_is_a_400_and_the_session_survives(gradient_server):
    base = gradient_server.base
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        sid = (await http.post(f"{base}/start_session", json={})).json()["session_id"]
        path = f"{base}/sessions/{sid}/transport/webrtc/sdp_params"
        reply = await http.post(path, json={"sdp_offer": "garbage", "track_mapping": []})
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while reply.status_code == 202:  # negotiation runs in the background: poll it
            assert asyncio.get_running_loop().time() < deadline, "the offer was never answered"
            await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline
            reply = await http.get(path)
        assert reply.status_code == 400
        assert "SDP" in reply.json()["detail"]
        await http.post(f"{base}/stop_session", json={"session_id": sid})


async def test_webcam_model_transforms_the_camera():
    camera = np.zeros((120, 160, 3), np.uint8)
    camera[:, 80:] = 220
    with DevServer(EXAMPLES / "webcam_style") as server:
        client = await connect(server.base, inputs={"camera": camera})
        try:
            plain = await frame_where(
                client,
                lambda f: f.image.shape == (120, 160, 3) and f.image[:, 100:].mean() > 150,
                "the camera picture coming back")
            client.send_command("set_style", {"style": "thermal"})
            await frame_where(
                client,
                lambda f: np.abs(f.image.astype(int) - plain.image.astype(int)).mean() > 20,
                "the style changing the picture")
        finally:
            await client.close()


async def test_audio_track_arrives_with_the_tone():
    with DevServer(EXAMPLES / "audio_tone") as server:
        client = await connect(server.base)
        try:
            await client.next_frame(timeout=DEADLINE_S)
            await client.peer.wait_for(
                lambda: sum(a.samples.shape[1] for a in client.audio("main_audio")) > 48000 * 1.5,
                DEADLINE_S,
                "1.5 s of audio",
            )
            chunks = client.audio("main_audio")
            samples = np.concatenate([a.samples[0] for a in chunks])[-48000:].astype(float)
            spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
            peak_hz = np.argmax(spectrum) * 48000 / len(samples)
            assert abs(peak_hz - 440) < 10
        finally:
            await client.close()


async def test_legacy_block_model_over_webrtc():
    with DevServer(EXAMPLES / "legacy_blocks") as server:
        client = await connect(server.base)
        try:
            frame = await client.next_frame(timeout=DEADLINE_S)
            assert frame.image.max() < 40  # black (after lossy coding) until a prompt
            client.send_command("set_prompt", {"prompt": "a slow river"})
            progress = await client.next_message("progress", scope="application",
                                                 timeout=DEADLINE_S)
            assert progress["data"]["frames_generated"] > 0
            # Video trails the data channel by the pacing and coding delay.
            a = await frame_where(client, lambda f: f.image.mean() > 10, "the prompt's picture")
            # It moves: a later frame differs.
            await frame_where(client, lambda f: not np.array_equal(a.image, f.image),
                              "the picture moving")
        finally:
            await client.close()


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
async def test_reactor_run_signal_ends_the_session_with_shutdown_and_exits(signame):
    """`reactor run` interrupted: the live session hears `sessionEnded{shutdown}` before
    its transport closes, and the process exits on its own."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    reactor = Path(sys.executable).parent / "reactor"
    process = subprocess.Popen(
        [str(reactor), "run", str(EXAMPLES / "gradient"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = None
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            deadline = asyncio.get_running_loop().time() + DEADLINE_S
            while True:
                try:
                    if (await http.get(f"{base}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert process.poll() is None, "reactor run exited at start"
                assert asyncio.get_running_loop().time() < deadline, "reactor run never answered"
                await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline
        client = await connect(base)
        await client.next_frame(timeout=DEADLINE_S)
        os.kill(process.pid, getattr(signal, signame))
        ended = await client.next_message("sessionEnded", scope="runtime", after=0,
                                          timeout=DEADLINE_S)
        assert ended["data"]["reason"] == "shutdown"
        await client.wait_closed(timeout=DEADLINE_S)
        # uvicorn re-raises the signal once it has shut down: SIGINT ends as a
        # KeyboardInterrupt that `reactor run` turns into exit 0, SIGTERM as death by
        # SIGTERM, as for any well-behaved server.
        code = await asyncio.to_thread(process.wait, 60)
        assert code in (0, -signal.SIGTERM), process.stderr.read().decode()[-2000:]
    finally:
        if client is not None:
            await client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
