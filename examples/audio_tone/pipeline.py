# A model with a video and an audio output track: a sine tone the client tunes with
# set_frequency / set_volume, and an oscilloscope picture of the very samples it plays.
#
# Each emit carries FRAMES_PER_EMIT video frames and exactly FRAMES_PER_EMIT / fps
# seconds of audio; the runtime splits that audio across the frames, so every frame
# presented to the client comes with its own 1/30 s of sound. The oscillator keeps
# its phase from one emit to the next, so the tone is continuous across emits and
# across frequency changes (no clicks).
import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np
from reactor_runtime.interface import (
    Audio, InputField, InputState, Output, ReactorModel, Video, connected,
)

SAMPLE_RATE = 48000
MIN_HZ, MAX_HZ = 50.0, 2000.0


@dataclass
class ToneOutput(Output):
    main_video: Video
    main_audio: Audio


@dataclass
class ToneState(InputState):
    frequency: float = InputField(
        default=440.0, ge=MIN_HZ, le=MAX_HZ, description="Pitch of the tone in Hz"
    )
    volume: float = InputField(
        default=0.5, ge=0.0, le=1.0, description="Loudness, 0 (silent) to 1 (full scale)"
    )


class ToneModel(ReactorModel):
    state: ToneState
    fps = 30
    buffer_size = 6  # three emits of two frames

    def load(self, config):
        self.width = config.get("width", 640)
        self.height = config.get("height", 480)
        self.frames_per_emit = config.get("frames_per_emit", 2)
        self.samples_per_frame = SAMPLE_RATE // self.fps  # 1600: exact at 30 fps
        self.oscillator = Oscillator(SAMPLE_RATE)
        self.scope = Scope(self.width, self.height, SAMPLE_RATE)

    @connected
    async def on_connect(self):
        # Every client hears the tone start from silence at phase 0.
        self.oscillator.reset()
        self.scope.reset()

    async def run(self):
        n = self.frames_per_emit
        period = n / self.fps  # seconds of media per emit
        while True:
            await self.connected.wait()
            deadline = time.monotonic()
            while self.connected.is_set():
                # Snapshot: event handlers may change the state at any await below.
                frequency, volume = self.state.frequency, self.state.volume
                audio = self.oscillator.render(frequency, volume, n * self.samples_per_frame)
                video = self.scope.draw(audio[0], frequency, n)
                await self.emit(ToneOutput(main_video=video, main_audio=audio))
                # Pace to real time: one emit per `period`, measured from a running
                # deadline so sleep overshoot does not accumulate.
                deadline += period
                delay = deadline - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -period:
                    deadline = time.monotonic()  # fell behind (a stall): do not burst


class Oscillator:
    """A phase-continuous sine oscillator producing int16 mono audio."""

    def __init__(self, sample_rate):
        self.sample_rate = sample_rate
        self.reset()

    def reset(self):
        self.phase = 0.0      # radians, at the next sample to produce
        self.amplitude = 0.0  # the gain the last chunk ended at

    def render(self, frequency, volume, samples):
        """The next `samples` samples as an int16 array of shape (1, samples)."""
        step = 2.0 * math.pi * frequency / self.sample_rate
        phases = self.phase + step * np.arange(samples, dtype=np.float64)
        self.phase = (self.phase + step * samples) % (2.0 * math.pi)
        # A change of volume glides over the chunk instead of jumping (a jump clicks).
        target = volume * 0.9 * 32767.0
        gain = np.linspace(self.amplitude, target, samples, endpoint=False)
        self.amplitude = target
        return (gain * np.sin(phases)).round().astype(np.int16)[None, :]


class Scope:
    """Draws a triggered oscilloscope trace of the audio, coloured by pitch."""

    HISTORY = 8192  # samples kept for finding the trigger before a frame's window

    def __init__(self, width, height, sample_rate):
        self.width, self.height = width, height
        self.sample_rate = sample_rate
        self.background = self._background()
        self.rows = np.arange(height, dtype=np.float32)[:, None]
        self.reset()

    def reset(self):
        self.history = np.zeros(self.HISTORY, dtype=np.float32)

    def _background(self):
        h, w = self.height, self.width
        bg = np.empty((h, w, 3), dtype=np.uint8)
        bg[:] = (10, 14, 20)
        bg[:, :: max(1, w // 10)] = (28, 36, 46)         # vertical grid
        bg[:: max(1, h // 8), :] = (28, 36, 46)          # horizontal grid
        bg[h // 2, :] = (50, 62, 76)                     # zero line
        return bg

    def draw(self, samples, frequency, frames):
        """`frames` frames (N, H, W, 3) uint8; frame i shows the i-th equal slice of
        `samples` (int16, 1-D), triggered on a rising zero crossing."""
        h, w = self.height, self.width
        per_frame = len(samples) // frames
        signal = np.concatenate([self.history, samples.astype(np.float32) / 32768.0])
        self.history = signal[-self.HISTORY:]
        base = len(signal) - len(samples)

        # Show three periods of the tone, whatever its pitch (within the history).
        period = self.sample_rate / frequency
        window = int(min(3 * period, self.HISTORY // 2))
        colour = pitch_colour(frequency)
        dim = (colour * 0.35).astype(np.uint8)
        half = 0.42 * h

        out = np.empty((frames, h, w, 3), dtype=np.uint8)
        for i in range(frames):
            end = base + (i + 1) * per_frame
            # The last rising zero crossing that leaves a full window before `end`.
            lo = max(1, end - window - int(period) - 2)
            seg = signal[lo - 1 : end - window + 1]
            rising = np.flatnonzero((seg[:-1] < 0) & (seg[1:] >= 0))
            start = lo - 1 + (int(rising[-1]) + 1 if rising.size else len(seg) - 1)
            trace = signal[start : start + window]
            # Resample the window to one value per column; rows grow downwards.
            ys = np.interp(np.linspace(0, window - 1, w + 1), np.arange(window), trace)
            ys = h / 2 - ys * half
            top = np.minimum(ys[:-1], ys[1:])[None, :]
            bottom = np.maximum(ys[:-1], ys[1:])[None, :]
            frame = out[i]
            frame[:] = self.background
            frame[(self.rows >= top - 4) & (self.rows <= bottom + 4)] = dim       # glow
            frame[(self.rows >= top - 1.5) & (self.rows <= bottom + 1.5)] = colour  # line
            # Pitch marker along the bottom edge, on a log scale from 50 Hz to 2 kHz.
            x = int(pitch_position(frequency) * (w - 1))
            frame[h - 12 : h - 4, max(0, x - 3) : x + 4] = colour
        return out


def pitch_position(frequency):
    """0 at MIN_HZ, 1 at MAX_HZ, logarithmic (equal steps per octave)."""
    return math.log(frequency / MIN_HZ) / math.log(MAX_HZ / MIN_HZ)


def pitch_colour(frequency):
    """A bright colour whose hue goes red -> green -> blue as the pitch rises."""
    hue = 0.7 * pitch_position(frequency)  # up to violet-blue, not back round to red
    rgb = 0.5 + 0.5 * np.cos(2 * np.pi * (hue - np.array([0.0, 1 / 3, 2 / 3])))
    rgb = 0.25 + 0.75 * rgb / rgb.max()
    return (rgb * 255).astype(np.uint8)
