"""Streaming int16 audio resampler (pure numpy).

Models emit audio at whatever rate they were trained on (16 kHz, 22.05 kHz,
24 kHz, 44.1 kHz, ...); the transport wants 48 kHz.  :class:`AudioResampler`
converts chunk by chunk on the model's thread, so it keeps just enough state
between calls that chunking never changes the result, and it avoids any
per-sample Python work.

Method: band-limited interpolation with a Kaiser-windowed sinc kernel
evaluated at the exact fractional read positions.  The ratio is kept as an
exact fraction ``L / M`` (output / input samples), so the read position is
tracked with integers and never drifts, however long the stream.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["AudioResampler"]

# Cutoff as a fraction of the lower rate's Nyquist, and the Kaiser beta.
# Picked by measuring the 16 kHz -> 48 kHz response with 16 taps: flat
# (< 0.35 dB) up to 0.4 * fs, about -28 dB at Nyquist and below -88 dB from
# 0.55 * fs on.  Cutting a little below Nyquist is what buys the stopband;
# with so few taps a cutoff at Nyquist would leave strong images / aliases.
_ROLLOFF = 0.9
_KAISER_BETA = 8.6

# The fast path multiplies frames of one full ratio period by a dense
# (span x L) matrix.  For "awkward" rate pairs (e.g. 44101 -> 48000, where L
# is huge) that matrix would be enormous, so above this many entries we fall
# back to gathering one kernel per output sample instead.
_MAX_PERIOD_MATRIX = 1 << 18
# Phase resolution of the fallback kernel table; positions are still tracked
# exactly, only the kernel shape is rounded (< 1/8192 sample timing error).
_FALLBACK_PHASES = 4096

# float64 rather than float32: ~2x the cost (still well under 1 ms per second
# of stereo 16 kHz audio) but BLAS summation order then never changes a
# rounded int16 sample, so chunked output is bit-identical to one-shot.
_DTYPE = np.float64

_INT16_MIN = float(np.iinfo(np.int16).min)
_INT16_MAX = float(np.iinfo(np.int16).max)


def _check_positive_int(name: str, value: object) -> int:
    # bool is an int subclass but True/False is never a meaningful rate.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class AudioResampler:
    """Convert a stream of int16 ``(channels, samples)`` chunks between rates.

    Chunks of any size may be fed; the concatenated output equals what one
    call on the concatenated input would give.  Output sample ``n`` is the
    signal at input time ``n * source_rate / target_rate`` (no phase shift),
    but it is only emitted once the kernel's look-ahead of about ``taps``
    samples (at the lower rate) has arrived, so each call holds back a short
    tail that comes out with the next call.  There is no flush: a stream's
    final few milliseconds stay in the buffer.
    """

    def __init__(self, source_rate: int, target_rate: int = 48000, taps: int = 16) -> None:
        """Build the kernel for ``source_rate -> target_rate``.

        ``taps`` is the number of kernel zero crossings on each side of the
        interpolation point, measured at the lower of the two rates.
        """
        self.source_rate: int = _check_positive_int("source_rate", source_rate)
        self.target_rate: int = _check_positive_int("target_rate", target_rate)
        self.taps: int = _check_positive_int("taps", taps)

        g = math.gcd(self.source_rate, self.target_rate)
        # Exact ratio: every L outputs consume exactly M inputs.
        self._up: int = self.target_rate // g  # L
        self._down: int = self.source_rate // g  # M
        self._identity: bool = self._up == self._down

        # When downsampling the kernel is stretched to the target's Nyquist,
        # so it spans proportionally more input samples.
        ratio = self._up / self._down
        self._cutoff: float = _ROLLOFF * min(1.0, ratio)
        self._half: int = self.taps if ratio >= 1.0 else math.ceil(self.taps / ratio)

        self._use_period: bool = True
        self._span: int = 0
        self._matrix: np.ndarray | None = None
        self._table: np.ndarray | None = None
        self._phases: int = self._up
        if not self._identity:
            self._plan()

        self._channels: int | None = None
        self._buf: np.ndarray = np.zeros((0, 0), dtype=_DTYPE)
        self._r: int = 0
        self.reset()

    # -- kernel construction -------------------------------------------------

    def _plan(self) -> None:
        """Choose the matrix (fast) or gather (fallback) path and build its weights."""
        hw = self._half
        L, M = self._up, self._down
        # One reduced period (M inputs) can be much shorter than the kernel,
        # so every input would be copied ~span/M times into the frames;
        # grouping periods keeps that duplication under 2x for a somewhat
        # larger (still small) matrix.  Try grouped, then ungrouped.
        for group in (max(1, -(-(2 * hw - 1) // M)), 1):
            gl, gm = group * L, group * M
            span = 2 * hw + ((gl - 1) * gm) // gl
            if span * gl <= _MAX_PERIOD_MATRIX:
                # The unreduced ratio gl/gm gives the same read positions,
                # just with a longer period.
                self._up, self._down, self._span = gl, gm, span
                self._matrix = self._build_period_matrix()
                return
        self._use_period = False
        self._phases = min(L, _FALLBACK_PHASES)
        # One extra row: a fraction that rounds up to 1.0 needs it.
        fracs = np.arange(self._phases + 1) / self._phases
        self._table = self._kernel(fracs).astype(_DTYPE)

    def _kernel(self, fracs: np.ndarray) -> np.ndarray:
        """Kernel weights, shape ``(len(fracs), 2 * half)``, for taps k = -half+1 .. half."""
        hw = self._half
        k = np.arange(-hw + 1, hw + 1, dtype=np.float64)
        t = k[None, :] - fracs[:, None]
        c = self._cutoff
        window = np.i0(_KAISER_BETA * np.sqrt(np.clip(1.0 - (t / hw) ** 2, 0.0, None)))
        h = c * np.sinc(c * t) * window
        # Unit DC gain at every phase; otherwise the tiny per-phase gain
        # differences show up as a faint tone at the output rate / L.
        return h / h.sum(axis=1, keepdims=True)

    def _build_period_matrix(self) -> np.ndarray:
        L, M, hw = self._up, self._down, self._half
        r = np.arange(L, dtype=np.int64)
        base = (r * M) // L
        fracs = ((r * M) % L) / L
        weights = self._kernel(fracs)
        matrix = np.zeros((self._span, L), dtype=_DTYPE)
        rows = base[:, None] + np.arange(2 * hw)[None, :]
        matrix[rows, r[:, None]] = weights
        return matrix

    # -- streaming -----------------------------------------------------------

    def reset(self) -> None:
        """Forget all stream state (history, read position, channel count)."""
        self._channels = None
        # Buffer index 0 corresponds to input sample (period_start - half + 1);
        # starting with half - 1 zeros means the signal is zero before t = 0.
        self._buf = np.zeros((0, self._half - 1), dtype=_DTYPE)
        # Next output's index within the current ratio period (0 .. L-1).
        self._r = 0

    def _validate(self, chunk: np.ndarray) -> None:
        if not isinstance(chunk, np.ndarray):
            raise ValueError(
                f"expected an int16 numpy array of shape (channels, samples), got {type(chunk).__name__}"
            )
        if chunk.ndim != 2 or chunk.dtype != np.int16 or chunk.shape[0] < 1:
            raise ValueError(
                f"expected an int16 array of shape (channels, samples), "
                f"got shape {chunk.shape} dtype {chunk.dtype}"
            )
        channels = chunk.shape[0]
        if self._channels is None:
            self._channels = channels
            self._buf = np.zeros((channels, self._buf.shape[1]), dtype=_DTYPE)
        elif channels != self._channels:
            raise ValueError(
                f"channel count changed from {self._channels} to {channels} mid-stream; "
                f"call reset() before switching layouts"
            )

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample one int16 ``(channels, samples)`` chunk; returns int16 ``(channels, m)``.

        ``m`` is however many output samples the input seen so far fully
        determines; it may be 0 for tiny chunks.  Always returns a new array.
        """
        self._validate(chunk)
        if self._identity:
            return chunk.copy()

        L, M, hw = self._up, self._down, self._half
        channels = chunk.shape[0]
        held = self._buf.shape[1]
        total = held + chunk.shape[1]

        # Output r (counted from the current period start) reads input up to
        # buffer index (hw - 1) + (r*M)//L + hw; count how many fit in `total`.
        limit = total - 2 * hw
        count = 0
        if limit >= 0:
            count = max(0, -((-(limit + 1) * L) // M) - self._r)

        if count == 0:
            work = np.empty((channels, total), dtype=_DTYPE)
            work[:, :held] = self._buf
            work[:, held:] = chunk
            self._buf = work
            return np.zeros((channels, 0), dtype=np.int16)

        end = self._r + count  # one past the last output, in period units of 1/L
        periods = -(-end // L)
        if self._use_period:
            # Partial last period reads past the input; zero-pad, then drop.
            needed = (periods - 1) * M + self._span
        else:
            needed = total
        work = np.zeros((channels, max(total, needed)), dtype=_DTYPE)
        work[:, :held] = self._buf
        work[:, held:total] = chunk

        if self._use_period:
            # Period p reads work[p*M : p*M + span]; a strided window view
            # turns the whole chunk into one (periods x span) @ (span x L).
            frames = sliding_window_view(work, self._span, axis=1)[:, : (periods - 1) * M + 1 : M]
            out = np.matmul(np.ascontiguousarray(frames), self._matrix)
            out = out.reshape(channels, periods * L)[:, self._r : end]
        else:
            idx = np.arange(self._r, end, dtype=np.int64) * M
            starts = idx // L
            # Nearest tabulated phase; exact when L <= _FALLBACK_PHASES.
            phase = ((idx % L) * self._phases * 2 + L) // (2 * L)
            frames = sliding_window_view(work, 2 * hw, axis=1)[:, starts]
            out = np.einsum("ckt,kt->ck", frames, self._table[phase])

        consumed = (end // L) * M
        self._r = end % L
        # Copy so the (possibly large) work array is not kept alive.
        self._buf = work[:, consumed:total].copy()

        np.rint(out, out=out)
        np.clip(out, _INT16_MIN, _INT16_MAX, out=out)
        return out.astype(np.int16)
