"""A fragmented MP4 as HLS byte ranges: the init segment and whole fragments only."""


import av
import numpy as np

from reactor_serve.sessions.recording.encoding import Mp4Writer, RecordingEncoder
from reactor_serve.sessions.recording.hls import Mp4Fragments, media_playlist
from reactor_serve.sessions.recording.settings import RecordingSettings

SECOND = 90_000


def encoded(frames, keyframe_every=10, base_pts=5 * SECOND):
    encoder = RecordingEncoder(RecordingSettings(enabled=True), 64, 48, 10, [])
    packets = []
    for n in range(frames):
        image = np.full((48, 64, 3), (n * 7) % 255, np.uint8)
        packets += encoder.video(image, base_pts + n * SECOND // 10, n % keyframe_every == 0)
    return encoder, packets


def written(path, frames):
    """An open Mp4Writer at `path` that has written `frames` encoded frames."""
    encoder, packets = encoded(frames)
    mp4 = Mp4Writer(path, encoder, packets[0].pts)
    for packet in packets:
        mp4.write(packet)
    return mp4


def test_the_init_segment_and_fragments_put_together_are_a_file_that_plays(tmp_path):
    path = tmp_path / "clip.mp4"
    written(path, 35).close()
    index = Mp4Fragments.read(path)
    # One fragment per keyframe interval, each starting at its keyframe's time.
    assert [f.start_s for f in index.fragments] == [0.0, 1.0, 2.0, 3.0]
    data = path.read_bytes()
    joined = data[: index.init_size] + b"".join(data[f.offset: f.offset + f.size] for f in index.fragments)
    assert joined.startswith(b"\x00\x00\x00") and joined[4:8] == b"ftyp"
    (tmp_path / "joined.mp4").write_bytes(joined)
    with av.open(str(tmp_path / "joined.mp4")) as container:
        assert len(list(container.decode(video=0))) == 35


def test_a_growing_file_lists_only_its_whole_fragments(tmp_path):
    path = tmp_path / "growing.mp4"
    mp4 = written(path, 25)
    # The fragment begun at the keyframe at 2 s is still open: two are whole.
    index = Mp4Fragments.read(path)
    assert [f.start_s for f in index.fragments] == [0.0, 1.0]
    assert index.complete_size == path.stat().st_size
    # A half-written box at the end is not counted.
    with open(path, "ab") as out:
        out.write(b"\x00\x00\x10\x00moof\x00\x00")
    assert Mp4Fragments.read(path).fragments == index.fragments
    mp4.close()


def test_a_file_that_is_not_a_fragmented_mp4_has_no_index(tmp_path):
    for content in (b"", b"\x00\x00\x00\x08ftyp", b"not an mp4 at all" * 10, b"\x00\x00\x00\x01moov"):
        path = tmp_path / "bad.mp4"
        path.write_bytes(content)
        assert Mp4Fragments.read(path) is None
    assert Mp4Fragments.read(tmp_path / "missing.mp4") is None


def test_the_playlist_is_hls_7_with_the_init_segment_first():
    text = media_playlist("c1-init.mp4", [("c1-00000.m4s", 1.0), ("c1-00001.m4s", 2.4)])
    lines = text.splitlines()
    assert lines[:2] == ["#EXTM3U", "#EXT-X-VERSION:7"]
    assert "#EXT-X-TARGETDURATION:3" in lines and lines[-1] == "#EXT-X-ENDLIST"
    assert lines.index('#EXT-X-MAP:URI="c1-init.mp4"') < lines.index("c1-00000.m4s")
    assert lines[-3:-1] == ["#EXTINF:2.400,", "c1-00001.m4s"]
