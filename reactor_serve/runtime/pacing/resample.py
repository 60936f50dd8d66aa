"""`AudioResampler`: streaming int16 audio rate conversion, a thin adapter over PyAV.

Models emit audio at whatever rate they were trained on (16 kHz, 22.05 kHz, 24 kHz,
44.1 kHz, ...); the transport wants 48 kHz. PyAV (already a dependency, through
aiortc) wraps libswresample, which streams: each chunk comes out as soon as the
filter's look-ahead allows, chunking never changes the result, and the read position
never drifts. This module only converts between the runtime's `(channels, samples)`
int16 arrays and PyAV's frames, and picks the filter.

Measured against the pure-numpy resampler this replaced (16/22.05/24/44.1 kHz -> 48 kHz,
mono and stereo, chunks of 1 to 4096 samples): the same output length per chunk and
in total (within 2-6 samples of start-up delay), no phase shift, about 0.35 dB flatter
passband, 5 dB less imaging, and 1.4 to 3.5 times less CPU.
"""

from __future__ import annotations

import numbers

import av
import numpy as np

__all__ = ["AudioResampler"]

# The filter's cutoff as a fraction of the lower rate's Nyquist. libswresample's own
# default (0.97, and for upsampling the cutoff is clamped to the input's Nyquist)
# leaves the transition band straddling Nyquist: white noise at 16 kHz came out with
# images at -21.5 dB. Cutting at 0.9 costs the top 5 % of the band and puts the
# images at -53 dB.
_ROLLOFF = 0.9

_LAYOUTS = {1: "mono", 2: "stereo"}


def _check_positive_int(name: str, value: object) -> int:
    # bool is an int subclass but True/False is never a meaningful rate.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class AudioResampler:
    """Convert a stream of int16 ``(channels, samples)`` chunks between rates.

    Chunks of any size may be fed; the concatenated output equals what one call on
    the concatenated input would give. Output sample ``n`` is the signal at input
    time ``n * source_rate / target_rate`` (no phase shift), emitted once the
    filter's look-ahead (about 1 ms) has arrived, so each call holds back a short
    tail that comes out with the next one. Mono and stereo.
    """

    def __init__(self, source_rate: int, target_rate: int = 48000) -> None:
        self.source_rate: int = _check_positive_int("source_rate", source_rate)
        self.target_rate: int = _check_positive_int("target_rate", target_rate)
        # libswresample scales `cutoff` by target/source when upsampling (and clamps
        # it at 1), so this is `_ROLLOFF` of the lower rate's Nyquist either way.
        cutoff = _ROLLOFF * min(1.0, self.source_rate / self.target_rate)
        self._options = {"cutoff": f"{cutoff:.9f}"}
        self._channels: int | None = None
        self._resampler: av.AudioResampler | None = None

    def reset(self) -> None:
        """Forget all stream state (history, read position, channel count)."""
        self._channels = None
        self._resampler = None

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample one int16 ``(channels, samples)`` chunk; returns int16 ``(channels, m)``.

        ``m`` is however many output samples the input seen so far fully determines;
        it may be 0 for tiny chunks. Always returns a new array.
        """
        channels = self._validate(chunk)
        if self.source_rate == self.target_rate:
            return chunk.copy()
        if chunk.shape[1] == 0:
            return np.zeros((channels, 0), dtype=np.int16)
        if self._resampler is None:
            self._resampler = av.AudioResampler(
                format="s16", layout=_LAYOUTS[channels], rate=self.target_rate,
                options=self._options,
            )
        # Packed s16 is PyAV's (1, samples * channels) interleaved layout.
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(chunk.T).reshape(1, -1), format="s16",
            layout=_LAYOUTS[channels],
        )
        frame.sample_rate = self.source_rate
        out = self._resampler.resample(frame)
        if not out:
            return np.zeros((channels, 0), dtype=np.int16)
        return np.concatenate(
            [f.to_ndarray().reshape(-1, channels).T for f in out], axis=1
        ).astype(np.int16, copy=False)

    def _validate(self, chunk: object) -> int:
        if not isinstance(chunk, np.ndarray):
            raise ValueError(
                "expected an int16 numpy array of shape (channels, samples), got "
                f"{type(chunk).__name__}"
            )
        if chunk.ndim != 2 or chunk.dtype != np.int16 or chunk.shape[0] < 1:
            raise ValueError(
                f"expected an int16 array of shape (channels, samples), "
                f"got shape {chunk.shape} dtype {chunk.dtype}"
            )
        channels = chunk.shape[0]
        if channels not in _LAYOUTS:
            raise ValueError(
                f"expected mono or stereo int16 audio of shape (channels, samples), "
                f"got {channels} channels (shape {chunk.shape} dtype {chunk.dtype})"
            )
        if self._channels is None:
            self._channels = channels
        elif channels != self._channels:
            raise ValueError(
                f"channel count changed from {self._channels} to {channels} mid-stream; "
                f"call reset() before switching layouts"
            )
        return channels
