"""The clip routes over the in-test backend: the playlist a v1 client is pointed at, its
segments relative to it (a prefix included), 202 while a clip's end is not written,
and the 4xx for everything else."""

from __future__ import annotations

import math

import numpy as np
import pytest
from asgi_calls import client
from fake_backend import FakeBackend, detail, start

from reactor_serve.http_api.routes import session_app
from reactor_serve.sessions.recording.encoding import Mp4Writer, RecordingEncoder
from reactor_serve.sessions.recording.served_clips import ServedClip
from reactor_serve.sessions.recording.settings import RecordingSettings

SECOND = 90_000


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(fake):
    async with client(session_app(lambda request: fake, server_version="9.9.9")) as c:
        yield c


def clip_file(path, frames=25):
    encoder = RecordingEncoder(RecordingSettings(enabled=True), 64, 48, 10, [])
    mp4 = None
    for n in range(frames):
        for packet in encoder.video(np.full((48, 64, 3), n, np.uint8), n * SECOND // 10, n % 10 == 0):
            mp4 = mp4 or Mp4Writer(path, encoder, packet.pts)
            mp4.write(packet)
    mp4.close()
    return path


async def test_the_playlist_names_the_init_segment_and_fragments_that_make_the_file(http, fake, tmp_path):
    sid = await start(http)
    path = clip_file(tmp_path / "clip.mp4")
    fake.served_clips(sid).add(ServedClip("c1", path, 0.0, 0.0, 2.4, written_s=lambda: math.inf))
    r = await http.get("/clips", params={"session_id": sid, "start": "0.000", "end": "2.400"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/vnd.apple.mpegurl"
    uris = [line.split('"')[1] if line.startswith("#EXT-X-MAP") else line
            for line in r.text.splitlines() if line.startswith("#EXT-X-MAP") or not line.startswith("#")]
    assert uris == [f"clips/chunks/{sid}/c1-init.mp4"] + [f"clips/chunks/{sid}/c1-{n:05d}.m4s" for n in range(3)]
    parts = []
    for uri in uris:
        part = await http.get(f"/{uri}")
        assert part.status_code == 200
        assert part.headers["content-type"] == ("video/mp4" if uri.endswith(".mp4") else "video/iso.segment")
        parts.append(part.content)
    # Less the trailing index the muxer appends on close, the file itself.
    assert path.read_bytes().startswith(b"".join(parts))
    # Markers are matched to the millisecond, however they are written.
    again = await http.get("/clips", params={"session_id": sid, "start": "0", "end": "2.4"})
    assert again.text == r.text


async def test_a_clip_whose_end_is_not_written_is_202_with_retry_after(http, fake, tmp_path):
    sid = await start(http)
    path = clip_file(tmp_path / "clip.mp4")
    fake.served_clips(sid).add(ServedClip("r1", path, 0.0, 0.0, 2.4, written_s=lambda: 2.0,
                                          retry_after_s=1.5))
    r = await http.get("/clips", params={"session_id": sid, "start": "0", "end": "2.4"})
    assert r.status_code == 202 and r.headers["retry-after"] == "2"


@pytest.mark.parametrize("params, status, words", [
    ({"start": "0", "end": "1"}, 404, "unknown session"),
    ({"session_id": "SID", "start": "nan", "end": "1"}, 400, "'start'"),
    ({"session_id": "SID", "start": "0", "end": "1e309"}, 400, "'end'"),
    ({"session_id": "SID", "start": "-1", "end": "1"}, 400, "'start'"),
    ({"session_id": "SID", "start": "0"}, 400, "'end'"),
    ({"session_id": "SID", "start": "0", "end": "9" * 40}, 400, "'end'"),
    ({"session_id": "SID", "start": "0", "end": "1"}, 404, "no clip from 0.000 to 1.000"),
    ({"session_id": "nobody", "start": "0", "end": "1"}, 404, "unknown session"),
])
async def test_bad_or_unknown_clip_requests_are_4xx_naming_the_problem(http, params, status, words):
    sid = await start(http)
    params = {k: (sid if v == "SID" else v) for k, v in params.items()}
    r = await http.get("/clips", params=params)
    assert r.status_code == status and words in detail(r), r.text


async def test_segments_of_other_names_sessions_or_ended_sessions_are_refused(http, fake, tmp_path):
    sid = await start(http)
    fake.served_clips(sid).add(ServedClip("c1", clip_file(tmp_path / "c.mp4"), 0.0, 0.0, 2.4,
                                          written_s=lambda: math.inf))
    for name in ("c1-init.mp4x", "..%2Fc1-init.mp4", "c1-99999.m4s", "c2-init.mp4", "c1-0.m4s"):
        r = await http.get(f"/clips/chunks/{sid}/{name}")
        assert r.status_code == 404, (name, r.text)
    other = await http.get("/clips/chunks/nobody/c1-init.mp4")
    assert other.status_code == 404
    await http.post("/stop_session", params={"session_id": sid})
    fake.sessions[sid].state = "ended"
    gone = await http.get(f"/clips/chunks/{sid}/c1-init.mp4")
    assert gone.status_code == 410 and "ended" in detail(gone)
