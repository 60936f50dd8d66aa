"""The official Python SDK (reactor-sdk 1.13, wire v1), unmodified, against our servers.

It speaks binary protobuf on both data channels and waits for a correlated reply to
each request: these tests are what it does, on `reactor run` and through Serve.
"""

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from images import png_of
from reactor_sdk import (
    BadRequestError,
    FileRef,
    Reactor,
    ReactorStatus,
    StepCommand,
    StepRefusedError,
    StepSessionEndedError,
)

from reactor_serve.sessions.recording.settings import RecordingSettings

GRADIENT = "examples/gradient"
WEBCAM = "examples/webcam_style"


def client(url, model):
    return Reactor(model_name=model, local=True, api_url=url)


@contextlib.asynccontextmanager
async def connected(url, model):
    """A connected SDK client, disconnected afterwards."""
    reactor = client(url, model)
    await reactor.connect()
    try:
        yield reactor
    finally:
        await reactor.disconnect()


async def gathered(reactor, track, handler, got, count, timeout, what):
    """The first `count` items `handler` puts in `got` from `track`'s frames; the
    handler is taken off the track again however the wait ends."""
    reactor.track(track).on_frame(handler)
    try:
        deadline = time.monotonic() + timeout
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} {what} in {timeout} s"
            await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline
    finally:
        reactor.track(track).off_frame(handler)
    return got[:count]


async def frames(reactor, track, count, timeout=60.0):
    """The next `count` frames of `track`, as numpy arrays."""
    got = []
    return await gathered(reactor, track, got.append, got, count, timeout, f"frames of {track}")


async def first_frame_where(reactor, track, condition, what, timeout=60.0):
    """The first frame of `track` from now on for which `condition(frame)` holds:
    a command has applied once the pictures show it, however long that took."""
    deadline = time.monotonic() + timeout
    while True:
        [frame] = await frames(reactor, track, 1, timeout)
        if condition(frame):
            return frame
        assert time.monotonic() < deadline, f"no frame showed {what} in {timeout} s"


async def steer(reactor):
    schema = await reactor.request_schema()
    assert schema["openapi"] == "3.1.0"
    assert "brightness" in str(schema["paths"])  # the generated setter
    # A fresh session is at its default brightness, once the model's pictures come (a
    # session shows black, all zeros, until the model's first frame).
    await first_frame_where(reactor, "main_video", lambda f: f.any(), "the model's first picture")
    bright = float(np.mean(await frames(reactor, "main_video", 3)))
    assert await reactor.send_command("set_brightness", {"brightness": 0.2}) is None
    # The pictures say when the command applied; once it has, it holds.
    await first_frame_where(reactor, "main_video", lambda f: f.mean() < bright * 0.5,
                            "the brightness set to 0.2")
    assert float(np.mean(await frames(reactor, "main_video", 3))) < bright * 0.5
    # Refused with the SDK's own error, naming the field: the server's answer, never
    # the SDK giving up on a reply (that would raise another error than BadRequestError).
    for bad, words in [({"brightness": 7}, ("brightness", "le=2")),
                       ({"brightness": "max"}, ("brightness",)),
                       ({"contrast": 1}, ("contrast",))]:
        with pytest.raises(BadRequestError) as caught:
            await asyncio.wait_for(reactor.send_command("set_brightness", bad), 60)
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
    async with connected(run.url, "gradient") as reactor:
        assert reactor.status == ReactorStatus.READY
        first = await frames(reactor, "main_video", 1)
        assert first[0].shape == (480, 640, 3)
        await steer(reactor)
        session_id = reactor.session_id
        await reactor.reconnect()
        assert reactor.session_id == session_id
        assert await reactor.send_command("set_brightness", {"brightness": 1.5}) is None
        await frames(reactor, "main_video", 5)
    # Disconnecting ends the session on the server, as the client closing it.
    answer = await ended_session(run.url, session_id)
    assert answer["end_reason"] == "client_closed"
    assert "binary frame" not in run.output()  # nothing fell back to the JSON codec


async def ended_session(url, session_id, timeout=60.0):
    """The session's answer once the server has ended it."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while True:
            answer = (await http.get("/session", params={"session_id": session_id})).json()
            if answer["state"] == "ended":
                return answer
            assert time.monotonic() < deadline, f"the session did not end on disconnect: {answer}"
            await asyncio.sleep(0.2)  # poll interval of a wait with a generous deadline


async def test_sdk_camera_reaches_the_model_and_is_published_again_after_reconnect(reactor_run):
    run = reactor_run(WEBCAM)
    async with connected(run.url, "webcam_style") as reactor:
        picture = np.zeros((240, 320, 3), np.uint8)
        for colour in ((200, 0, 30), (20, 150, 220)):
            camera = await reactor.track("camera").publish()
            picture[...] = colour
            pushing = asyncio.create_task(push(camera, picture))
            try:
                # The style "none" returns the camera: its colour comes back.
                await first_frame_where(reactor, "main_video", lambda f, c=colour: shows(f, c),
                                        f"the camera's {colour}")
            finally:
                pushing.cancel()
            await reactor.reconnect()  # a publish lasts one connection
            assert not reactor.track("camera").published


def shows(frame, colour):
    return np.allclose(frame.mean(axis=(0, 1)), colour, atol=12)


async def push(camera, picture):
    while True:
        camera.push_frame(picture)
        await asyncio.sleep(1 / 30)  # a camera's pace, not a wait on anything


async def test_sdk_publishing_a_track_the_model_does_not_take_is_refused(reactor_run):
    run = reactor_run(GRADIENT)
    async with connected(run.url, "gradient") as reactor:
        with pytest.raises(Exception):  # the SDK refuses a recvonly track itself
            await reactor.track("main_video").publish()
        assert reactor.status == ReactorStatus.READY


async def test_sdk_steers_a_model_through_serve(serve_examples):
    async with connected(f"{serve_examples}/models/gradient", "gradient") as reactor:
        await steer(reactor)


async def message_of(messages, type_, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        found = [m for m in messages if m.get("type") == type_]
        if found:
            messages.remove(found[0])
            return found[0]["data"]
        assert time.monotonic() < deadline, f"no {type_} message in {timeout} s: {messages}"
        await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline


async def upload_a_palette(reactor):
    """Upload an image with the SDK; the model reads it back (its size and colour)."""
    messages = []
    reactor.on("message", messages.append)
    png = png_of((180, 40, 20), height=24, width=32)
    ref = await reactor.upload_file(png, name="red.png", mime_type="image/png")
    assert (ref.name, ref.mime_type, ref.size) == ("red.png", "image/png", len(png))
    assert await reactor.send_command("set_palette", {"image": ref}) is None
    read = await message_of(messages, "palette_set")
    assert read == {"name": "red.png", "width": 32, "height": 24, "colour": [180, 40, 20]}
    # A file the model cannot read is the model's to answer; the session goes on.
    text = await reactor.upload_file(b"not an image at all", name="notes.txt")
    assert text.mime_type == "text/plain"
    assert await reactor.send_command("set_palette", {"image": text}) is None
    refused = await message_of(messages, "palette_refused")
    assert refused["name"] == "notes.txt" and "not an image" in refused["reason"]
    # A reference to no upload of this session is refused at once, naming the field.
    forged = FileRef(upload_id=str(uuid.uuid4()), name="x.png", mime_type="image/png", size=3)
    with pytest.raises(BadRequestError) as caught:
        await reactor.send_command("set_palette", {"image": forged})
    assert "image" in caught.value.message and "no upload" in caught.value.message
    assert reactor.status == ReactorStatus.READY


async def test_sdk_uploads_a_file_the_model_reads_on_reactor_run(reactor_run):
    run = reactor_run(WEBCAM)
    async with connected(run.url, "webcam_style") as reactor:
        await upload_a_palette(reactor)


async def test_sdk_uploads_a_file_the_model_reads_through_serve(serve_examples):
    async with connected(f"{serve_examples}/models/webcam-style", "webcam-style") as reactor:
        await upload_a_palette(reactor)


async def test_sdk_pauses_and_resumes_video_and_bounds_its_bitrates(reactor_run):
    run = reactor_run(WEBCAM)
    async with connected(run.url, "webcam_style") as reactor:
        camera = await reactor.track("camera").publish()
        # Bitrate bounds are the SDK's own encoder's (and its connection's): they take
        # effect without a word to the server, and the session streams on.
        await reactor.set_bitrate(min_bps=100_000, max_bps=3_000_000)
        await camera.set_bitrate(max_bps=1_000_000)
        # The model returns the camera ("none" style): what it made after the pause is
        # told from the frames in flight by the colour the camera had then.
        before, after = (200, 0, 30), (20, 150, 220)
        picture = np.zeros((240, 320, 3), np.uint8)
        picture[...] = before
        pushing = asyncio.create_task(push(camera, picture))
        try:
            got = []
            video = reactor.track("main_video")
            await first_frame_where(reactor, "main_video", lambda f: shows(f, before),
                                    "the camera's colour before pausing")
            video.on_frame(got.append)
            await video.pause()
            picture[...] = after
            # A negative check: a slow machine makes fewer frames in this span, so it can
            # only pass more easily, never fail for want of time.
            await asyncio.sleep(2)
            assert not any(shows(f, after) for f in got), "video made after the pause came while paused"
            await video.resume()
            await first_frame_where(reactor, "main_video", lambda f: shows(f, after),
                                    "video (of the camera's new colour) after resume")
            resumed = len(got)
            deadline = time.monotonic() + 60
            while len(got) < resumed + 10:
                assert time.monotonic() < deadline, "video did not keep coming after resume"
                await asyncio.sleep(0.05)  # poll interval of a wait with a generous deadline
        finally:
            pushing.cancel()
        assert reactor.status == ReactorStatus.READY


def recorded_copy(model_dir, tmp_path):
    """A copy of `model_dir` whose config records each session from its start and keeps
    clips: the whole session can be asked for however long it has run (the SDK cannot
    ask for a recording at the start, and the clip ring holds only its last seconds)."""
    copy = tmp_path / Path(model_dir).name
    shutil.copytree(model_dir, copy)
    with open(copy / "config.yml", "a") as config:
        config.write(f"\nrecording:\n  enabled: true\n  destination: {tmp_path / 'recordings'}\n"
                     "  clip_seconds: 10\n  record_by_default: true\n")
    return copy


def decoded(data, tmp_path, name):
    return [picture for picture, _ in timed(data, tmp_path, name)]


def timed(data, tmp_path, name):
    """The pictures of an MP4, each with its presentation time in seconds."""
    path = tmp_path / name
    path.write_bytes(data)
    with av.open(str(path)) as container:
        return [(frame.to_ndarray(format="rgb24"), float(frame.time))
                for frame in container.decode(video=0)]


# The models run at 30 fps: a stream holding pictures faster than this (duplicated, or
# cut twice) is wrong. A loaded machine makes fewer pictures per media second, which
# can only keep below it.
FASTEST_FPS = 40
FRAME_S = 1 / 30


# The examples leave recording.keyframe_interval_s at its default: a recording in
# progress is served in whole fragments, so it holds up to one interval past its end marker.
KEYFRAME_INTERVAL_S = RecordingSettings.model_fields["keyframe_interval_s"].default


def session_times(times, start, end, what, past_end_s=0.0):
    """`times`, an MP4's presentation times, as session seconds: they are in order, no
    faster than the models' rate, and span the markers [`start`, `end`] to a frame
    (running on by less than `past_end_s`)."""
    assert times, f"{what} holds no pictures"
    assert times == sorted(times) and len(set(times)) == len(times), (what, times)
    span = times[-1] - times[0]
    assert len(times) - 1 <= span * FASTEST_FPS + 1, (what, len(times), span)
    assert -FRAME_S <= span - (end - start) <= past_end_s + FRAME_S, (what, span, start, end)
    return [start + (t - times[0]) for t in times]


async def clip_and_recording(reactor, tmp_path):
    """Ask for a clip and for the whole session; both download to MP4s of what the
    client was shown."""
    seen = []
    reactor.track("main_video").on_frame(seen.append)
    await frames(reactor, "main_video", 60)
    clip = await reactor.request_clip(1.0)
    assert clip.kind == "clip" and clip.session_id == reactor.session_id
    # Markers are session seconds to the millisecond (a young session's clip may
    # start exactly a second back, at its first keyframe).
    assert clip.start_marker <= clip.end_marker - 1.0 + 1e-3
    assert clip.end_marker <= clip.now_marker
    await reactor.download(clip, tmp_path / "clip.mp4")
    clip_timed = timed((tmp_path / "clip.mp4").read_bytes(), tmp_path, "clip-read.mp4")
    pictures = [picture for picture, _ in clip_timed]
    # The clip is the stream's pictures of its span, each once: its frames' own media
    # times say so, where a count over the span would also measure how busy the machine was.
    clip_times = session_times([t for _, t in clip_timed], clip.start_marker, clip.end_marker,
                               "the clip")
    # The clip's last picture is one the client was shown (two encodes of it differ a little).
    shown = list(seen)
    assert pictures[-1].shape == shown[-1].shape
    closest = min(float(np.abs(pictures[-1].astype(int) - s.astype(int)).mean()) for s in shown)
    assert closest < 6, closest
    # The session goes on past the clip before the recording is asked for: the client
    # is shown more pictures, made after the clip's last.
    await frames(reactor, "main_video", 30)
    recording = await reactor.request_recording()
    # From the session's first keyframe, where a young session's clip may start too;
    # it ends later, so it holds more: every picture of the clip, and those made after.
    assert recording.kind == "recording" and recording.start_marker <= clip.start_marker
    assert recording.end_marker > clip.end_marker, (clip, recording)
    whole_timed = timed(await reactor.download(recording), tmp_path, "recording.mp4")
    whole = [picture for picture, _ in whole_timed]
    whole_times = session_times([t for _, t in whole_timed], recording.start_marker,
                                recording.end_marker, "the recording", KEYFRAME_INTERVAL_S)
    kept = [t for t in whole_times if clip_times[0] - 1e-3 <= t <= clip_times[-1] + 1e-3]
    assert len(kept) == len(clip_times), (len(kept), len(clip_times))
    later = [t for t in whole_times if t > clip_times[-1] + 1e-3]
    assert later, (clip, recording)
    assert len(whole) >= len(pictures) + len(later), (len(whole), len(pictures), len(later))


async def test_sdk_downloads_a_clip_and_the_whole_session_from_reactor_run(reactor_run, tmp_path):
    run = reactor_run(recorded_copy(GRADIENT, tmp_path))
    async with connected(run.url, "gradient") as reactor:
        session_id = reactor.session_id
        await clip_and_recording(reactor, tmp_path)
    # The session is over (the SDK's disconnect may return before the server has ended
    # it: a recorded session's close finishes its files): its clips went with it.
    ended = await ended_session(run.url, session_id)
    assert ended["end_reason"] == "client_closed", ended
    gone = httpx.get(f"{run.url}/clips", params={"session_id": session_id, "start": "0",
                                                  "end": "1"}, timeout=30)
    assert gone.status_code == 410, gone.text


async def test_sdk_downloads_a_clip_through_serve(serve_examples, tmp_path):
    async with connected(f"{serve_examples}/models/webcam-style", "webcam-style") as reactor:
        camera = await reactor.track("camera").publish()
        # At the size the model shows before the camera: a recording keeps its first size.
        pushing = asyncio.create_task(push(camera, np.full((480, 640, 3), (30, 160, 90), np.uint8)))
        try:
            await clip_and_recording(reactor, tmp_path)
        finally:
            pushing.cancel()


async def stepped_session(url, model):
    """A stepped session: nothing streams, each step answers with the frames made with
    its own state, a bad value is refused naming the field, and it goes on after."""
    reactor = Reactor(model_name=model, local=True, api_url=url, generation="stepped")
    await reactor.connect()
    session_id = reactor.session_id
    try:
        streamed = []
        reactor.track("main_video").on_frame(streamed.append)
        first = await reactor.step()
        frames = first.track("main_video").frames
        assert first.step == 1 and first.error is None and len(frames) == 4
        assert frames[0].array.shape == (480, 640, 3)
        dim = await reactor.step(state={"brightness": 0.2})
        assert dim.step == 2 and len(dim.track("main_video").frames) == 4
        assert dim.track("main_video").frames[0].array.mean() < frames[0].array.mean() * 0.5
        with pytest.raises(StepRefusedError) as caught:
            await reactor.step(state={"brightness": 9})
        assert "brightness" in str(caught.value) and "le=2" in str(caught.value)
        with pytest.raises(StepRefusedError, match="no_such_command"):
            await reactor.step(commands=[StepCommand("no_such_command", {})])
        again = await reactor.step(commands=[StepCommand("set_brightness", {"brightness": 1.0})])
        assert again.step == 3
        assert abs(again.track("main_video").frames[0].array.mean() - frames[0].array.mean()) < 20
        # A negative check: a busy machine can only make it pass more easily.
        await asyncio.sleep(0.5)
        assert streamed == []  # a stepped session streams nothing
        # Each step that ran is kept: its video and usage, read back over HTTP.
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            listed = (await http.get(f"/sessions/{reactor.session_id}/steps")).json()
            assert listed == {"steps": [1, 2, 3]}
            kept = (await http.get(f"/sessions/{reactor.session_id}/steps/2")).json()
            assert kept["usage"]["frames"] == 4 and kept["usage"]["width"] == 640
            video = await http.get(f"/sessions/{reactor.session_id}/steps/2/{kept['files'][0]['name']}")
            assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
            pictures = decoded(video.content, Path(tempfile.mkdtemp()), "step.mp4")
            assert len(pictures) == 4 and pictures[0].mean() < 60  # the dimmed step
    finally:
        await reactor.disconnect()
    # And once the session has ended.
    await ended_session(url, session_id)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get(f"/sessions/{session_id}/steps")).json() == {"steps": [1, 2, 3]}
        kept = (await http.get(f"/sessions/{session_id}/steps/3")).json()
        assert kept["step"] == 3 and kept["usage"]["frames"] == 4


async def test_sdk_runs_a_stepped_session_on_reactor_run(reactor_run):
    run = reactor_run(GRADIENT)
    await stepped_session(run.url, "gradient")
    # The descriptor says so, and a streamed client of a stepped session is told.
    started = httpx.post(f"{run.url}/start_session", json={"generation": "stepped"}, timeout=30).json()
    assert started["generation"] == "stepped"
    httpx.post(f"{run.url}/stop_session", json={"session_id": started["session_id"]}, timeout=30)
    refused = httpx.post(f"{run.url}/start_session", json={"generation": "sometimes"}, timeout=30)
    assert refused.status_code == 400 and "generation" in refused.json()["detail"]


async def test_sdk_runs_a_stepped_session_through_serve(serve_examples):
    await stepped_session(f"{serve_examples}/models/gradient", "gradient")


TAGGED = "tests/models/metadata/tagged"


async def tagged_frames(reactor, count, timeout=60.0, until=None):
    """The next `count` frames with their ids and metadata; with `until`, those from
    the first whose metadata it accepts."""
    got = []

    # The SDK hands a handler as many of (frame, frame_id, timestamp_us, user_data)
    # as it takes, in that order.
    def keep(frame, frame_id, timestamp_us, user_data):
        if got or until is None or until(user_data):
            got.append((frame, frame_id, user_data))

    return await gathered(reactor, "main_video", keep, got, count, timeout, "tagged frames")


def level(n):
    return 20 + (n * 12) % 216  # as the tagged model paints frame n


async def test_sdk_gets_each_frames_metadata_with_that_frame(reactor_run):
    run = reactor_run(TAGGED)
    async with connected(run.url, "tagged") as reactor:
        first_id = reactor.session_id
        await reactor.send_command("set_label", {"label": "b"})
        # The frames' own tags say when the label applied: from then on, every one has it.
        await tagged_frames(reactor, 1,
                            until=lambda user_data: user_data and json.loads(user_data)["label"] == "b")
        got = await tagged_frames(reactor, 24)
        ids = [frame_id for _, frame_id, _ in got]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > 0
        for frame, _, user_data in got:
            tag = json.loads(user_data)
            assert tag["label"] == "b"
            # The metadata came with the very picture the model tagged.
            assert abs(float(frame.mean()) - level(tag["n"])) < 6, (tag, frame.mean())
        numbers = [json.loads(user_data)["n"] for _, _, user_data in got]
        assert numbers == sorted(numbers)
    # The model takes one session at a time: the next one waits for this one's end.
    await ended_session(run.url, first_id)
    # A stepped session's frames carry theirs beside them.
    reactor = Reactor(model_name="tagged", local=True, api_url=run.url, generation="stepped")
    await reactor.connect()
    try:
        step = await reactor.step(state={"label": "c"})
        tags = [json.loads(f.metadata) for f in step.track("main_video").frames]
        assert [t["n"] for t in tags] == [0, 1, 2, 3] and {t["label"] for t in tags} == {"c"}
        assert tags[0]["echo"] is None
        # What the client attaches to a frame it pushes reaches the model with it.
        camera = await reactor.track("camera").publish()
        camera.push_frame(np.zeros((96, 128, 3), np.uint8), user_data=b"first", capture_time_us=1)
        camera.push_frame(np.zeros((96, 128, 3), np.uint8), user_data='{"é": 2}'.encode(),
                          capture_time_us=1_700_000_000_000_000)
        step = await reactor.step()
        tags = [json.loads(f.metadata) for f in step.track("main_video").frames]
        assert tags[0]["echo"] == '{"é": 2}' and tags[0]["captured"] == 1_700_000_000_000_000
    finally:
        await reactor.disconnect()


async def test_a_model_process_killed_mid_step_ends_the_session_and_the_next_one_steps(reactor_run):
    run = reactor_run("tests/models/process/crashing")
    reactor = Reactor(model_name="crashing", local=True, api_url=run.url, generation="stepped")
    await reactor.connect()
    try:
        assert len((await reactor.step()).track("main_video").frames) == 1
        with pytest.raises(StepSessionEndedError, match="SIGKILL"):
            await reactor.step(commands=[StepCommand("crash", {"how": "kill"})])
        session_id = reactor.session_id
    finally:
        with contextlib.suppress(Exception):
            await reactor.disconnect()
    answer = await ended_session(run.url, session_id)
    assert answer["end_reason"] == "error"
    # The process is started again: the next session steps.
    deadline = time.monotonic() + 120
    while True:
        reactor = Reactor(model_name="crashing", local=True, api_url=run.url, generation="stepped")
        try:
            await reactor.connect()
            assert len((await reactor.step()).track("main_video").frames) == 1
            break
        except Exception:
            assert time.monotonic() < deadline, "no session stepped after the restart"
            await asyncio.sleep(0.5)  # poll interval of a wait with a generous deadline
        finally:
            with contextlib.suppress(Exception):
                await reactor.disconnect()
