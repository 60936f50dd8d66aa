"""SessionRecordings driven as a session drives it: requests, commands, presented slots, the end."""

import asyncio
import json
from pathlib import Path

import av
import numpy as np
import pytest

from reactor_serve.interface.tracks import TrackDecl
from reactor_serve.protocol.errors import ClipGone, UnknownClip
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.recording.recorder import SessionRecordings
from reactor_serve.sessions.recording.settings import RecordingSettings

SECOND = 90_000


class Video:
    pass


class Fanout:
    def __init__(self):
        self.observers = []

    def observe(self, observer):
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

    def present(self, n, new=True):
        image = np.full((32, 48, 3), (n * 20) % 255, dtype=np.uint8)
        frame = PresentedFrame(video={"main": image}, audio={}, pts=n * SECOND // 10,
                               audio_pts=n * 4800, slot=n / 10, is_new=new, emitted_at=None,
                               seq=n, fps=10.0)
        for observer in list(self.observers):
            observer(frame)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(tmp_path, config=None, outputs=None, clock=None, **recording):
    sent = []
    section = {"enabled": True, "destination": str(tmp_path / "rec"), **recording}
    if clock is not None:
        recordings = SessionRecordings(
            model="m", session_id="s1", outputs=(TrackDecl("main", "video", Video),),
            settings=RecordingSettings(**section), clock=clock,
            send=lambda type_, data: sent.append((type_, data)),
        )
        return recordings, sent
    recordings = SessionRecordings.for_session(
        model="m", session_id="s1", config=config if config is not None else {"recording": section},
        outputs=outputs if outputs is not None else (TrackDecl("main", "video", Video),),
        send=lambda type_, data: sent.append((type_, data)),
    )
    return recordings, sent


def watched(recordings, frames=0, record=False):
    """A Fanout that `recordings` watches (`record`: the session's start option), which
    has presented its first `frames` slots."""
    fanout = Fanout()
    recordings.attach(fanout, record=record)
    for n in range(frames):
        fanout.present(n)
    return fanout


def of(sent, type_):
    return [data for t, data in sent if t == type_]


# The worker encodes on its own thread: on a loaded machine a deadline only stops a hang.
WAIT_S = 60.0


async def until(predicate, what):
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # the poll interval; the deadline is the bound


async def end(recordings):
    await recordings.close("test")
    # One loop turn, not a wait: the worker queued its last messages on the loop
    # before its thread ended, so they run ahead of anything queued after close().
    await asyncio.sleep(0)


async def test_a_requested_recording_writes_the_presented_slots_and_the_commands(tmp_path):
    clock = Clock()
    recordings, sent = make(tmp_path, clip_seconds=0, clock=clock)
    fanout = Fanout()
    recordings.attach(fanout)
    fanout.present(0, new=False)  # the placeholder: never recorded
    recordings.request("startRecording", {})
    assert recordings.recording == "1"
    for n in range(1, 6):
        clock.now = n / 10
        fanout.present(n, new=n % 2 == 1)  # repeats are frames too
    recordings.command("poke", {"x": 1}, command_id="c1")
    recordings.command_error({"command": "poke", "id": "c1", "errors": []})
    recordings.command("set", {"v": 2}, command_id="c2")
    fanout.present(6)
    recordings.request("stopRecording", {})
    assert recordings.recording is None
    fanout.present(7)
    await end(recordings)
    started, stopped = of(sent, "recordingStarted"), of(sent, "recordingStopped")
    assert started == [{"id": "1", "url": stopped[0]["url"]}]
    assert stopped[0]["frames"] == 6 and stopped[0]["reason"] == "requested"
    directory = Path(stopped[0]["url"])
    assert directory == (tmp_path / "rec" / "m" / "s1" / "1").absolute()
    with av.open(str(directory / "video.mp4")) as container:
        assert [f.pts for f in container.decode(video=0)] == [n * SECOND // 10 for n in range(6)]
    log = [json.loads(line) for line in (directory / "commands.jsonl").read_text().splitlines()]
    # c1 refused by the model; c2 taken as accepted when the recording stopped.
    assert [(c["id"], c["accepted"], c["t"]) for c in log] == [("c1", False, 0.4), ("c2", True, 0.4)]
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["end_reason"] == "requested" and meta["commands"] == 2
    assert meta["tracks"] == [{"name": "main", "kind": "video", "width": 48, "height": 32}]
    assert recordings.stats()["recording_dropped_frames"] == 0


async def test_a_clip_is_cut_from_the_ring_and_the_session_end_finalises_the_recording(tmp_path):
    recordings, sent = make(tmp_path, clip_seconds=2, keyframe_interval_s=0.5)
    fanout = watched(recordings, 30, record=True)
    recordings.request("saveClip", {"seconds": 1})
    fanout.present(30)
    await end(recordings)
    clip = of(sent, "clipSaved")[0]
    assert Path(clip["url"]) == (tmp_path / "rec" / "m" / "s1" / "clips" / "1").absolute()
    # 1 s back from 2.9 s is 1.9 s: the clip starts at the keyframe at 1.5 s.
    assert clip["frames"] == 15 and clip["seconds"] == 1.4
    meta = json.loads((Path(clip["url"]) / "meta.json").read_text())
    assert meta["start_pts"] == 15 * SECOND // 10 and meta["end_reason"] == "clip"
    stopped = of(sent, "recordingStopped")[0]
    assert stopped["reason"] == "session_ended" and stopped["message"] == "session ended (test)"
    assert stopped["frames"] == 31


async def test_a_limit_stops_the_recording_and_another_may_start(tmp_path):
    recordings, sent = make(tmp_path, max_seconds=0.5, clip_seconds=0)
    fanout = Fanout()
    recordings.attach(fanout, record=True)
    for n in range(8):
        fanout.present(n)
        # A pace for the input, so the stop may land among the frames; nothing
        # depends on it: the limit is read from the slots, and frames past it are
        # not written.
        await asyncio.sleep(0.01)
    await until(lambda: of(sent, "recordingStopped"), "recordingStopped at the limit")
    stopped = of(sent, "recordingStopped")[0]
    assert stopped["reason"] == "limit" and stopped["message"] == "recording.max_seconds (0.5) reached"
    assert stopped["seconds"] == 0.5 and recordings.recording is None
    recordings.request("startRecording", {})
    assert recordings.recording == "2"
    await end(recordings)


async def test_requests_that_cannot_be_done_are_answered_with_the_rule(tmp_path):
    recordings, sent = make(tmp_path, clip_seconds=3)
    recordings.attach(Fanout(), record="yes")
    recordings.request("stopRecording", {})
    recordings.request("startRecording", {"now": True})
    recordings.request("saveClip", [1])
    for seconds in ("2", True, 0, 3.5):
        recordings.request("saveClip", {"seconds": seconds})
    recordings.request("saveClip", {"seconds": 1})  # nothing encoded yet: the worker says so
    await end(recordings)
    recordings.request("startRecording", {})
    errors = of(sent, "recordingError")
    assert [(e["command"], e["errors"][0]["rule"], e["errors"][0]["field"]) for e in errors] == [
        ("startRecording", "type", "extra_args.record"),
        ("stopRecording", "not_recording", None),
        ("startRecording", "unknown_field", "now"),
        ("saveClip", "type", None),
        ("saveClip", "type", "seconds"), ("saveClip", "type", "seconds"),
        ("saveClip", "out_of_range", "seconds"), ("saveClip", "out_of_range", "seconds"),
        ("saveClip", "empty", None),
        ("startRecording", "ended", None),
    ]


@pytest.mark.parametrize("config, outputs, rule", [
    ({"recording": {"enabled": False}}, None, "not_enabled"),
    ({"recording": {"enabled": True, "max_seconds": -1}}, None, "bad_settings"),
    ({"recording": {"enabled": True}}, (), "no_video"),
])
async def test_a_session_that_cannot_record_refuses_and_records_nothing(tmp_path, config, outputs, rule):
    recordings, sent = make(tmp_path, config=config, outputs=outputs)
    fanout = Fanout()
    recordings.attach(fanout, record=True)
    assert not recordings.enabled and fanout.observers == []
    recordings.request("startRecording", {})
    recordings.command("poke", {})
    await end(recordings)
    assert [e["errors"][0]["rule"] for e in of(sent, "recordingError")] == [rule, rule]
    assert not (tmp_path / "rec").exists()


# ---- wire v1: clips served over HTTP ------------------------------------------------------


async def answer_of(recordings, seconds):
    answers = []
    recordings.request_clip(seconds, answers.append)
    await until(lambda: answers, "the answer to the clip request")
    return answers[0]


def download(served, answer):
    """What the official SDK's download() does: the playlist, then each URI in order."""
    start, end = (float(part.split("=")[1]) for part in answer.playlist_url.split("&")[1:])
    playlist = served.playlist(start, end)
    assert isinstance(playlist, str), playlist
    uris = [line.split('"')[1] if line.startswith("#EXT-X-MAP") else line
            for line in playlist.splitlines() if line.startswith("#EXT-X-MAP") or not line.startswith("#")]
    assert all(uri.startswith("clips/chunks/s1/") for uri in uris)
    return b"".join(served.chunk(uri.rsplit("/", 1)[1]) for uri in uris)


def frame_pts(data, tmp_path):
    path = tmp_path / "downloaded.mp4"
    path.write_bytes(data)
    with av.open(str(path)) as container:
        return [f.pts for f in container.decode(video=0)]


async def test_a_v1_clip_is_served_as_hls_and_downloads_as_the_frames_presented(tmp_path):
    recordings, sent = make(tmp_path, clip_seconds=2, keyframe_interval_s=0.5)
    watched(recordings, 30)
    answer = await answer_of(recordings, 1.0)
    # 1 s back from 2.9 s: from the keyframe at 1.5 s.
    assert (answer.kind, answer.start_s, answer.end_s, answer.now_s) == ("clip", 1.5, 2.9, 2.9)
    assert answer.playlist_url == "/clips?session_id=s1&start=1.500&end=2.900"
    assert frame_pts(download(recordings.served, answer), tmp_path) == [n * SECOND // 10 for n in range(15)]
    # More than the ring keeps is what it keeps.
    longer = await answer_of(recordings, 60)
    assert longer.failed is None and longer.start_s <= 1.0
    await end(recordings)
    with pytest.raises(ClipGone):
        recordings.served.playlist(1.5, 2.9)
    assert of(sent, "recordingError") == []


async def test_a_v1_recording_grows_with_the_session_and_is_ready_once_now_is_written(tmp_path):
    recordings, _ = make(tmp_path, clip_seconds=0, keyframe_interval_s=0.5)
    fanout = watched(recordings, 12, record=True)
    answer = await answer_of(recordings, None)
    assert (answer.kind, answer.start_s, answer.end_s) == ("recording", 0.0, 1.1)
    # The fragment holding 1.1 s closes at the next keyframe (1.5 s): until then, wait.
    assert recordings.served.playlist(0.0, 1.1) == 0.5
    for n in range(12, 16):
        fanout.present(n)
    await until(lambda: isinstance(recordings.served.playlist(0.0, 1.1), str),
                "the recording's playlist once 1.1 s is written")
    assert frame_pts(download(recordings.served, answer), tmp_path) == [n * SECOND // 10 for n in range(15)]
    await end(recordings)


async def test_a_v1_recording_of_an_unrecorded_session_the_ring_still_holds_is_its_clip(tmp_path):
    # Nothing records the whole session, but the ring has kept it from its first keyframe.
    recordings, _ = make(tmp_path, clip_seconds=10, keyframe_interval_s=0.5)
    watched(recordings, 12)
    answer = await answer_of(recordings, None)
    assert answer.failed is None
    assert (answer.kind, answer.start_s, answer.end_s) == ("recording", 0.0, 1.1)
    assert frame_pts(download(recordings.served, answer), tmp_path) == [n * SECOND // 10 for n in range(12)]
    await end(recordings)


async def test_v1_clip_requests_that_cannot_be_met_say_why(tmp_path):
    recordings, _ = make(tmp_path, clip_seconds=1, keyframe_interval_s=0.5)
    fanout = Fanout()
    recordings.attach(fanout)
    assert "nothing to save yet" in (await answer_of(recordings, 1.0)).failed
    for n in range(40):
        fanout.present(n)
    # Only the last second is kept, and nothing records the whole session.
    whole = (await answer_of(recordings, None)).failed
    assert whole.startswith("recorder disabled: no recording of the whole session")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert "duration_seconds" in (await answer_of(recordings, bad)).failed
    with pytest.raises(UnknownClip):
        recordings.served.playlist(0.0, 1.0)
    await end(recordings)
    off, _ = make(tmp_path, config={"recording": {"enabled": False}})
    off.attach(Fanout())
    assert (await answer_of(off, 1.0)).failed.startswith("recorder disabled: model m does not allow")
    await end(off)
