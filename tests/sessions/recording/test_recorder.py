"""SessionRecordings driven as a session drives it: requests, commands, presented slots, the end."""

import asyncio
import json
from pathlib import Path

import av
import numpy as np
import pytest

from reactor_serve.interface.tracks import TrackDecl
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


def of(sent, type_):
    return [data for t, data in sent if t == type_]


async def end(recordings):
    await recordings.close("test")
    await asyncio.sleep(0)  # the worker's last messages, sent on the loop


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
    fanout = Fanout()
    recordings.attach(fanout, record=True)
    for n in range(30):
        fanout.present(n)
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
        await asyncio.sleep(0.01)  # let the worker's stop reach the loop
    for _ in range(200):
        if of(sent, "recordingStopped"):
            break
        await asyncio.sleep(0.01)
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
