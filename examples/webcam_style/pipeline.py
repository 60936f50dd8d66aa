# The input-tracks page's full video-to-video example, with the style model it leaves
# to the author (`load_style_model`) written out as real filters in torch: the same
# code runs on the CPU or, when one is there, on a CUDA GPU. Several sessions share one
# loaded model (config.yml's sessions_per_replica), and `step` styles the camera frames
# of all of them that are ready in one batched pass, where the page's `run()` styles
# one session's frame at a time.
import asyncio
import io
from dataclasses import dataclass

import av
import numpy as np
import torch
import torch.nn.functional as F

from reactor_runtime.interface import (
    Input,
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    UploadedFile,
    Video,
    batched,
    connected,
    disconnected,
    event,
)

STYLES = ["none", "oil_paint", "sketch", "thermal", "palette"]


@dataclass
class PaletteSet(ModelMessage):
    """The uploaded image was read: the `palette` style now tints with its colour."""
    name: str
    width: int
    height: int
    colour: list[int]   # its average RGB, 0..255


@dataclass
class PaletteRefused(ModelMessage):
    """The uploaded file is not an image this model can read; the palette is unchanged."""
    name: str
    reason: str


@dataclass
class V2VInput(Input):
    camera: Video

@dataclass
class V2VOutput(Output):
    main_video: Video

class V2VModel(ReactorModel):
    input: V2VInput
    fps = 30

    def load(self, config):
        device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        self.pipe = load_style_model(device)

    @connected
    async def on_connect(self):
        # Per session: assigned here, so each session has its own (the pipe is shared).
        self.input.camera.reset()
        self.style = "none"
        self.strength = 1.0
        self.palette = self.pipe.neutral

    @disconnected
    async def on_disconnect(self):
        self.input.camera.close()
        self.output_buffer.flush()

    @event(name="set_style", description="Change the style filter")
    def set_style(self, style: str = InputField(
        default="none", choices=STYLES
    )):
        self.style = style

    @event(name="set_strength", description="Blend between the camera (0) and the style (1)")
    def set_strength(self, strength: float = InputField(default=1.0, ge=0.0, le=1.0)):
        self.strength = strength

    @event(name="set_palette",
           description="Tint with the average colour of an uploaded image (PNG, JPEG...)")
    async def set_palette(self, image: UploadedFile):
        try:
            # Decoding a large image takes a while: not on the model's loop.
            width, height, colour = await asyncio.to_thread(average_colour, image.data)
        except ValueError as exc:
            await self.send(PaletteRefused(name=image.name, reason=str(exc)))
            return
        self.palette = torch.tensor(colour, device=self.pipe.device) / 255.0
        self.style = "palette"
        await self.send(PaletteSet(name=image.name, width=width, height=height, colour=colour))

    @batched(max_size=8)
    def step(self, steps):
        """The next frame of every session whose camera sent one: sessions with the
        same style and frame size go through the filters as one batch."""
        outputs = [None] * len(steps)
        groups = {}
        for index, step in enumerate(steps):
            session = step.model
            frames = session.input.camera.try_read(1)
            if frames is None:
                continue  # no new camera frame: no new frame for this session yet
            [frame] = frames
            groups.setdefault((session.style, frame.shape), []).append((index, session, frame))
        for (style, _), members in groups.items():
            styled = self.pipe.apply_batch(
                np.stack([frame for _, _, frame in members]), style=style,
                strengths=[session.strength for _, session, _ in members],
                palettes=[session.palette for _, session, _ in members],
            )
            for (index, _, _), result in zip(members, styled):
                outputs[index] = V2VOutput(main_video=result)
        return outputs


# --------------------------------------------------------------------------- filters


def load_style_model(device):
    """The style filters, ready on `device`. A real model would load its checkpoint here."""
    return StylePipe(torch.device(device))


class StylePipe:
    """Image filters on (B, H, W, 3) float tensors in [0, 1], with small fixed kernels.

    Convolutions see the frames as a (B, 3, H, W) view of the same memory, which is
    channels-last: the layout oneDNN's CPU kernels (and cuDNN) handle fastest.
    """

    LEVELS = 6  # colours per channel after posterizing

    def __init__(self, device):
        self.device = device
        # BT.601 luma weights: (H, W, 3) @ (3,) -> (H, W).
        self.luma = torch.tensor([0.299, 0.587, 0.114], device=device)
        # Sobel kernels for d/dx and d/dy, each merged with a 3x3 binomial blur so that
        # camera noise does not draw lines: two 5x5 kernels, one convolution.
        sobel_x = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
        smooth = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16.0
        sobel = torch.stack([sobel_x, sobel_x.t()]).unsqueeze(1)            # (2, 1, 3, 3)
        sobel = F.conv2d(sobel, smooth.flip(0, 1).view(1, 1, 3, 3), padding=2)  # full convolution
        self.sobel = sobel.to(device)                                       # (2, 1, 5, 5)
        # A 5x5 binomial blur, one kernel per colour channel (a depthwise convolution).
        taps = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        kernel = torch.outer(taps, taps) / 256.0
        self.blur5 = kernel.expand(3, 1, 5, 5).contiguous().to(device)
        self.thermal_lut = thermal_colormap(256).to(device)  # (256, 3) float in [0, 1]
        # The `palette` style's colour (RGB in [0, 1]) a session starts with: white, a
        # plain grayscale, until it uploads an image.
        self.neutral = torch.ones(3, device=device)

    def apply(self, frame, style="none", strength=1.0, palette=None):
        """`frame` (H, W, 3) uint8 RGB -> a new (H, W, 3) uint8 RGB numpy array."""
        palette = self.neutral if palette is None else palette
        return self.apply_batch(frame[None], style, [strength], [palette])[0]

    @torch.inference_mode()
    def apply_batch(self, frames, style, strengths, palettes):
        """`frames` (B, H, W, 3) uint8 RGB, one style, a strength and a palette colour
        per frame -> a new (B, H, W, 3) uint8 RGB numpy array."""
        if style == "none":
            return frames.copy()
        rgb = torch.from_numpy(frames).to(self.device).float().mul_(1.0 / 255.0)
        if style == "oil_paint":
            styled = self.oil_paint(rgb)
        elif style == "sketch":
            styled = self.sketch(rgb)
        elif style == "thermal":
            styled = self.thermal(rgb)
        elif style == "palette":
            colours = torch.stack(list(palettes)).to(self.device)[:, None, None, :]
            styled = self.gray(rgb).unsqueeze(-1) * colours
        else:
            raise ValueError(f"unknown style {style!r}")
        strength = torch.tensor(strengths, device=self.device, dtype=rgb.dtype)
        if bool((strength < 1.0).any()):
            styled = torch.lerp(rgb, styled, strength[:, None, None, None])
        out = styled.mul(255.0).add_(0.5).clamp_(0, 255).to(torch.uint8)
        return out.cpu().numpy()

    def gray(self, rgb):
        return rgb @ self.luma  # (B, H, W)

    def oil_paint(self, rgb):
        """Smooth away fine texture, then posterize into flat patches of few colours.

        The smoothing runs at half resolution (a quarter of the work) and is scaled
        back up; posterizing at full resolution keeps the patch edges crisp.
        """
        x = rgb.permute(0, 3, 1, 2)                                 # (B, 3, H, W) view
        small = F.avg_pool2d(x, 2, ceil_mode=True)
        small = F.conv2d(F.pad(small, (2, 2, 2, 2), mode="replicate"), self.blur5, groups=3)
        smooth = F.interpolate(small, size=x.shape[-2:], mode="bilinear", align_corners=False)
        levels = self.LEVELS - 1
        return smooth.permute(0, 2, 3, 1).mul(levels).round_().div_(levels)

    def sketch(self, rgb):
        """Dark pencil lines where the luminance changes, on white paper (grayscale)."""
        g = F.pad(self.gray(rgb)[:, None], (2, 2, 2, 2), mode="replicate")
        grad = F.conv2d(g, self.sobel)                              # (B, 2, H, W)
        edges = torch.hypot(grad[:, 0], grad[:, 1])
        # Faint gradients stay paper-white; stronger ones darken to full black.
        paper = 1.0 - edges.sub_(0.05).mul_(3.0).clamp_(0.0, 1.0)
        return paper.unsqueeze(-1).expand(-1, -1, -1, 3)

    def thermal(self, rgb):
        """Luminance through a black-purple-red-yellow-white colour map."""
        index = self.gray(rgb).mul_(255.0).round_().clamp_(0, 255).long()  # (B, H, W)
        return self.thermal_lut[index]                              # (B, H, W, 3)


def thermal_colormap(n):
    """An (n, 3) colour map from black through purple, red and yellow to white."""
    stops = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    colours = np.array([
        [0.00, 0.00, 0.05],   # black
        [0.35, 0.05, 0.55],   # purple
        [0.85, 0.15, 0.20],   # red
        [1.00, 0.75, 0.10],   # yellow
        [1.00, 1.00, 0.95],   # white
    ])
    t = np.linspace(0.0, 1.0, n)
    lut = np.stack([np.interp(t, stops, colours[:, c]) for c in range(3)], axis=1)
    return torch.from_numpy(lut.astype(np.float32))


def average_colour(data):
    """(width, height, [r, g, b]) of the first picture in an image file's bytes."""
    try:
        with av.open(io.BytesIO(data)) as container:
            frame = next(container.decode(video=0))
    except (av.error.FFmpegError, StopIteration, IndexError) as exc:
        raise ValueError(f"not an image this model can read ({type(exc).__name__})") from None
    pixels = frame.to_ndarray(format="rgb24").reshape(-1, 3)
    colour = [int(round(c)) for c in pixels.mean(axis=0)]
    return frame.width, frame.height, colour
