"""One encoder per (track, codec), fed while any exists, counted after it stops."""

import numpy as np

from reactor_serve.sessions.viewers.encoder_pool import EncoderPool


class FakeEncoder:
    def __init__(self, codec):
        self.codec = codec
        self.tracks = []
        self.presented = []
        self.closed = False

    @property
    def subscribers(self):
        return len(self.tracks)

    def subscribe(self, track):
        self.tracks.append(track)

    def present(self, image, pts):
        self.presented.append(pts)

    def close(self):
        self.closed = True

    def stats(self):
        return {"codec": self.codec, "viewers": len(self.tracks), "presented": len(self.presented),
                "encodes": len(self.presented), "superseded": 0, "keyframes": 1, "cpu_ms": 1.5}


class Fanout:
    def __init__(self):
        self.observers = []

    def observe(self, callback):
        self.observers.append(callback)
        return lambda: self.observers.remove(callback)


class Presented:
    def __init__(self, pts, names):
        self.pts = pts
        self.video = {name: np.zeros((2, 2, 3), np.uint8) for name in names}


def test_encoders_are_shared_per_track_and_codec_and_fed_while_they_exist():
    fanout, made = Fanout(), []

    def make(codec):
        made.append(FakeEncoder(codec))
        return made[-1]

    pool = EncoderPool(fanout.observe, make)
    assert pool.stats() is None and fanout.observers == []
    pool.subscribe("main", "vp8", "viewer 1")
    pool.subscribe("main", "vp8", "viewer 2")
    pool.subscribe("main", "h264", "viewer 3")
    assert len(pool) == 2 and len(made) == 2 and len(fanout.observers) == 1
    fanout.observers[0](Presented(90, ["main"]))
    fanout.observers[0](Presented(180, ["other"]))  # not a track anyone watches
    assert made[0].presented == [90] and made[1].presented == [90]
    assert pool.stats()["codecs"] == ["h264", "vp8"]

    made[1].tracks.clear()  # its only viewer left
    pool.drop_idle()
    assert len(pool) == 1 and made[1].closed and len(fanout.observers) == 1
    stats = pool.stats()
    assert stats["encoders"] == 1 and stats["presented"] == 2 and stats["cpu_ms"] == 3.0

    made[0].tracks.clear()
    pool.drop_idle()
    assert fanout.observers == []  # nothing left to feed
    assert pool.stats()["encoders"] == 0 and pool.stats()["presented"] == 2


def test_close_stops_every_encoder_and_the_feed():
    fanout = Fanout()
    encoders = []
    pool = EncoderPool(fanout.observe, lambda codec: encoders.append(FakeEncoder(codec)) or encoders[-1])
    pool.subscribe("main", "vp8", "viewer")
    pool.close()
    assert encoders[0].closed and fanout.observers == [] and len(pool) == 0
