# An action-conditioned world model in the shape of the real ones, with no learned
# weights: a latent world state (a camera over a seeded, endless height-field terrain)
# that the player's held keys advance one step per frame, rendered in blocks of
# `block_size` frames by one batched torch computation (a raycast of the height field,
# the "Voxel Space" technique: every screen column is a ray marched across the map).
#
# Keys come in as `key_down` / `key_up` events; a block is generated from the keys held
# when it starts, so a key pressed mid-block shows in the next block. That is the
# block-size trade-off the README measures: larger blocks keep more frames queued
# against a slow block and pay the per-block costs less often; smaller blocks react
# sooner.
import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from reactor_runtime.interface import (
    InputField,
    ModelMessage,
    Output,
    ReactorModel,
    Video,
    connected,
    disconnected,
    event,
)

# What each key does while held: (forward, strafe right, turn right, climb) per frame.
KEYS = {
    "w": (1, 0, 0, 0), "arrowup": (1, 0, 0, 0),
    "s": (-1, 0, 0, 0), "arrowdown": (-1, 0, 0, 0),
    "d": (0, 1, 0, 0), "a": (0, -1, 0, 0),
    "e": (0, 0, 1, 0), "arrowright": (0, 0, 1, 0),
    "q": (0, 0, -1, 0), "arrowleft": (0, 0, -1, 0),
    "space": (0, 0, 0, 1), "shift": (0, 0, 0, -1),
}

MOVE_PER_FRAME = 1.2              # map texels per frame (about 29 per second at 24 fps)
TURN_PER_FRAME = math.radians(2.5)  # 60 degrees per second at 24 fps
CLIMB_PER_FRAME = 1.0             # height units per frame
EYE_HEIGHT = 14.0                 # above the (smoothed) ground or water
MAX_CLIMB = 120.0                 # how far above EYE_HEIGHT space can take you


@dataclass
class WorldOutput(Output):
    main_video: Video


@dataclass
class Progress(ModelMessage):
    """Sent after each block: how far the world has stepped, and where the camera is."""
    step: int           # frames (world steps) generated since the client connected
    block_size: int
    x: float
    y: float
    heading_deg: float
    keys: list[str]     # the keys held while the block was made


class WorldModel(ReactorModel):
    fps = 24
    buffer_size = 32  # room for two blocks and a frame at the largest block size the README measures (12)

    def load(self, config):
        self.block_size = int(config.get("block_size", 4))
        if not 1 <= self.block_size <= self.buffer_size:
            raise ValueError(f"block_size must be 1..{self.buffer_size}, got {self.block_size}")
        self.width = int(config.get("width", 480))
        self.height = int(config.get("height", 360))
        device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        self.renderer = Renderer(self.width, self.height, torch.device(device))
        self.seed = 0
        self.terrain = Terrain(self.seed, self.renderer.device)
        self.held = set()
        self.camera = Camera.start()
        self.step = 0

    @connected
    async def on_connect(self):
        # Every client starts in the same place in the default world.
        self.held = set()
        self.step = 0
        self.camera = Camera.start()
        if self.seed != 0:
            self.seed = 0
            self.terrain = Terrain(0, self.renderer.device)

    @disconnected
    async def on_disconnect(self):
        self.held = set()
        self.output_buffer.flush()

    @event(name="key_down", description="A key was pressed (KeyboardEvent.key, lower case)")
    def key_down(self, key: str = InputField(min_length=1, max_length=32, description="Key name")):
        key = key.lower()
        if key in KEYS:  # other keys are not controls here: ignore them
            self.held.add(key)

    @event(name="key_up", description="A key was released")
    def key_up(self, key: str = InputField(min_length=1, max_length=32, description="Key name")):
        self.held.discard(key.lower())

    @event(name="reset", description="Put the camera back where it started")
    def reset(self):
        self.camera = Camera.start()

    @event(name="set_seed", description="Generate a new world from this seed")
    def set_seed(self, seed: int = InputField(default=0, ge=0, le=2**31 - 1, description="World seed")):
        self.seed = seed
        self.terrain = Terrain(seed, self.renderer.device)
        self.camera = Camera.start()

    async def run(self):
        n = self.block_size
        period = n / self.fps  # seconds of video per block
        while True:
            await self.connected.wait()
            deadline = None
            while self.connected.is_set():
                # Snapshot: event handlers may change these at any await below.
                held, terrain, camera = frozenset(self.held), self.terrain, self.camera
                t0 = time.perf_counter()
                cameras = []
                for _ in range(n):  # one world step per frame, all under the same keys
                    camera = camera.advance(held, terrain)
                    cameras.append(camera)
                frames = self.renderer.render(terrain, cameras)
                compute_time = time.perf_counter() - t0
                self.camera = camera
                self.step += n
                await self.emit(WorldOutput(main_video=frames), compute_time=compute_time)
                await self.send(Progress(
                    step=self.step, block_size=n, x=round(camera.x, 2), y=round(camera.y, 2),
                    heading_deg=round(math.degrees(camera.heading), 1), keys=sorted(held),
                ))
                # Make each block while the one before it plays, as a model that
                # generates in real time must, and no earlier: this renderer is faster
                # than real time, and frames queued from old keys are input delay. The
                # next block starts when this one starts playing (a frame early, so
                # that it is there in time); a model slower than real time never waits.
                now = time.monotonic()
                if deadline is None:  # the first block: the second starts at once
                    deadline = now - 1 / self.fps
                else:
                    deadline += period
                    if now - deadline > period:  # far behind (a stall): start over
                        deadline = now - 1 / self.fps
                # Always yield here, even when late: key events are handled at this
                # await (an emit that finds room in the buffer does not yield).
                await asyncio.sleep(max(0.0, deadline - now))


# --------------------------------------------------------------------------- world state


@dataclass(frozen=True)
class Camera:
    """Where the player is: map position (texels), heading (radians, 0 = +y), height
    climbed above the eye height."""

    x: float
    y: float
    heading: float
    climb: float

    @staticmethod
    def start():
        return Camera(x=256.0, y=256.0, heading=0.0, climb=0.0)

    def advance(self, held, terrain):
        forward = right = turn = climb = 0
        for key in held:
            f, r, t, c = KEYS[key]
            forward, right, turn, climb = forward + f, right + r, turn + t, climb + c
        forward, right, turn, climb = (max(-1, min(1, v)) for v in (forward, right, turn, climb))
        heading = self.heading + turn * TURN_PER_FRAME
        sin, cos = math.sin(heading), math.cos(heading)
        x = self.x + MOVE_PER_FRAME * (forward * sin + right * cos)
        y = self.y + MOVE_PER_FRAME * (forward * cos - right * sin)
        climb = max(0.0, min(MAX_CLIMB, self.climb + climb * CLIMB_PER_FRAME))
        size = terrain.size
        return Camera(x % size, y % size, heading % (2 * math.pi), climb)

    def altitude(self, terrain):
        return terrain.ground(self.x, self.y) + EYE_HEIGHT + self.climb


# --------------------------------------------------------------------------- terrain


class Terrain:
    """A seeded, tileable height field with its colours, on `device`.

    Heights come from spectral synthesis (white noise filtered to a 1/f^beta power
    spectrum with an FFT: periodic, so the world wraps around without a seam), shaped
    into valleys, hills and peaks; colours from height and slope, lit by a low sun.
    Made on the CPU from the seed, so a seed is the same world on every device.
    """

    SIZE = 512           # texels along each side; the world repeats after that
    HEIGHT_SCALE = 80.0   # height units at the highest point
    WATER = 0.165        # water level, as a fraction of HEIGHT_SCALE
    SUN = (0.55, 0.62, 0.56)  # direction towards the sun (x, y, up), normalised below

    def __init__(self, seed, device):
        self.seed = seed
        self.size = size = self.SIZE
        gen = torch.Generator().manual_seed(int(seed))
        h = fractal_noise(size, 3.4, gen)
        detail = fractal_noise(size, 1.2, gen)  # fine texture for the colours
        # Flat-ish lowlands, steep peaks.
        h = (h - h.min()) / (h.max() - h.min())
        h = h.pow(1.7)
        height = h * self.HEIGHT_SCALE
        water = self.WATER * self.HEIGHT_SCALE
        surface = torch.maximum(height, torch.tensor(water))
        rgb = colour_terrain(height, surface, water, detail, self.SUN)
        # Texture: surface height and colour, with one wrapped row and column so that
        # bilinear sampling across the seam reads the other side of the map.
        tex = torch.cat([surface[None], rgb.permute(2, 0, 1)], 0)          # (4, S, S)
        tex = torch.cat([tex, tex[:, :1]], 1)
        tex = torch.cat([tex, tex[:, :, :1]], 2)                            # (4, S+1, S+1)
        self.texture = tex[None].contiguous().to(device)
        # The camera rides over a smoothed copy of the ground (no bumps), read on the host.
        smooth = blur_periodic(surface, 12.0)
        self._ground = np.concatenate(
            [smooth.numpy(), smooth[:1].numpy()], 0).astype(np.float64)
        self._ground = np.concatenate([self._ground, self._ground[:, :1]], 1)

    def ground(self, x, y):
        """Smoothed ground (or water) height under map point (x, y), bilinear."""
        x, y = x % self.size, y % self.size
        i, j = min(int(y), self.size - 1), min(int(x), self.size - 1)
        fy, fx = y - i, x - j
        g = self._ground
        top = g[i, j] * (1 - fx) + g[i, j + 1] * fx
        bottom = g[i + 1, j] * (1 - fx) + g[i + 1, j + 1] * fx
        return float(top * (1 - fy) + bottom * fy)


def fractal_noise(size, beta, gen):
    """(size, size) periodic noise with power spectrum 1/f^beta, zero mean, unit std."""
    white = torch.randn(size, size, generator=gen, dtype=torch.float64)
    f = torch.fft.fftfreq(size, dtype=torch.float64)
    radius = torch.sqrt(f[:, None] ** 2 + f[None, :] ** 2)
    radius[0, 0] = 1.0
    gain = radius.pow(-beta / 2)
    gain[0, 0] = 0.0
    noise = torch.fft.ifft2(torch.fft.fft2(white) * gain).real
    return ((noise - noise.mean()) / noise.std()).float()


def blur_periodic(image, sigma):
    """Gaussian blur of a (S, S) periodic image, through the FFT."""
    size = image.shape[0]
    f = torch.fft.fftfreq(size, dtype=torch.float64)
    gain = torch.exp(-2 * (math.pi * sigma) ** 2 * (f[:, None] ** 2 + f[None, :] ** 2))
    return torch.fft.ifft2(torch.fft.fft2(image.double()) * gain).real.float()


def smoothstep(lo, hi, x):
    t = ((x - lo) / (hi - lo)).clamp(0, 1)
    return t * t * (3 - 2 * t)


def colour_terrain(height, surface, water, detail, sun):
    """(S, S, 3) float colours in [0, 1]: water, sand, grass, forest, rock, snow."""
    top = float(height.max())
    u = height / top  # 0..1
    # Slope from the surface's periodic gradient (height units per texel).
    gx = (torch.roll(surface, -1, 1) - torch.roll(surface, 1, 1)) / 2
    gy = (torch.roll(surface, -1, 0) - torch.roll(surface, 1, 0)) / 2
    normal = torch.stack([-gx, -gy, torch.ones_like(gx)], -1)
    normal = normal / normal.norm(dim=-1, keepdim=True)
    slope = 1 - normal[..., 2]

    def c(*rgb):
        return torch.tensor(rgb, dtype=torch.float32) / 255.0

    w = water / top
    colour = c(196, 182, 130).expand_as(normal).clone()                     # sand
    colour = torch.lerp(colour, c(84, 132, 52), smoothstep(w + 0.01, w + 0.04, u)[..., None])
    colour = torch.lerp(colour, c(38, 84, 36), smoothstep(0.30, 0.42, u + 0.06 * detail)[..., None])
    colour = torch.lerp(colour, c(112, 102, 92), smoothstep(0.50, 0.62, u + 0.05 * detail)[..., None])
    colour = torch.lerp(colour, c(112, 102, 92), smoothstep(0.36, 0.56, slope)[..., None])
    colour = torch.lerp(colour, c(240, 242, 248), smoothstep(0.66, 0.74, u + 0.04 * detail - 0.5 * slope)[..., None])
    colour = colour * (1 + 0.08 * detail.clamp(-2, 2))[..., None]
    # Diffuse sunlight and a little sky light.
    sun = torch.tensor(sun, dtype=torch.float32)
    sun = sun / sun.norm()
    light = 0.35 + 0.8 * (normal @ sun).clamp(min=0)
    colour = colour * light[..., None]
    # Water: flat, darker with depth.
    depth = ((water - height) / (water + 1e-6)).clamp(0, 1)[..., None]
    sea = torch.lerp(c(62, 120, 150), c(18, 46, 92), depth.sqrt())
    colour = torch.where((height < water)[..., None], sea, colour)
    return colour.clamp(0, 1)


# --------------------------------------------------------------------------- renderer


class Renderer:
    """Raycasts blocks of frames of a `Terrain`, all frames at once, on one device.

    For each screen column a ray leaves the camera along the ground; the map is sampled
    at DEPTHS distances along it (closer together near the camera). Each sample projects
    to a screen row; a pixel shows the nearest sample at or above it (a running minimum
    of rows along the ray is the visible skyline), blended with the one before it, and
    fogged with distance. Rows above the skyline are sky.
    """

    DEPTHS = 256
    NEAR, FAR = 1.0, 420.0
    FOV = math.radians(75)   # horizontal
    HORIZON = 0.36           # horizon row, as a fraction of the height (looking down a little)
    FOG = 300.0              # distance at which fog is 1 - 1/e thick
    SUN_AZIMUTH = math.atan2(0.55, 0.62)  # the sun's heading, as in Terrain.SUN

    def __init__(self, width, height, device):
        self.width, self.height, self.device = width, height, device
        w, h, d = width, height, self.DEPTHS
        # Camera-space ray per column: sideways offset per unit of distance.
        self.focal = (w / 2) / math.tan(self.FOV / 2)
        self.u = (np.arange(w) + 0.5 - w / 2) / self.focal                     # (W,)
        z = self.NEAR * (self.FAR / self.NEAR) ** (np.arange(d) / (d - 1))     # (D,)
        self.z = torch.tensor(z, dtype=torch.float32, device=device)
        self.inv_z = torch.tensor(self.focal / z, dtype=torch.float32, device=device)
        fog = 1 - np.exp(-((z / self.FOG) ** 2))
        self.fog = torch.tensor(fog, dtype=torch.float32, device=device)       # (D,)
        self.horizon = self.HORIZON * h
        # Pixel-centre rows, negated (searchsorted wants ascending sequences).
        self.rows = -(torch.arange(h, dtype=torch.float32, device=device) + 0.5)
        # The sky's vertical gradient (H, 3), from the horizon colour up to deep blue.
        t = np.clip((self.horizon - (np.arange(h) + 0.5)) / self.horizon, 0, 1) ** 0.6
        low, high = np.array([0.78, 0.84, 0.90]), np.array([0.28, 0.46, 0.78])
        self.sky_rows = torch.tensor(low + (high - low) * t[:, None], dtype=torch.float32,
                                     device=device)
        # The sun's glow by row: a bump at the sun's elevation, fading below the horizon.
        elevation = self.horizon - self.focal * 0.35
        glow = np.exp(-(((np.arange(h) + 0.5) - elevation) / (0.5 * h)) ** 2)
        self.sun_rows = torch.tensor(glow, dtype=torch.float32, device=device)[:, None]
        self.sun_colour = torch.tensor([0.45, 0.32, 0.12], dtype=torch.float32, device=device)

    def columns(self, cameras, terrain):
        """Per-frame, per-column numbers, computed on the host in float64."""
        n, w = len(cameras), self.width
        dx, dy, sun = np.empty((n, w)), np.empty((n, w)), np.empty((n, w))
        origin, altitude = np.empty((n, 2)), np.empty(n)
        for i, cam in enumerate(cameras):
            sin, cos = math.sin(cam.heading), math.cos(cam.heading)
            # Forward is (sin, cos); right is (cos, -sin).
            dx[i] = sin + self.u * cos
            dy[i] = cos - self.u * sin
            origin[i] = cam.x, cam.y
            altitude[i] = cam.altitude(terrain)
            angle = cam.heading + np.arctan(self.u) - self.SUN_AZIMUTH
            angle = (angle + np.pi) % (2 * np.pi) - np.pi
            sun[i] = np.exp(-((angle / 0.35) ** 2))
        return dx, dy, origin, altitude, sun

    @torch.inference_mode()
    def render(self, terrain, cameras):
        """(N, H, W, 3) uint8 RGB numpy: one frame per camera."""
        dev, n, w, h, d = self.device, len(cameras), self.width, self.height, self.DEPTHS
        dx, dy, origin, altitude, sun = self.columns(cameras, terrain)
        size = float(terrain.size)

        def t(a):
            return torch.as_tensor(a, dtype=torch.float32).to(dev)

        dx, dy, origin, altitude, sun = t(dx), t(dy), t(origin), t(altitude), t(sun)
        # Sample points along every column's ray: (N, W, D) map coordinates, wrapped.
        px = torch.remainder(origin[:, 0, None, None] + dx[:, :, None] * self.z, size)
        py = torch.remainder(origin[:, 1, None, None] + dy[:, :, None] * self.z, size)
        grid = torch.stack([px, py], -1).mul_(2.0 / size).sub_(1.0)      # align_corners=True
        samples = F.grid_sample(terrain.texture, grid.view(1, n * w, d, 2), mode="bilinear",
                                padding_mode="border", align_corners=True)  # (1, 4, N*W, D)
        samples = samples.view(4, n, w, d)
        # Screen row of each sample; the running minimum is the skyline so far.
        row = (altitude[:, None, None] - samples[0]).mul_(self.inv_z).add_(self.horizon)
        skyline = torch.cummin(row, dim=-1).values.neg_()                  # ascending
        # Sky colour per frame, row and column; its horizon row is the fog colour.
        sky = self.sky_rows[None, :, None, :] + (
            self.sun_rows[None, :, :, None] * sun[:, None, :, None] * self.sun_colour)
        fog_colour = sky[:, min(h - 1, int(self.horizon))]                  # (N, W, 3)
        colour = samples[1:].permute(1, 2, 3, 0)                             # (N, W, D, 3)
        colour = torch.lerp(colour, fog_colour[:, :, None, :], self.fog[:, None])
        # The first sample whose skyline reaches up to each pixel row is what it shows.
        rows = self.rows.expand(n, w, h).contiguous()
        hit = torch.searchsorted(skyline, rows)                              # (N, W, H)
        near = hit.clamp(max=d - 1)
        before = (hit - 1).clamp(min=0)
        y_near = skyline.gather(-1, near)
        y_before = skyline.gather(-1, before)
        # Where between the two samples the row meets the ground: blend their colours.
        span = y_near - y_before
        frac = torch.where(span > 0, (rows - y_before) / span.clamp(min=1e-6),
                           torch.ones_like(span)).clamp_(0, 1)
        c_near = colour.gather(2, near[..., None].expand(n, w, h, 3))
        c_before = colour.gather(2, before[..., None].expand(n, w, h, 3))
        ground = torch.lerp(c_before, c_near, frac[..., None])              # (N, W, H, 3)
        picture = torch.where((hit < d)[..., None], ground, sky.transpose(1, 2))
        out = picture.transpose(1, 2).mul(255.0).add_(0.5).clamp_(0, 255).to(torch.uint8)
        return out.cpu().numpy()
