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



@pytest.fixture(scope="module")
def gradient_server():
    with DevServer(EXAMPLES / "gradient") as server:
        yield server


async def test_gradient_over_http_and_webrtc(gradient_server):
    base = gradient_server.base
    client = await connect(base)
    try:
        first = await client.next_frame()
        assert first.image.shape == (480, 640, 3)
        later = first
        for _ in range(8):
            later = await client.next_frame()
        assert not np.array_equal(first.image, later.image)
        bright = later.image.mean()
        client.send_command("set_brightness", {"brightness": 0.2})
        for _ in range(60):
            frame = await client.next_frame()
            if frame.image.mean() < bright * 0.4:
                break
        assert frame.image.mean() < bright * 0.4
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
        assert (await again.next_frame()).image.shape == (480, 640, 3)
    finally:
        await again.close()


async def test_stop_session_route_ends_the_session_for_the_client(gradient_server):
    client = await connect(gradient_server.base)
    await client.next_frame()
    async with httpx.AsyncClient() as http:
        reply = await http.post(
            f"{gradient_server.base}/stop_session", json={"session_id": client.session_id}
        )
    assert reply.status_code == 200
    ended = await client.next_message("sessionEnded", scope="runtime", after=0)
    assert ended["data"]["reason"] == "client_closed"
    await client.wait_closed()
    await client.close()


async def test_malformed_offer_is_a_400_and_the_session_survives(gradient_server):
    base = gradient_server.base
    async with httpx.AsyncClient() as http:
        sid = (await http.post(f"{base}/start_session", json={})).json()["session_id"]
        path = f"{base}/sessions/{sid}/transport/webrtc/sdp_params"
        reply = await http.post(path, json={"sdp_offer": "garbage", "track_mapping": []})
        if reply.status_code == 202:  # negotiation runs in the background: poll it
            for _ in range(50):
                reply = await http.get(path)
                if reply.status_code != 202:
                    break
                await asyncio.sleep(0.05)
        assert reply.status_code == 400
        assert "SDP" in reply.json()["detail"]
        await http.post(f"{base}/stop_session", json={"session_id": sid})


async def test_webcam_model_transforms_the_camera():
    camera = np.zeros((120, 160, 3), np.uint8)
    camera[:, 80:] = 220
    with DevServer(EXAMPLES / "webcam_style") as server:
        client = await connect(server.base, inputs={"camera": camera})
        try:
            plain = None
            for _ in range(60):
                frame = await client.next_frame()
                if frame.image.shape == (120, 160, 3) and frame.image[:, 100:].mean() > 150:
                    plain = frame
                    break
            assert plain is not None, "the camera picture did not come back"
            client.send_command("set_style", {"style": "thermal"})
            styled = None
            for _ in range(60):
                frame = await client.next_frame()
                if np.abs(frame.image.astype(int) - plain.image.astype(int)).mean() > 20:
                    styled = frame
                    break
            assert styled is not None, "the style did not change the picture"
        finally:
            await client.close()


async def test_audio_track_arrives_with_the_tone():
    with DevServer(EXAMPLES / "audio_tone") as server:
        client = await connect(server.base)
        try:
            await client.next_frame()
            await client.peer.wait_for(
                lambda: sum(a.samples.shape[1] for a in client.audio("main_audio")) > 48000 * 1.5,
                15,
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
            frame = await client.next_frame()
            assert frame.image.max() < 40  # black (after lossy coding) until a prompt
            client.send_command("set_prompt", {"prompt": "a slow river"})
            progress = await client.next_message("progress", scope="application")
            assert progress["data"]["frames_generated"] > 0
            # Video trails the data channel by the pacing and coding delay.
            for _ in range(90):
                a = await client.next_frame()
                if a.image.mean() > 10:
                    break
            assert a.image.mean() > 10
            for _ in range(5):
                b = await client.next_frame()
            assert not np.array_equal(a.image, b.image)
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
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                try:
                    if (await http.get(f"{base}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert process.poll() is None, "reactor run exited at start"
                await asyncio.sleep(0.05)
        client = await connect(base)
        await client.next_frame()
        os.kill(process.pid, getattr(signal, signame))
        ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=30)
        assert ended["data"]["reason"] == "shutdown"
        await client.wait_closed()
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
