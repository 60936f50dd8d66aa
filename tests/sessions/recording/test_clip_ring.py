"""The clip ring: whole keyframe intervals of the last N seconds, bounded in bytes, cut on a keyframe."""

from reactor_serve.sessions.recording.clip_ring import ClipRing
from reactor_serve.sessions.recording.encoding import EncodedPacket

SECOND = 90_000
FRAME = SECOND // 10


def video(pts, keyframe=False, size=10):
    return EncodedPacket(0, b"v" * size, pts, pts, keyframe)


def audio(pts):
    return EncodedPacket(1, b"a" * 4, pts, pts, True)


def feed(ring, seconds, keyframe_every=10, size=10):
    """`seconds` of 10 fps video, a keyframe every `keyframe_every` frames, audio between."""
    for n in range(int(seconds * 10)):
        ring.add(video(n * FRAME, keyframe=n % keyframe_every == 0, size=size))
        ring.add(audio(n * 4800))


def test_nothing_before_the_first_keyframe_is_kept():
    ring = ClipRing(5)
    ring.add(audio(0))
    ring.add(video(0, keyframe=False))
    assert ring.cut(1) is None and ring.bytes == 0 and ring.start_pts is None


def test_the_ring_keeps_whole_intervals_covering_its_span():
    ring = ClipRing(3)
    feed(ring, 10)
    newest = 99 * FRAME
    # The oldest interval kept is the latest one that still reaches back 3 s.
    assert ring.start_pts == 6 * SECOND
    assert newest - ring.start_pts >= 3 * SECOND
    assert newest - (ring.start_pts + SECOND) < 3 * SECOND


def test_a_clip_starts_on_the_keyframe_at_or_before_what_was_asked():
    ring = ClipRing(5)
    feed(ring, 10)
    clip = ring.cut(2)
    assert clip.newest_pts == 99 * FRAME
    assert clip.start_pts == 7 * SECOND  # 9.9 - 2 = 7.9: the keyframe at 7 s
    first = clip.packets[0]
    assert first.stream == 0 and first.keyframe and first.pts == clip.start_pts
    assert [p.pts for p in clip.packets if p.stream == 0] == list(range(7 * SECOND, 100 * FRAME, FRAME))
    # More than the ring holds: from its oldest keyframe.
    assert ring.cut(60).start_pts == ring.start_pts


def test_the_ring_is_bounded_in_bytes_but_keeps_the_newest_interval():
    ring = ClipRing(600, max_bytes=2_500)
    feed(ring, 10, size=100)  # 1 s intervals of 1,040 bytes each
    assert ring.bytes <= 2_500
    assert ring.start_pts == 8 * SECOND
    tiny = ClipRing(600, max_bytes=10)
    feed(tiny, 3, size=100)
    assert tiny.start_pts == 2 * SECOND and tiny.cut(1) is not None


def test_a_ring_of_no_seconds_keeps_nothing():
    ring = ClipRing(0)
    feed(ring, 2)
    assert ring.cut(1) is None and ring.bytes == 0
