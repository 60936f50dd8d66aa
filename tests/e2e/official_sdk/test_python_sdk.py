"""The official Python SDK (reactor-sdk 1.13, wire v1), unmodified, against our servers.

It speaks binary protobuf on both data channels and waits for a correlated reply to
each request: these tests are what it does, on `reactor run` and through Serve.
"""

import asyncio
import time

import httpx
import numpy as np
import pytest
from reactor_sdk import BadRequestError, Reactor, ReactorStatus

GRADIENT = "examples/gradient"
WEBCAM = "examples/webcam_style"


def client(url, model):
    return Reactor(model_name=model, local=True, api_url=url)


async def frames(reactor, track, count, timeout=30.0):
    """The next `count` frames of `track`, as numpy arrays."""
    got = []
    reactor.track(track).on_frame(got.append)
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} frames in {timeout} s"
        await asyncio.sleep(0.05)
    return got[:count]


async def mean_after_settling(reactor):
    await frames(reactor, "main_video", 10)  # frames made before the last command
    return float(np.mean(await frames(reactor, "main_video", 3)))


async def steer(reactor):
    schema = await reactor.request_schema()
    assert schema["openapi"] == "3.1.0"
    assert "brightness" in str(schema["paths"])  # the generated setter
    bright = await mean_after_settling(reactor)
    assert await reactor.send_command("set_brightness", {"brightness": 0.2}) is None
    assert await mean_after_settling(reactor) < bright * 0.5
    # Refused with the SDK's own error, naming the field, at once: never a timeout.
    for bad, words in [({"brightness": 7}, ("brightness", "le=2")),
                       ({"brightness": "max"}, ("brightness",)),
                       ({"contrast": 1}, ("contrast",))]:
        started = time.monotonic()
        with pytest.raises(BadRequestError) as caught:
            await reactor.send_command("set_brightness", bad)
        assert time.monotonic() - started < 5
        assert all(word in caught.value.message for word in words), caught.value.message
    with pytest.raises(BadRequestError, match="no_such_command"):
        await reactor.send_command("no_such_command", {})
    # Each reply answers its own request, however they interleave.
    outcomes = await asyncio.gather(
        *(reactor.send_command("set_brightness", {"brightness": value})
          for value in (0.5, 9, 0.6, -1, 1.0)),
        return_exceptions=True,
    )
    assert [isinstance(o, BadRequestError) for o in outcomes] == [False, True, False, True, False]
    assert "9" in outcomes[1].message and "-1" in outcomes[3].message


async def test_sdk_steers_reactor_run_and_keeps_its_session_across_reconnect(reactor_run):
    run = reactor_run(GRADIENT)
    reactor = client(run.url, "gradient")
    await reactor.connect()
    try:
        assert reactor.status == ReactorStatus.READY
        first = await frames(reactor, "main_video", 1)
        assert first[0].shape == (480, 640, 3)
        await steer(reactor)
        session_id = reactor.session_id
        await reactor.reconnect()
        assert reactor.session_id == session_id
        assert await reactor.send_command("set_brightness", {"brightness": 1.5}) is None
        await frames(reactor, "main_video", 5)
    finally:
        await reactor.disconnect()
    # Disconnecting ends the session on the server, as the client closing it.
    deadline = time.monotonic() + 20
    while (answer := httpx.get(f"{run.url}/session", params={"session_id": session_id}).json())["state"] != "ended":
        assert time.monotonic() < deadline, f"the session did not end on disconnect: {answer}"
        await asyncio.sleep(0.2)
    assert answer["end_reason"] == "client_closed"
    assert "binary frame" not in run.output()  # nothing fell back to the JSON codec


async def test_sdk_camera_reaches_the_model_and_is_published_again_after_reconnect(reactor_run):
    run = reactor_run(WEBCAM)
    reactor = client(run.url, "webcam_style")
    await reactor.connect()
    try:
        picture = np.zeros((240, 320, 3), np.uint8)
        for colour in ((200, 0, 30), (20, 150, 220)):
            camera = await reactor.track("camera").publish()
            picture[...] = colour
            pushing = asyncio.create_task(push(camera, picture))
            try:
                # The style "none" returns the camera: its colour comes back.
                deadline = time.monotonic() + 30
                while True:
                    [frame] = await frames(reactor, "main_video", 1)
                    if np.allclose(frame.mean(axis=(0, 1)), colour, atol=12):
                        break
                    assert time.monotonic() < deadline, f"the camera's {colour} never came back"
            finally:
                pushing.cancel()
            await reactor.reconnect()  # a publish lasts one connection
            assert not reactor.track("camera").published
    finally:
        await reactor.disconnect()


async def push(camera, picture):
    while True:
        camera.push_frame(picture)
        await asyncio.sleep(1 / 30)


async def test_sdk_publishing_a_track_the_model_does_not_take_is_refused(reactor_run):
    run = reactor_run(GRADIENT)
    reactor = client(run.url, "gradient")
    await reactor.connect()
    try:
        with pytest.raises(Exception):  # the SDK refuses a recvonly track itself
            await reactor.track("main_video").publish()
        assert reactor.status == ReactorStatus.READY
    finally:
        await reactor.disconnect()


async def test_sdk_steers_a_model_through_serve(serve_examples):
    reactor = client(f"{serve_examples}/models/gradient", "gradient")
    await reactor.connect()
    try:
        await steer(reactor)
    finally:
        await reactor.disconnect()
