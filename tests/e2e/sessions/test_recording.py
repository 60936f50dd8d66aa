"""Session recordings (sessions/recording/recorder.py) end to end: `reactor run` or the dev server
app, the Python client, and the files read back with PyAV.

The model (tests/models/recording/stamped_av) stamps each frame's number into it as
big black or white blocks, and sends a tone with every frame, so a test can tell which
frame the recording holds at each timestamp and compare it with what the client saw.
"""

import asyncio
import json
import shutil
import time
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from conftest import DevServer
from paths import TEST_MODELS

from reactor_serve.client import connect
from reactor_serve.client.session import RecordingRefused

MODEL = TEST_MODELS / "recording" / "stamped_av"
FPS = 15
FRAME_TICKS = 90000 / FPS
# `reactor run` or the dev server, the recording encoder and the client share a loaded
# machine: waits are for what the frames and messages show, bounded only to fail with a
# message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


def _read_stamp(image):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_stamped_av_model", MODEL / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_stamp(image)


def model_dir(tmp_path, **recording):
    """The test model in a directory of its own, with this `recording` section."""
    target = tmp_path / "model"
    shutil.copytree(MODEL, target, ignore=shutil.ignore_patterns("__pycache__"))
    section = {"enabled": True, "destination": str(tmp_path / "recordings"), **recording}
    (target / "config.yml").write_text(yaml.safe_dump({"recording": section}))
    return target


def read_video(path):
    """[(pts, stamp)] of every frame, the size, and the stream's first packet keyframe flag."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.time_base.denominator == 90000
        frames = [(frame.pts, _read_stamp(frame.to_ndarray(format="rgb24")))
                  for frame in container.decode(video=0)]
        size = (stream.codec_context.width, stream.codec_context.height)
    with av.open(str(path)) as container:
        first = next(container.demux(video=0))
        keyframe = first.is_keyframe
    return frames, size, keyframe


def read_audio(path):
    with av.open(str(path)) as container:
        if not container.streams.audio:
            return None
        chunks = [frame.to_ndarray() for frame in container.decode(audio=0)]
    return np.concatenate(chunks, axis=1) if chunks else np.zeros((1, 0))


def commands_of(directory):
    lines = (Path(directory) / "commands.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def wait_message(client, type_, timeout=DEADLINE_S, start=0):
    def find():
        for envelope in client.peer.messages[start:]:
            data = envelope.get("data") or {}
            if envelope.get("scope") == "runtime" and data.get("type") == type_:
                return data
        return None

    return (await client.peer.wait_for(find, timeout, type_))["data"]


async def frames_for(client, seconds, timeout=DEADLINE_S):
    """The next frames the client gets, until they span `seconds` of the presentation
    clock (their pts) and number at least its rate times that: [(pts, stamp)]. Read
    from the frames, not timed here: a loaded machine delivers them late."""
    seen = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1][0] - seen[0][0] < seconds * 90000 or len(seen) < seconds * FPS:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no frames spanning {seconds} s of the session's clock"
        frame = await client.next_frame(timeout=remaining)
        seen.append((frame.pts, _read_stamp(frame.image)))
    return seen


async def frames_keep_coming(client, count=4, timeout=DEADLINE_S):
    """`count` more frames arrive: counted, not timed (a loaded machine is slow, and
    that is not what these tests look for)."""
    async def take():
        for _ in range(count):
            await client.next_frame(timeout=timeout)

    await asyncio.wait_for(take(), timeout)


# ---- reactor run: a whole recording -------------------------------------------------------


async def test_recording_on_reactor_run_matches_what_the_client_saw(tmp_path, reactor_run):
    run = reactor_run(model_dir(tmp_path))
    client = await connect(run.url, extra_args={"record": True})
    try:
        started = await wait_message(client, "recordingStarted")
        assert started["id"] == "1"
        seen = await frames_for(client, 1.0)
        ids = [
            client.send_command("set_tint", {"tint": 10}),
            client.send_command("set_tint", {"tint": 999}),  # out of range: the model refuses
            client.send_command("poke", {}),
            client.send_command("no_such_command", {"x": 1}),
        ]
        client.peer.send_raw('{"scope":"application","data":{"type":"set_tint","data":{"tint":NaN}}}')
        ids.append(client.send_command("set_tint", {"tint": 200}))
        seen += await frames_for(client, 1.5)
        stopped = await client.stop_recording(timeout=DEADLINE_S)
        seen += await frames_for(client, 0.3)  # the session streams on
    finally:
        await client.close()

    directory = Path(stopped["url"])
    assert directory.parent.parent == (tmp_path / "recordings" / "stamped-av").absolute()
    assert stopped["reason"] == "requested" and stopped["dropped"] == 0
    frames, size, first_is_key = read_video(directory / "video.mp4")
    assert size == (160, 128) and first_is_key
    # Every presented slot is a frame, and the summary counts them exactly.
    assert len(frames) == stopped["frames"] > 20
    pts = [p for p, _ in frames]
    assert pts[0] == 0
    steps = np.diff(pts)
    # The presentation clock's own spacing: never two frames within a tick (the
    # clock's pace, and the slots it skips when a loaded machine falls behind, are for
    # benchmarks; the file keeping the clock's pts is checked against what the client
    # saw below).
    assert steps.min() > 0.8 * FRAME_TICKS
    assert abs(stopped["seconds"] - pts[-1] / 90000) < 0.01
    # The stamps the client saw at each pts are the stamps in the file at that pts.
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["model"] == "stamped-av" and meta["end_reason"] == "requested"
    assert meta["frames"] == len(frames) and meta["tracks"][0]["width"] == 160
    # The client's pts count from the first frame it decoded, so the two clocks differ
    # by a constant: the same for every frame, whichever it was.
    stamps = [s for _, s in frames]
    at = {}
    for p, s in frames:
        at.setdefault(s, []).append(p)
    compared = [(p, s) for p, s in seen if stamps[0] < s < stamps[-1]]
    assert len(compared) > 10
    offset = float(np.median([p - at[s][0] for p, s in compared if s in at]))
    assert all(any(abs(p - r - offset) <= 2 for r in at.get(s, ())) for p, s in compared), [
        (p, s, at.get(s)) for p, s in compared][:5]
    assert stamps == sorted(stamps)  # repeats allowed, never backwards
    # The tone the model sent with every frame is in the file, about as long as it.
    audio = read_audio(directory / "video.mp4")
    assert audio is not None and abs(audio.shape[1] / 48000 - len(frames) / 15) < 0.3
    assert np.abs(audio).max() > 0.1
    # The command log: every command, in order, with its verdict.
    log = commands_of(directory)
    assert [(c["name"], c["accepted"]) for c in log] == [
        ("set_tint", True), ("set_tint", False), ("poke", True), ("no_such_command", False),
        ("set_tint", False), ("set_tint", True),
    ]
    assert log[0]["args"] == {"tint": 10} and log[5]["args"] == {"tint": 200}
    # Each entry carries the id the command went with (none for the frame refused before
    # it had one), the one the model's commandError named.
    assert [c["id"] for c in log] == ids[:4] + [None, ids[4]]
    assert log[1]["error"]["id"] == ids[1]
    assert log[1]["error"]["errors"][0]["field"] == "tint"
    assert log[4]["args"] is None and log[4]["error"]["errors"][0]["rule"] == "finite"
    assert [c["seq"] for c in log] == sorted(c["seq"] for c in log)
    assert all(0 < c["t"] < pts[-1] / 90000 for c in log)
    assert meta["commands"] == 6


# ---- the dev server app: requests, clips, limits, failures ---------------------------------


async def test_start_stop_and_clip_on_request(tmp_path):
    with DevServer(model_dir(tmp_path, clip_seconds=5)) as app:
        client = await connect(app.url)
        try:
            await frames_for(client, 2.5)
            client.send_command("set_tint", {"tint": 77})
            await frames_for(client, 0.5)
            clip = await client.save_clip(2, timeout=DEADLINE_S)
            started = await client.start_recording(timeout=DEADLINE_S)
            with pytest.raises(RecordingRefused) as twice:
                await client.start_recording(timeout=DEADLINE_S)
            assert twice.value.data["errors"][0]["rule"] == "already_recording"
            await frames_for(client, 0.8)
            stopped = await client.stop_recording(timeout=DEADLINE_S)
            with pytest.raises(RecordingRefused) as none:
                await client.stop_recording(timeout=DEADLINE_S)
            assert none.value.data["errors"][0]["rule"] == "not_recording"
            await frames_for(client, 0.3)
        finally:
            await client.close()
    # The clip: its own playable file of about 2 s (from the keyframe at or before
    # that), starting on a keyframe.
    frames, size, first_is_key = read_video(Path(clip["url"]) / "video.mp4")
    assert first_is_key and size == (160, 128)
    assert 2.0 <= frames[-1][0] / 90000 + 1 / 15 <= 3.2
    assert clip["frames"] == len(frames)
    stamps = [s for _, s in frames]
    assert stamps == sorted(stamps) and stamps[0] > 0
    assert Path(clip["url"]).parent.name == "clips"
    # Its command log holds the command sent in its span, timed within it.
    log = commands_of(clip["url"])
    assert [(c["name"], c["args"], c["accepted"]) for c in log] == [("set_tint", {"tint": 77}, True)]
    assert 0 < log[0]["t"] < frames[-1][0] / 90000
    # The recording started by request.
    assert started["id"] == stopped["id"] == "1"
    frames, _, first_is_key = read_video(Path(stopped["url"]) / "video.mp4")
    assert first_is_key and len(frames) == stopped["frames"] >= 8


async def test_limits_stop_the_recording_and_the_session_goes_on(tmp_path):
    with DevServer(model_dir(tmp_path, max_seconds=1.0)) as app:
        client = await connect(app.url)
        try:
            mark = len(client.peer.messages)
            await client.start_recording(timeout=DEADLINE_S)
            stopped = await wait_message(client, "recordingStopped", start=mark)
            assert stopped["reason"] == "limit" and "max_seconds" in stopped["message"]
            assert stopped["seconds"] >= 1.0
            before = (await client.next_frame()).pts
            client.send_command("set_tint", {"tint": 3})
            frames = await frames_for(client, 0.5)
            assert frames[-1][0] > before and client.state == "streaming"
            # And another recording may start after it.
            again = await client.start_recording(timeout=DEADLINE_S)
            assert again["id"] == "2"
        finally:
            await client.close()
    frames, _, _ = read_video(Path(stopped["url"]) / "video.mp4")
    # It stopped at the first frame that reached the limit, on the session's clock
    # (however far a loaded machine's clock skipped to reach it).
    assert len(frames) == stopped["frames"]
    assert frames[-2][0] < 1.0 * 90000 <= frames[-1][0]
    assert abs(stopped["seconds"] - frames[-1][0] / 90000) < 0.001


async def test_max_bytes_stops_with_reason_limit(tmp_path):
    with DevServer(model_dir(tmp_path, max_bytes=100_000, crf=0, preset="ultrafast")) as app:
        client = await connect(app.url)
        try:
            mark = len(client.peer.messages)
            await client.start_recording(timeout=DEADLINE_S)
            stopped = await wait_message(client, "recordingStopped", start=mark, timeout=60)
            assert stopped["reason"] == "limit" and "max_bytes" in stopped["message"]
            assert stopped["bytes"] >= 100_000
            await frames_for(client, 0.3)
        finally:
            await client.close()
    assert (Path(stopped["url"]) / "video.mp4").stat().st_size >= 100_000


async def test_unwritable_destination_is_reported_and_the_session_streams_on(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the recordings directory should be")
    with DevServer(model_dir(tmp_path, destination=str(blocker / "recordings"))) as app:
        client = await connect(app.url)
        try:
            with pytest.raises(RecordingRefused) as refused:
                await client.start_recording(timeout=DEADLINE_S)
            assert refused.value.data["errors"][0]["rule"] == "write_failed"
            assert "cannot write" in refused.value.data["message"]
            with pytest.raises(RecordingRefused):
                await client.save_clip(1, timeout=DEADLINE_S)
            client.send_command("set_tint", {"tint": 7})
            await frames_keep_coming(client)
            assert client.state == "streaming"
            # A bad command still gets its commandError: the session is whole.
            mark = len(client.peer.messages)
            client.send_command("set_tint", {"tint": -1})
            error = await client.next_message("commandError", after=mark, timeout=DEADLINE_S)
            assert error["data"]["command"] == "set_tint"
        finally:
            await client.close()


async def test_a_model_that_did_not_opt_in_refuses_and_hostile_requests_get_errors(tmp_path):
    off = model_dir(tmp_path, enabled=False)
    with DevServer(off) as app:
        client = await connect(app.url, extra_args={"record": True})
        try:
            error = await wait_message(client, "recordingError")
            assert error["errors"][0]["rule"] == "not_enabled" and "recording" in error["message"]
            with pytest.raises(RecordingRefused) as refused:
                await client.start_recording(timeout=DEADLINE_S)
            assert "does not allow recording" in str(refused.value)
            await frames_for(client, 0.3)
        finally:
            await client.close()
    shutil.rmtree(tmp_path / "model")
    with DevServer(model_dir(tmp_path, clip_seconds=3)) as app:
        client = await connect(app.url, extra_args={"record": "yes please"})
        try:
            error = await wait_message(client, "recordingError")
            assert error["errors"][0]["field"] == "extra_args.record"
            await frames_for(client, 1.0)
            for seconds, rule in [("2", "type"), (-1, "out_of_range"), (0, "out_of_range"),
                                  (1e300, "out_of_range"), (True, "type"), (3.5, "out_of_range")]:
                with pytest.raises(RecordingRefused) as refused:
                    await client.save_clip(seconds, timeout=DEADLINE_S)
                assert refused.value.data["errors"][0]["rule"] == rule, seconds
            with pytest.raises(RecordingRefused) as refused:
                await client._recording_request("startRecording", {"now": True}, "recordingStarted",
                                                DEADLINE_S)
            assert refused.value.data["errors"][0]["rule"] == "unknown_field"
            # NaN cannot be read as JSON: the frame is dropped, and the session goes on.
            client.peer.send_raw('{"scope":"runtime","data":{"type":"saveClip","data":{"seconds":NaN}}}')
            client.peer.send_raw('{"scope":"runtime","data":{"type":"saveClip","data":[1]}}')
            await frames_keep_coming(client)
            assert client.state == "streaming"
            assert (await client.save_clip(1, timeout=DEADLINE_S))["frames"] > 0
        finally:
            await client.close()


async def test_fsspec_memory_destination_receives_the_files(tmp_path):
    import fsspec

    prefix = f"memory://recordings-{time.monotonic_ns()}"
    with DevServer(model_dir(tmp_path, destination=prefix)) as app:
        client = await connect(app.url)
        try:
            await client.start_recording(timeout=DEADLINE_S)
            await frames_for(client, 1.0)
            client.send_command("poke", {})
            await frames_for(client, 0.3)
            stopped = await client.stop_recording(timeout=DEADLINE_S)
            clip = await client.save_clip(1, timeout=DEADLINE_S)
        finally:
            await client.close()
    assert stopped["url"].startswith(prefix + "/stamped-av/")
    fs, path = fsspec.core.url_to_fs(stopped["url"])
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(path, detail=False)) == [
        "commands.jsonl", "meta.json", "video.mp4"]
    local = tmp_path / "downloaded.mp4"
    fs.get_file(f"{path}/video.mp4", str(local))
    frames, size, _ = read_video(local)
    assert len(frames) == stopped["frames"] and size == (160, 128)
    assert [json.loads(line)["name"] for line in fs.cat_file(f"{path}/commands.jsonl").decode().splitlines()] == ["poke"]
    assert fs.exists(clip["url"].split("://", 1)[1] + "/video.mp4")


async def test_the_session_ending_finalises_the_recording(tmp_path):
    with DevServer(model_dir(tmp_path)) as app:
        client = await connect(app.url, extra_args={"record": True})
        try:
            started = await wait_message(client, "recordingStarted")
            await frames_for(client, 1.0)
        finally:
            await client.close()
        directory = Path(started["url"])
        meta = json.loads((directory / "meta.json").read_text())
        assert meta["end_reason"] == "session_ended" and "client_closed" in meta["end_message"]
        frames, _, _ = read_video(directory / "video.mp4")
        assert len(frames) == meta["frames"] >= 10


# ---- Serve: a replica records its session ---------------------------------------------------


async def test_recording_on_a_serve_replica(ray_serve, tmp_path):
    destination = tmp_path / "serve-recordings"
    # The model config leaves recording off; serve_config.yaml's entry turns it on.
    url = ray_serve.deploy("recordings", {"models": [
        {"path": "tests/models/recording/stamped_av", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True},
         "recording": {"enabled": True, "destination": str(destination), "clip_seconds": 0}}]})
    try:
        client = await connect(f"{url}/models/stamped-av", extra_args={"record": True})
        try:
            started = await wait_message(client, "recordingStarted", timeout=60)
            await frames_for(client, 1.0)
            client.send_command("set_tint", {"tint": 42})
            await frames_for(client, 0.5)
            stopped = await client.stop_recording(timeout=DEADLINE_S)
        finally:
            await client.close()
        assert stopped["id"] == started["id"] and stopped["url"].startswith(str(destination))
        frames, size, first_is_key = read_video(Path(stopped["url"]) / "video.mp4")
        assert len(frames) == stopped["frames"] > 10 and size == (160, 128) and first_is_key
        assert [(c["name"], c["args"], c["accepted"]) for c in commands_of(stopped["url"])] == [
            ("set_tint", {"tint": 42}, True)]
    finally:
        ray_serve.delete("recordings")


# ---- settings ---------------------------------------------------------------------------


def test_settings_errors_name_the_field(tmp_path):
    from reactor_serve.local.app import create_app
    from reactor_serve.rtc.settings import WebRTCSettingsError
    from reactor_serve.serve.config import ModelEntry
    from reactor_serve.sessions.recording.settings import (
        RecordingSettings,
        RecordingSettingsError,
    )

    assert RecordingSettings.from_config({}).enabled is False
    for section, field in [({"max_seconds": -1}, "recording.max_seconds"),
                           ({"clip_seconds": "lots"}, "recording.clip_seconds"),
                           ({"destination": "  "}, "recording.destination"),
                           ({"colour": 1}, "recording.colour")]:
        with pytest.raises(RecordingSettingsError) as bad:
            RecordingSettings.from_config({"recording": section})
        assert f"field '{field}'" in str(bad.value)
    with pytest.raises(RecordingSettingsError, match="must be a mapping"):
        RecordingSettings.from_config({"recording": [1]})
    # `reactor run` refuses to start (it reports WebRTCSettingsError as a usage error).
    with pytest.raises(WebRTCSettingsError, match="recording.max_bytes"):
        create_app(model_dir(tmp_path, max_bytes=5), in_process=True)
    # serve_config.yaml: unknown keys at parse time, values merged with the model's.
    with pytest.raises(ValueError, match="unknown key"):
        ModelEntry.model_validate({"path": "x", "recording": {"enable": True}})
    entry = ModelEntry.model_validate({"path": "x", "recording": {"max_seconds": 5}})
    merged = entry.recording_settings({"recording": {"enabled": True, "destination": "/r"}})
    assert (merged.enabled, merged.destination, merged.max_seconds) == (True, "/r", 5)
    with pytest.raises(RecordingSettingsError, match="recording.max_seconds"):
        ModelEntry.model_validate({"path": "x", "recording": {"max_seconds": 0}}).recording_settings()


async def test_disk_full_and_failed_uploads_stop_the_recording_not_the_session(tmp_path):
    destination = tmp_path / "recordings"
    with DevServer(model_dir(tmp_path)) as app:
        client = await connect(app.url)
        try:
            # The first recording's file is /dev/full: every write fails with ENOSPC.
            directory = destination / "stamped-av" / client.session_id / "1"
            directory.mkdir(parents=True)
            (directory / "video.mp4").symlink_to("/dev/full")
            mark = len(client.peer.messages)
            await client.start_recording(timeout=DEADLINE_S)
            stopped = await wait_message(client, "recordingStopped", start=mark)
            assert stopped["reason"] == "error" and "space" in stopped["message"].lower()
            client.send_command("set_tint", {"tint": 9})
            await frames_keep_coming(client)
            assert client.state == "streaming"
            # The next recording works.
            await client.start_recording(timeout=DEADLINE_S)
            await frames_for(client, 0.5)
            assert (await client.stop_recording(timeout=DEADLINE_S))["frames"] > 3
        finally:
            await client.close()
    shutil.rmtree(tmp_path / "model")
    with DevServer(model_dir(tmp_path, destination="nosuchstore://bucket/prefix")) as app:
        client = await connect(app.url)
        try:
            await client.start_recording(timeout=DEADLINE_S)
            await frames_for(client, 0.5)
            stopped = await client.stop_recording(timeout=DEADLINE_S)
            assert stopped["reason"] == "error" and "uploading to nosuchstore://" in stopped["message"]
            # The files stay where they were written, complete.
            frames, _, _ = read_video(Path(stopped["url"]) / "video.mp4")
            assert len(frames) == stopped["frames"]
            await frames_keep_coming(client, 3)
            assert client.state == "streaming"
        finally:
            await client.close()


async def test_shutting_down_reactor_run_finalises_the_recording(tmp_path, reactor_run):
    run = reactor_run(model_dir(tmp_path))
    client = await connect(run.url, extra_args={"record": True}, reconnect=False)
    try:
        started = await wait_message(client, "recordingStarted")
        await frames_for(client, 1.0)
        await asyncio.to_thread(run.stop)  # SIGTERM: the server shuts down
        await client.wait_closed(timeout=DEADLINE_S)
    finally:
        await client.close()
    directory = Path(started["url"])
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["end_reason"] == "session_ended" and "shutdown" in meta["end_message"]
    frames, _, _ = read_video(directory / "video.mp4")
    assert len(frames) == meta["frames"] >= 10
