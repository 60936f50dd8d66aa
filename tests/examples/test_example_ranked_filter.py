"""The ranked filter example: its own class runs on every rank, and its network really
is split, so the frames made from the same camera frames and commands are the same on
one rank and on two or three."""

from __future__ import annotations

import numpy as np
import pytest
from paths import EXAMPLES
from rank_processes import model_copy

from reactor_serve.runtime.isolation.model_process import ModelProcess

# Only a guard against a hang: the test starts a model process and its ranks three
# times, which a loaded machine slows down many times over.
pytestmark = pytest.mark.timeout(1200)
# A bound on one start (a model process and up to three ranks importing torch), not a
# speed: under load one took more than 120 s.
START_S = 300


class Sink:
    def message(self, envelope):
        pass

    def ended(self, reason, detail):
        pass


def camera(level: int) -> np.ndarray:
    frame = np.zeros((96, 128, 3), np.uint8)
    frame[..., 1] = level
    frame[: level % 96] = 250
    return frame


async def filtered(tmp_path, ranks: int) -> list[np.ndarray]:
    host = ModelProcess(model_copy(EXAMPLES / "ranked_filter", tmp_path / str(ranks),
                                   wait_for_camera=True), ranks=ranks)
    host.start(START_S)
    try:
        session = await host.open_session(Sink(), stepped=True)
        made = []
        for level, commands in ((30, []), (90, [("flash", {"frames": 1})]), (150, []),
                                (200, [("set_strength", {"strength": 0.3})])):
            session.push_input("camera", camera(level))
            outcome = await host.step(session, {}, commands)
            assert outcome.failure is None, outcome
            made += [item.video["main_video"] for item in host.output_buffer.drain()]
        await session.close()
        return made
    finally:
        host.shutdown()


async def test_one_rank_or_several_filter_the_same_frames(tmp_path) -> None:
    single = await filtered(tmp_path, 1)
    assert len(single) == 4 and single[0].shape == (96, 128, 3)
    assert single[0].std() > 5
    assert single[1].min() == 255  # the flash
    assert np.abs(single[2].astype(int) - single[3]).mean() > 5  # the strength changed it
    for ranks in (2, 3):
        split = await filtered(tmp_path, ranks)
        assert len(split) == 4
        for one, many in zip(single, split):
            # Sums in another order: at most a rounding step apart.
            assert np.abs(one.astype(int) - many.astype(int)).max() <= 1
