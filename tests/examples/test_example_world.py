"""examples/world: the picture moves while a key is held and stands still when it is not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import connected
from paths import ROOT
from test_examples_run import Recorder as BaseRecorder

from reactor_serve.runtime.loading.manifest import load_manifest

WORLD = ROOT / "examples" / "world"

# Only a guard against a hang (the suite's default is shorter): these run a real model
# through many frames, which a loaded machine slows down many times over, and every
# wait inside has its own deadline.
pytestmark = pytest.mark.timeout(600)

# The example's own config (block_size 4) at a small size, so the test runs quickly.
WIDTH, HEIGHT = 160, 120


@pytest.fixture(autouse=True)
def _isolate_imports(isolated_imports):
    """Loading the model directory adds to sys.path and sys.modules; undo that."""


@pytest.fixture
def world(host_of):
    manifest = load_manifest(WORLD)
    assert manifest.name == "world"
    config = {**manifest.config, "width": WIDTH, "height": HEIGHT, "device": "cpu"}
    return host_of(manifest.load_class(), config, name=manifest.name)


def test_world_has_its_files():
    for filename in ("pipeline.py", "reactor.yaml", "config.yml", "README.md"):
        assert (WORLD / filename).is_file(), filename
    config = load_manifest(WORLD).config
    assert config["block_size"] == 4 and (config["width"], config["height"]) == (480, 360)
    readme = (WORLD / "README.md").read_text()
    assert "reactor run examples/world" in readme
    assert "reactor check examples/world" in readme
    for block_size in (1, 4, 12):  # the measured delay at each block size
        assert f"\n| {block_size} | " in readme


class Recorder(BaseRecorder):
    async def pictures(self, count: int) -> list[np.ndarray]:
        """The pictures of the next `count` new frames from now."""
        return [f.image for f in await self.more(count, timeout=60.0)]

    async def settle(self, still: int, within: int) -> tuple[np.ndarray, int]:
        """Wait until `still` new frames in a row show one picture (at most `within`
        new frames from now). Returns that picture and how many frames came before
        the still run (frames that were still changing)."""
        start = len(self.frames)
        run = 0
        index = start
        while True:
            await self.until(index + 1, timeout=60.0)
            frames = self.frames
            same = index > start and np.array_equal(frames[index].image, frames[index - 1].image)
            run = run + 1 if same else 1
            if run >= still:
                return frames[index].image, index - start - run + 1
            index += 1
            if index - start > within:
                raise AssertionError(f"the picture was still changing after {within} frames")

    async def change_from(self, picture: np.ndarray, within: int) -> int:
        """How many new frames from now until one differs from `picture`."""
        start = len(self.frames)
        for index in range(start, start + within):
            await self.until(index + 1, timeout=60.0)
            if not np.array_equal(self.frames[index].image, picture):
                return index - start
        raise AssertionError(f"the picture did not change within {within} frames")


def progress_steps(client) -> list[int]:
    return [
        m["data"]["data"]["step"]
        for m in client.messages
        if m.get("scope") == "application" and m["data"].get("type") == "progress"
    ]


def differs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


async def test_world_moves_while_a_key_is_held(world):
    assert world.spec.name == "world"
    assert sorted(world.spec.commands) == ["key_down", "key_up", "reset", "set_seed"]
    block = world.config["block_size"]
    assert block == 4
    # Frames queued ahead of the one on screen: about one block and a frame, more when
    # the runtime widens its cushion on a busy machine, never more than the buffer.
    queued = world.spec.buffer_size + block
    still = 2 * block + 4  # frames in a row showing one picture: the world stands still

    async with connected(world) as client:
        recorder = Recorder(client)

        # A real picture: sky above, terrain below, at the configured size.
        first = (await recorder.pictures(1))[0]
        assert first.shape == (HEIGHT, WIDTH, 3) and first.dtype == np.uint8
        assert first.mean() > 40 and first.std() > 10
        sky, ground = first[:5].reshape(-1, 3).mean(0), first[-5:].reshape(-1, 3).mean(0)
        assert sky[2] > sky[0] + 30  # blue at the top
        assert np.abs(sky - ground).mean() > 20

        # No keys: the world stands still, frame after frame.
        for picture in await recorder.pictures(3 * block):
            assert np.array_equal(picture, first)

        # Keys that are not controls are ignored, not rejected.
        mark = len(client.messages)
        client.send_command("key_down", {"key": "x"})
        client.send_command("key_down", {"key": "f5"})
        for picture in await recorder.pictures(still):
            assert np.array_equal(picture, first)
        assert not any(m["data"].get("type") == "commandError" for m in client.messages[mark:])

        # Holding "w" walks forward: every frame differs from the one before.
        client.send_command("key_down", {"key": "w"})
        await recorder.change_from(first, within=queued)
        walking = await recorder.pictures(2 * block)
        for a, b in itertools.pairwise(walking):
            assert differs(a, b) > 0.5

        # Released: the frames already made play out, then the picture stops changing.
        client.send_command("key_up", {"key": "w"})
        client.send_command("key_up", {"key": "x"})
        walked, changing = await recorder.settle(still, within=queued + still)
        assert changing >= 1  # the frames made while the key was down still move
        for picture in await recorder.pictures(2 * still):
            assert np.array_equal(picture, walked)
        assert differs(walked, first) > 5

        # Turning changes the picture too.
        client.send_command("key_down", {"key": "arrowleft"})
        await recorder.change_from(walked, within=queued)
        client.send_command("key_up", {"key": "arrowleft"})
        turned, _ = await recorder.settle(still, within=queued + still)
        assert differs(turned, walked) > 5

        # reset: back where the session started, to the very same picture.
        client.send_command("reset")
        await recorder.change_from(turned, within=queued)
        picture, _ = await recorder.settle(still, within=queued + still)
        assert np.array_equal(picture, first)

        # set_seed: another world; the same seed is the same world again.
        mark = len(client.messages)
        client.send_command("set_seed", {"seed": -1})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["command"] == "set_seed"
        assert error["data"]["errors"][0]["field"] == "seed"
        client.send_command("set_seed", {"seed": 7})
        await recorder.change_from(first, within=queued)
        other, _ = await recorder.settle(still, within=queued + still)
        assert differs(other, first) > 10
        client.send_command("set_seed", {"seed": 0})
        await recorder.change_from(other, within=queued)
        picture, _ = await recorder.settle(still, within=queued + still)
        assert np.array_equal(picture, first)

        # Progress after every block: the world's step count, a block further each time.
        await client.next_message("progress", timeout=60)
        steps = progress_steps(client)
        assert len(steps) >= 10
        assert steps == [block * (i + 1) for i in range(len(steps))]
        last = client.messages[-1]["data"]
        assert last["type"] == "progress" and last["data"]["block_size"] == block

        # Leave with a key held, in another world.
        client.send_command("set_seed", {"seed": 3})
        client.send_command("key_down", {"key": "d"})
        await recorder.change_from(first, within=queued)

    # @disconnected let go of the keys; @connected starts the next client afresh.
    async with connected(world) as client:
        recorder = Recorder(client)
        for picture in await recorder.pictures(still):
            assert np.array_equal(picture, first)
        steps = progress_steps(client)
        assert steps and steps[0] == block
    assert world.model_errors == 0
