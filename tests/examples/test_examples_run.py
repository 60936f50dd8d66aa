"""The example models in examples/ load, run in-process, and do what they exist to show."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from conftest import connected
from images import png_of
from paths import ROOT

from reactor_serve.interface import UploadedFile
from reactor_serve.runtime.local_client import LocalClient, ReceivedFrame
from reactor_serve.scaffold import init_model

EXAMPLES = ROOT / "examples"

# Only a guard against a hang (the suite's default is shorter): these run a real model
# through many frames, which a loaded machine slows down many times over, and every
# wait inside has its own deadline.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _isolate_imports(isolated_imports):
    """Every test here loads model directories; undo what that adds."""


class Recorder:
    """Keeps every new frame the client is shown, so none is missed between awaits."""

    def __init__(self, client: LocalClient) -> None:
        self.client = client
        self.frames: list[ReceivedFrame] = []
        client.on_frame = self._on_frame

    def _on_frame(self, frame: ReceivedFrame) -> None:
        if frame.is_new:
            self.frames.append(frame)

    async def until(self, count: int, timeout: float = 60.0) -> list[ReceivedFrame]:
        """Wait until `count` new frames have been recorded in all; return them all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.frames) < count:
            if loop.time() > deadline:
                raise TimeoutError(f"only {len(self.frames)} of {count} new frames arrived")
            await self.client.next_frame(new=False, timeout=timeout)
        return self.frames

    async def more(self, count: int, timeout: float = 60.0) -> list[ReceivedFrame]:
        """The next `count` new frames from now."""
        start = len(self.frames)
        await self.until(start + count, timeout)
        return self.frames[start : start + count]


def test_every_example_has_its_files():
    for name, module in [
        ("gradient", "pipeline.py"),
        ("webcam_style", "pipeline.py"),
        ("audio_tone", "pipeline.py"),
        ("legacy_blocks", "model.py"),
        ("world", "pipeline.py"),
    ]:
        directory = EXAMPLES / name
        for filename in (module, "reactor.yaml", "config.yml", "README.md"):
            assert (directory / filename).is_file(), directory / filename
        readme = (directory / "README.md").read_text()
        assert f"reactor check examples/{name}" in readme


# --------------------------------------------------------------------------- gradient


def test_gradient_is_what_reactor_init_writes(tmp_path: Path):
    init_model(tmp_path / "gradient")
    for filename in ("pipeline.py", "reactor.yaml", "config.yml"):
        generated = (tmp_path / "gradient" / filename).read_text()
        assert (EXAMPLES / "gradient" / filename).read_text() == generated, filename


async def test_gradient_animates_and_brightness_darkens_it(host_of):
    host = host_of(EXAMPLES / "gradient")
    assert host.spec.name == "gradient"
    async with connected(host) as client:
        frames = await Recorder(client).until(6)
        images = [f.image for f in frames]
        assert images[0].shape == (480, 640, 3) and images[0].dtype == np.uint8
        assert not np.array_equal(images[0], images[-1])  # it scrolls
        bright = np.mean([im.mean() for im in images])
        assert bright > 60

        client.send_command("set_brightness", {"brightness": 0.3})
        # Frames made before the command are still queued; later ones are darker.
        for _ in range(60):
            frame = await client.next_frame(timeout=60)
            if frame.image.mean() < bright * 0.5:
                break
        else:
            pytest.fail(f"frames never got darker than {bright * 0.5:.1f} after set_brightness 0.3")

        mark = len(client.messages)
        client.send_command("set_brightness", {"brightness": 3.0})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["field"] == "brightness"
    assert host.model_errors == 0


# --------------------------------------------------------------------------- webcam_style


def camera_picture(height: int = 120, width: int = 160) -> np.ndarray:
    """A colour gradient with a checkerboard over it: edges, flat areas and colour."""
    y, x = np.mgrid[0:height, 0:width]
    picture = np.empty((height, width, 3), np.float64)
    picture[..., 0] = 60 + 190 * x / (width - 1)
    picture[..., 1] = 60 + 190 * y / (height - 1)
    picture[..., 2] = 160
    checker = ((x // 20 + y // 20) % 2).astype(bool)
    picture *= np.where(checker, 1.0, 0.4)[..., None]
    return picture.round().astype(np.uint8)


async def applied(client: LocalClient, timeout: float = 60.0, **values: object) -> None:
    """Wait until the session's model holds these values (its handlers have run)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    model = client.host.model
    while any(getattr(model, name, None) != value for name, value in values.items()):
        assert loop.time() < deadline, f"the handlers never applied {values}"
        await asyncio.sleep(0.005)  # the poll interval of a wait with a deadline


async def styled(client: LocalClient, picture: np.ndarray, **commands: object) -> np.ndarray:
    """Send the commands, then one camera frame; return the model's picture of it."""
    for name, value in commands.items():
        client.send_command(f"set_{name}", {name: value})
    # The handlers ran before the frame arrives: the session's model says so.
    await applied(client, **commands)
    client.send_frame("camera", picture)
    return (await client.next_frame(timeout=60)).image


async def test_webcam_style_filters_the_camera(host_of):
    host = host_of(EXAMPLES / "webcam_style")
    assert [t.name for t in host.spec.inputs] == ["camera"]
    assert host.spec.commands["set_style"].params[0].choices == (
        "none", "oil_paint", "sketch", "thermal", "palette",
    )
    picture = camera_picture()
    async with connected(host) as client:
        original = await styled(client, picture)
        assert np.array_equal(original, picture)  # style "none" by default

        outputs = {}
        for style in ("oil_paint", "sketch", "thermal"):
            out = await styled(client, picture, style=style)
            assert out.shape == picture.shape and out.dtype == np.uint8
            diff = np.abs(out.astype(int) - picture.astype(int)).mean()
            assert diff > 10, f"{style} barely changed the picture ({diff:.1f})"
            outputs[style] = out.astype(int)
        names = list(outputs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert np.abs(outputs[a] - outputs[b]).mean() > 10, f"{a} looks like {b}"

        # oil_paint: flat patches of few colours.
        assert len(np.unique(outputs["oil_paint"].reshape(-1, 3), axis=0)) <= 6**3
        # sketch: grayscale paper, mostly white, dark lines along the checker edges.
        sketch = outputs["sketch"]
        assert (sketch[..., 0] == sketch[..., 1]).all() and (sketch[..., 1] == sketch[..., 2]).all()
        assert np.median(sketch) > 200 and sketch.min() < 80
        # thermal: darker input, darker output.
        luma = picture @ np.array([0.299, 0.587, 0.114])
        heat = outputs["thermal"].sum(axis=-1)
        assert heat[luma < np.percentile(luma, 20)].mean() < heat[luma > np.percentile(luma, 80)].mean()

        # strength blends the style with the camera: 0 gives (nearly) the camera back.
        unstyled = await styled(client, picture, style="sketch", strength=0.0)
        assert np.abs(unstyled.astype(int) - picture.astype(int)).max() <= 1
        half = (await styled(client, picture, strength=0.5)).astype(int)
        expected = (picture.astype(int) + outputs["sketch"]) / 2
        assert np.abs(half - expected).max() <= 2

        mark = len(client.messages)
        client.send_command("set_style", {"style": "watercolor"})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["field"] == "style"
        client.send_command("set_strength", {"strength": 1.5})
        error = await client.next_message("commandError", after=mark + 1, timeout=60)
        assert error["data"]["errors"][0]["field"] == "strength"

        # set_palette reads an uploaded image: its average colour tints the luminance.
        client.send_command("set_strength", {"strength": 1.0})
        client.send_command("set_palette", {"image": UploadedFile(
            "orange.png", "image/png", png_of((200, 100, 0)))})
        read = await client.next_message("palette_set", scope="application", timeout=60)
        await applied(client, strength=1.0, style="palette")
        assert read["data"] == {"name": "orange.png", "width": 8, "height": 6,
                                "colour": [200, 100, 0]}
        tinted = (await styled(client, picture)).astype(int)
        expected = luma[..., None] * np.array([200, 100, 0]) / 255
        assert np.abs(tinted - expected).max() <= 2
        client.send_command("set_palette", {"image": UploadedFile("a.txt", "text/plain", b"hi")})
        refused = await client.next_message("palette_refused", scope="application", timeout=60)
        assert refused["data"]["name"] == "a.txt" and "not an image" in refused["data"]["reason"]

    # @disconnected closed the camera; @connected of the next session reopens it with
    # the default style.
    assert host.input_buffers["camera"].closed
    async with connected(host) as client:
        assert np.array_equal(await styled(client, picture), picture)
    assert host.model_errors == 0


# --------------------------------------------------------------------------- audio_tone


def peak_hz(samples: np.ndarray, rate: int = 48000) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum)) * rate / len(samples)


def audio_of(frames: list[ReceivedFrame]) -> np.ndarray:
    chunks = [f.audio["main_audio"] for f in frames]
    for chunk in chunks:
        assert chunk.dtype == np.int16 and chunk.shape == (1, 1600)  # 1/30 s at 48 kHz
    return np.concatenate(chunks, axis=1)[0].astype(np.float64)


def pitch_marker_x(image: np.ndarray) -> float:
    """The column of the bright pitch marker along the bottom edge."""
    row = image[image.shape[0] - 8]
    return float(np.flatnonzero(row.max(axis=-1) > 150).mean())


async def test_audio_tone_plays_the_frequency_it_is_set_to(host_of):
    host = host_of(EXAMPLES / "audio_tone")
    assert [(t.name, t.kind) for t in host.spec.outputs] == [
        ("main_video", "video"), ("main_audio", "audio"),
    ]
    async with connected(host) as client:
        recorder = Recorder(client)
        await recorder.until(6)  # the tone fades in over the first emit
        second = await recorder.more(30)  # one second of frames
        assert all(f.image.shape == (480, 640, 3) for f in second)
        assert all(b.frame.seq == a.frame.seq + 1 for a, b in zip(second, second[1:]))
        tone = audio_of(second)
        assert abs(peak_hz(tone) - 440) <= 5
        # volume 0.5 by default; and one continuous sine across emits and frames: no
        # step between samples is larger than the tone's steepest slope allows.
        amplitude = np.abs(tone).max()
        assert 0.4 * 32767 < amplitude < 0.5 * 32767
        assert np.abs(np.diff(tone)).max() <= amplitude * 2 * np.pi * 440 / 48000 * 1.02 + 2
        marker_440 = pitch_marker_x(second[-1].image)

        client.send_command("set_frequency", {"frequency": 880})
        # Skip what was queued before the command, then take another second.
        later = (await recorder.more(45))[15:]
        tone = audio_of(later)
        assert abs(peak_hz(tone) - 880) <= 5
        amplitude = np.abs(tone).max()
        assert np.abs(np.diff(tone)).max() <= amplitude * 2 * np.pi * 880 / 48000 * 1.02 + 2
        assert pitch_marker_x(later[-1].image) > marker_440 + 50

        client.send_command("set_volume", {"volume": 0.1})
        quiet = audio_of((await recorder.more(30))[15:])
        assert 0.07 * 32767 < np.abs(quiet).max() < 0.1 * 32767

        mark = len(client.messages)
        client.send_command("set_frequency", {"frequency": 5000})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["field"] == "frequency"
    assert host.model_errors == 0


# --------------------------------------------------------------------------- legacy_blocks


async def first_animation_frame(host, prompt: str) -> np.ndarray:
    """One session: black until `prompt` is sent, then the animation's first frame."""
    async with connected(host) as client:
        recorder = Recorder(client)
        await client.next_frame(new=False, timeout=60)
        client.send_command("set_prompt", {"prompt": prompt})
        while True:
            frames = await recorder.until(len(recorder.frames) + 1)
            lit = [f.image for f in frames if f.image.max() > 0]
            if lit:
                return lit[0].copy()


async def test_legacy_blocks_waits_for_a_prompt_then_animates(host_of):
    host = host_of(EXAMPLES / "legacy_blocks")
    assert host.spec.kind == "legacy" and host.spec.name == "legacy-blocks"
    assert host.config["block_size"] == 8
    model = host.model
    async with connected(host) as client:
        recorder = Recorder(client)
        # emit_block(None), then nothing until a prompt: black.
        for _ in range(5):
            frame = await client.next_frame(new=False, timeout=60)
            assert frame.image.shape == (480, 640, 3) and frame.image.max() == 0
        assert all(f.image.max() == 0 for f in recorder.frames)

        mark = len(client.messages)
        client.send_command("set_prompt", {"prompt": ""})
        error = await client.next_message("commandError", after=mark, timeout=60)
        assert error["data"]["errors"][0]["rule"] == "min_length=1"
        client.send_command("set_prompt", {"prompt": "x" * 201})
        error = await client.next_message("commandError", after=mark + 1, timeout=60)
        assert error["data"]["errors"][0]["rule"] == "max_length=200"

        client.send_command("set_prompt", {"prompt": "a forest at dawn"})
        frames = [f.image for f in await recorder.more(12) if f.image.max() > 0]
        assert len(frames) >= 10
        for a, b in zip(frames, frames[1:]):
            assert np.abs(a.astype(int) - b.astype(int)).mean() > 0.5  # it moves
        first = await client.next_message("progress", after=mark, timeout=60)
        assert first["data"]["frames_generated"] % 8 == 0
        progress = [m["data"]["data"]["frames_generated"] for m in client.messages
                    if m.get("data", {}).get("type") == "progress"]
        assert progress == sorted(progress) and len(set(progress)) == len(progress)
    # should_stop() ended start_session(); its finally reset the per-session state.
    assert model.prompt is None and model.frame_index == 0
    assert client.end_reason == "client_closed"

    # The prompt seeds the animation: another prompt, another picture; the same
    # prompt in a new session starts the same animation from its beginning.
    forest = await first_animation_frame(host, "a forest at dawn")
    sea = await first_animation_frame(host, "the open sea")
    again = await first_animation_frame(host, "a forest at dawn")
    assert np.abs(forest.astype(int) - sea.astype(int)).mean() > 10
    assert np.array_equal(forest, again)
    assert host.model_errors == 0


async def test_webcam_style_sessions_share_the_filters_and_keep_their_own_styles(host_of):
    host = host_of(EXAMPLES / "webcam_style", seats=2)
    picture = camera_picture()
    first, second = LocalClient(host.seats[0]), LocalClient(host.seats[1])
    await first.connect()
    await second.connect()
    try:
        first.send_command("set_style", {"style": "thermal"})
        second.send_command("set_style", {"style": "sketch"})
        await applied(first, style="thermal")
        await applied(second, style="sketch")
        for _ in range(5):  # both cameras at once: styled in one batched step
            waiting = [asyncio.create_task(c.next_frame(timeout=60)) for c in (first, second)]
            # One turn of the loop, not a span of time: both tasks are waiting
            # before either frame can come.
            await asyncio.sleep(0)
            first.send_frame("camera", picture)
            second.send_frame("camera", picture)
            thermal, sketch = [frame.image for frame in await asyncio.gather(*waiting)]
        assert (sketch[..., 0] == sketch[..., 1]).all()        # sketch is grayscale
        assert not (thermal[..., 0] == thermal[..., 2]).all()  # thermal is in colour
        totals = host.batch_totals
        assert totals.steps >= 10 and totals.batches < totals.steps
    finally:
        await first.close()
        await second.close()


async def test_webcam_style_one_sessions_palette_never_tints_another(host_of):
    host = host_of(EXAMPLES / "webcam_style", seats=2)
    picture = camera_picture()
    uploader, other = LocalClient(host.seats[0]), LocalClient(host.seats[1])
    await uploader.connect()
    await other.connect()
    try:
        uploader.send_command("set_palette", {"image": UploadedFile(
            "orange.png", "image/png", png_of((200, 100, 0)))})
        await uploader.next_message("palette_set", scope="application", timeout=60)
        other.send_command("set_style", {"style": "palette"})
        await applied(other, style="palette")
        # The other session's palette is still plain white: a grayscale picture.
        plain = (await styled(other, picture)).astype(int)
        assert (plain[..., 0] == plain[..., 2]).all()
        tinted = (await styled(uploader, picture)).astype(int)
        assert (tinted[..., 0] > tinted[..., 2]).mean() > 0.9
    finally:
        await uploader.close()
        await other.close()
