"""Large arrays of a call's input reach real rank processes through shared memory
(one ring per rank), small ones in the message; a rank that keeps its inputs runs out
of slots with SharedSlotAllocationFailed, and the group goes on."""

from __future__ import annotations

from multiprocessing.connection import Connection

import numpy as np
import pytest
import torch
from dev_shm import dev_shm_entries
from rank_counts import RANK_COUNTS
from rank_workers import ArrayWorker, started_runners

from reactor_serve.runtime.isolation.frame_ring import FrameReader
from reactor_serve.runtime.isolation.process_channel import ProcessChannel, channel_pair
from reactor_serve.runtime.ranks import DistributedRunner, SharedSlotAllocationFailed
from reactor_serve.runtime.ranks.shared_inputs import (
    SHARED_MIN_BYTES,
    InputSharing,
    SharedArray,
    has_shareable,
    restore_shared,
)


@pytest.fixture
def runner_of(tmp_path):
    with started_runners(ArrayWorker, tmp_path) as start:
        yield start


def frame(seed: int, shape=(256, 256, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def test_only_plain_arrays_above_the_threshold_are_shared() -> None:
    big = np.zeros(SHARED_MIN_BYTES, np.uint8)
    assert has_shareable(big) and has_shareable({"a": [1, (2, big)]})
    assert not has_shareable(np.zeros(SHARED_MIN_BYTES - 1, np.uint8))
    assert not has_shareable(np.empty(SHARED_MIN_BYTES, object))
    assert not has_shareable(np.ma.masked_array(big))  # a subclass is pickled whole
    assert has_shareable(torch.zeros(SHARED_MIN_BYTES // 4))
    assert not has_shareable(torch.zeros(SHARED_MIN_BYTES // 4, requires_grad=True))
    assert not has_shareable(torch.zeros(SHARED_MIN_BYTES // 2, dtype=torch.bfloat16))
    deep: object = big
    for _ in range(20):
        deep = [deep]
    assert not has_shareable(deep)  # deeper than MAX_DEPTH: pickled as it is


def test_placed_arrays_come_back_as_views_of_the_same_values() -> None:
    ours, theirs = channel_pair()
    other = ProcessChannel(Connection(theirs.detach()))
    sharing = InputSharing(1, 1 << 24)
    reader = FrameReader()
    try:
        image, latent = frame(1), torch.arange(40_000, dtype=torch.float32).reshape(200, 200)
        value = {"image": image, "steps": [latent, 3], "small": np.ones(4)}
        placed, written = sharing.place(0, ours, value)
        assert isinstance(placed["image"], SharedArray) and isinstance(placed["steps"][0], SharedArray)
        assert placed["steps"][1] == 3 and isinstance(placed["small"], np.ndarray)
        assert len(written) == 2
        ours.send("call", placed)
        message = other.receive(reader)  # the ring's announcement is attached on the way
        restored = restore_shared(message[1], reader, "cpu")
        assert np.array_equal(restored["image"], image)
        assert isinstance(restored["steps"][0], torch.Tensor)
        assert torch.equal(restored["steps"][0], latent)
    finally:
        sharing.close()
        ours.close()
        other.close()


@pytest.mark.parametrize("world_size", RANK_COUNTS)
def test_large_inputs_reach_every_rank_through_shared_memory(runner_of, tmp_path, world_size):
    before = dev_shm_entries()
    runner = runner_of(world_size)
    for seed in range(3):
        image = frame(seed)
        answer = runner.generate({"frame": image, "small": np.ones(8, np.uint8)})
        # The all-reduce of every rank's sum: each rank saw the same bytes.
        assert answer["total"] == pytest.approx(world_size * float(image.sum()))
        assert answer["shared"] is True and answer["small_shared"] is False
    latent = torch.rand(128, 128, 4)
    answer = runner.generate({"frame": latent})
    assert answer["type"] == "Tensor" and answer["shared"] is True
    assert answer["total"] == pytest.approx(world_size * float(latent.double().sum()))
    # A rank writing into its view changes nothing the caller or another rank sees.
    image = frame(9)
    copy = image.copy()
    runner.generate({"frame": image, "scribble": True})
    assert np.array_equal(image, copy)
    runner.shutdown()
    for rank in range(world_size):
        lines = (tmp_path / f"rank-{rank}.log").read_text().splitlines()[1:]
        assert len(lines) == 5 and all("shared=True" in line for line in lines)
    # Anonymous memory: nothing left in /dev/shm.
    assert dev_shm_entries() <= before


def test_without_shared_memory_every_input_is_pickled(runner_of):
    runner = runner_of(2, shared_memory_bytes=0)
    image = frame(4)
    answer = runner.generate({"frame": image})
    assert answer["shared"] is False
    assert answer["total"] == pytest.approx(2 * float(image.sum()))


def test_a_rank_that_keeps_its_inputs_runs_out_of_slots_and_the_group_goes_on(runner_of):
    one_mib = (512, 512, 4)
    runner = runner_of(2, shared_memory_bytes=8 << 20)
    # Four slots of a ring of 1 MiB inputs; a second ring would pass 8 MiB.
    for seed in range(4):
        assert runner.generate({"frame": frame(seed, one_mib), "keep": True})["kept"] == seed + 1
    with pytest.raises(SharedSlotAllocationFailed, match="generate: rank 0: no shared slot free "
                       "for an input of 1048576 bytes: the rank still holds earlier inputs"):
        runner.generate({"frame": frame(5, one_mib)})
    # Nothing was sent: the group goes on, and once the ranks let their inputs go
    # (reset drops them), the slots come back.
    assert runner.healthy
    runner.reset()
    image = frame(6, one_mib)
    answer = runner.generate({"frame": image})
    assert answer["shared"] is True and answer["kept"] == 0
    assert answer["total"] == pytest.approx(2 * float(image.sum()))
    with pytest.raises(SharedSlotAllocationFailed, match="does not fit its shared memory"):
        runner.generate({"frame": np.zeros(4 << 20, np.uint8)})
    assert runner.healthy and runner.generate({"frame": image})["shared"] is True


def test_a_bad_shared_memory_size_is_refused() -> None:
    for bad in (-1, 1.5, True, "1G"):
        with pytest.raises(ValueError, match="shared_memory_bytes"):
            DistributedRunner(ArrayWorker, world_size=1, shared_memory_bytes=bad)
