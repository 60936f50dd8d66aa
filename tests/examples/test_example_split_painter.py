"""The split painter example: its network really is split, so the picture is the
same whether one rank holds all of it or two and three ranks hold a slice each."""

from __future__ import annotations

import numpy as np
import pytest
from paths import EXAMPLES

from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.ranks import DistributedRunner


def frames(world_size: int) -> list[np.ndarray]:
    module = load_manifest(EXAMPLES / "split_painter").import_module("pipeline")
    with DistributedRunner(module.PainterShard, world_size=world_size, load_kwargs={
        "width": 64, "height": 48, "hidden": 48,
    }) as runner:
        return [runner.generate({"t": t, "hue": hue}) for t, hue in ((0.1, 0.0), (0.5, 0.7))]


def test_one_rank_or_several_paint_the_same_picture() -> None:
    single = frames(1)
    assert single[0].shape == (48, 64, 3) and single[0].dtype == np.uint8
    assert single[0].std() > 5 and np.abs(single[0].astype(int) - single[1]).mean() > 5
    for world_size in (2, 3):
        split = frames(world_size)
        for one, many in zip(single, split):
            # Sums in another order: at most a rounding step apart.
            assert np.abs(one.astype(int) - many.astype(int)).max() <= 1


def test_a_hidden_layer_that_does_not_split_evenly_fails_to_start() -> None:
    module = load_manifest(EXAMPLES / "split_painter").import_module("pipeline")
    with pytest.raises(ValueError, match="hidden \\(50\\) must split evenly over 3 ranks"):
        DistributedRunner(module.PainterShard, world_size=3, load_kwargs={
            "width": 8, "height": 8, "hidden": 50}).start()
