"""The recording in progress: its video from a keyframe, its command log, limits, summary and meta.json."""

import json

import av
import numpy as np

from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.recording.active_recording import ActiveRecording
from reactor_serve.sessions.recording.destinations import Output
from reactor_serve.sessions.recording.encoding import OutputEncode
from reactor_serve.sessions.recording.settings import RecordingSettings

SECOND = 90_000


def packets(count, start=0):
    encode = OutputEncode(RecordingSettings(enabled=True), "main", [])
    out = []
    for n in range(start, start + count):
        image = np.full((32, 32, 3), (n * 20) % 255, dtype=np.uint8)
        out += encode.encode(PresentedFrame(video={"main": image}, audio={}, pts=n * SECOND // 10,
                                            audio_pts=0, slot=n / 10, is_new=True,
                                            emitted_at=None, seq=n, fps=10.0))
    return encode.encoder, out


def make(tmp_path, **limits):
    output = Output("1", "recording", tmp_path, None)
    limits = {"max_seconds": 600.0, "max_bytes": 10**9, **limits}
    return ActiveRecording(output, {"kind": "recording", "tracks": ["as at start"]},
                           wall_clock=lambda: 1_700_000_123.4567, **limits)


def test_a_recording_writes_its_video_log_and_summary(tmp_path):
    encoder, encoded = packets(10, start=5)
    active = make(tmp_path)
    assert not active.started and active.limit_reached() is None
    active.log_command({"name": "early", "pts": 0})  # before the video: not logged
    active.begin(encoder, encoded[0].pts, [{"name": "main", "width": 32}])
    assert active.started and active.meta["start_pts"] == SECOND // 2
    # The video started: meta.json is there already, with the tracks as encoded.
    assert json.loads((tmp_path / "meta.json").read_text())["tracks"] == [{"name": "main", "width": 32}]
    for packet in encoded:
        active.write(packet)
    active.log_command({"name": "poke", "pts": SECOND})
    active.dropped = 2
    active.finalise("requested", None, None)
    summary = active.summary()
    assert summary == {"id": "1", "url": str(tmp_path), "frames": 10, "bytes": summary["bytes"],
                       "seconds": 0.9, "commands": 1, "dropped": 2, "reason": "requested"}
    with av.open(str(tmp_path / "video.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 10
    log = [json.loads(line) for line in (tmp_path / "commands.jsonl").read_text().splitlines()]
    assert log == [{"name": "poke", "pts": SECOND, "t": 0.5}]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["end_reason"] == "requested" and meta["ended_at"] == 1_700_000_123.457
    assert meta["frames"] == 10 and "url" not in meta and "end_message" not in meta
    assert meta["tracks"] == [{"name": "main", "width": 32}]  # kept: no tracks given at the end


def test_limits_in_seconds_and_in_bytes(tmp_path):
    encoder, encoded = packets(12)
    by_time = make(tmp_path / "a", max_seconds=1.0)
    (tmp_path / "a").mkdir()
    by_time.begin(encoder, 0, None)
    for n, packet in enumerate(encoded):
        by_time.write(packet)
        if by_time.limit_reached():
            break
    assert n == 10 and by_time.limit_reached() == "recording.max_seconds (1) reached"
    by_size = make(tmp_path / "b", max_bytes=100_000)
    (tmp_path / "b").mkdir()
    by_size.begin(encoder, 0, None)
    by_size.mp4.bytes = 100_000
    assert by_size.limit_reached() == "recording.max_bytes (100000) reached"


def test_an_ended_recording_says_why_in_meta_json(tmp_path):
    active = make(tmp_path)
    active.finalise("error", "writing failed: OSError", [{"name": "main"}])
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert (meta["end_reason"], meta["end_message"], meta["frames"], meta["tracks"]) == (
        "error", "writing failed: OSError", 0, [{"name": "main"}])
    assert active.summary()["message"] == "writing failed: OSError"
