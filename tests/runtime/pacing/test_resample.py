"""Tests for reactor_serve.runtime.pacing.resample.AudioResampler (over PyAV's libswresample):
the length of what comes out, continuity across chunks, frequency and timing kept."""

from __future__ import annotations

import numpy as np
import pytest

from reactor_serve.runtime.pacing.resample import AudioResampler

TARGET = 48000
AMPLITUDE = 10000.0


def _sine(freq: float, rate: int, seconds: float, channels: int = 1, amplitude: float = AMPLITUDE) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    row = np.rint(amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)
    return np.repeat(row[None, :], channels, axis=0)


def _noise(samples: int, channels: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-20000, 20000, size=(channels, samples), dtype=np.int16)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1.0 / rate)[np.argmax(spectrum)])


def _feed_in_chunks(resampler: AudioResampler, signal: np.ndarray, sizes: list[int]) -> np.ndarray:
    outs = []
    pos = 0
    for size in sizes:
        outs.append(resampler.process(signal[:, pos : pos + size]))
        pos += size
    assert pos >= signal.shape[1], "chunk sizes must cover the whole signal"
    return np.concatenate(outs, axis=1)


def _random_sizes(total: int, seed: int, max_size: int = 900) -> list[int]:
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        # Plenty of 0- and 1-sample chunks mixed in with larger ones.
        kind = rng.integers(0, 4)
        sizes.append(int(0 if kind == 0 else 1 if kind == 1 else rng.integers(2, max_size)))
    return sizes


# -- quality ---------------------------------------------------------------


@pytest.mark.parametrize("source_rate", [16000, 22050, 24000, 44100])
def test_sine_keeps_frequency_and_amplitude(source_rate: int) -> None:
    x = _sine(440.0, source_rate, 2.5, channels=2)
    y = AudioResampler(source_rate).process(x)

    assert y.dtype == np.int16
    assert y.shape[0] == 2
    # Skip the start-up transient (the signal is taken as zero before t=0).
    steady = y[:, 2000 : 2000 + 2 * TARGET]
    assert steady.shape[1] == 2 * TARGET
    for ch in steady:
        assert abs(_peak_hz(ch, TARGET) - 440.0) <= 2.0
        assert _rms(ch) == pytest.approx(AMPLITUDE / np.sqrt(2), rel=0.03)


@pytest.mark.parametrize("source_rate", [16000, 22050, 24000, 44100, 44101])
def test_sine_matches_ideal_waveform_and_timing(source_rate: int) -> None:
    # Output sample n must be the signal at input time n * source / target:
    # compare against the ideal 48 kHz sine.  An off-by-one read position or a
    # mis-scaled kernel shows up here as hundreds of LSB of error.
    x = _sine(440.0, source_rate, 1.5)
    y = AudioResampler(source_rate).process(x)[0].astype(np.float64)
    n = np.arange(len(y))
    ideal = AMPLITUDE * np.sin(2 * np.pi * 440.0 * n / TARGET)
    assert np.max(np.abs(y - ideal)[1000:]) <= 4.0


def _level_db(x: np.ndarray, freq: float, rate: int) -> float:
    """The level of `freq` in `x`, in dB relative to a full-AMPLITUDE sine."""
    window = np.blackman(len(x))
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * window))
    i = int(round(freq * len(x) / rate))
    return float(20 * np.log10(spectrum[i - 3 : i + 4].max() / (window.sum() / 2) / AMPLITUDE))


@pytest.mark.parametrize("source_rate", [16000, 22050, 24000])
def test_upsampling_keeps_the_band_and_suppresses_images(source_rate: int) -> None:
    # A tone at 0.4 of the source rate comes through at full level; one at 0.45 leaves
    # its mirror image (at 0.55, above the source's Nyquist) far below full scale.
    # libswresample's own cutoff, which the adapter overrides, lets it through at -27 dB.
    def through(frac: float) -> tuple[float, np.ndarray]:
        tone = round(frac * source_rate / 10) * 10  # whole Hz: bin-centred in 1 s
        out = AudioResampler(source_rate).process(_sine(tone, source_rate, 1.5))
        return tone, out[0, 4800 : 4800 + TARGET]

    tone, y = through(0.4)
    assert _level_db(y, tone, TARGET) == pytest.approx(0.0, abs=0.5)
    tone, y = through(0.45)
    assert _level_db(y, source_rate - tone, TARGET) < -60.0


def test_downsampling_rejects_tone_above_new_nyquist() -> None:
    x = _sine(10000.0, 48000, 2.0)
    y = AudioResampler(48000, 16000).process(x)
    assert y.shape[1] > 31000
    assert _rms(y[:, 500:]) < 0.01 * _rms(x)


def test_downsampling_keeps_tone_below_new_nyquist() -> None:
    # Guards the rejection test against a resampler that just outputs silence.
    x = _sine(1000.0, 48000, 2.0)
    y = AudioResampler(48000, 16000).process(x)
    steady = y[0, 500:]
    assert abs(_peak_hz(steady[:16000], 16000) - 1000.0) <= 2.0
    assert _rms(steady) == pytest.approx(_rms(x), rel=0.03)


def test_output_is_clipped_not_wrapped() -> None:
    # A full-scale square wave overshoots (Gibbs) after filtering; without
    # clipping the int16 cast would wrap the overshoot to large negatives.
    rate = 16000
    period = 160  # 100 Hz
    x = np.where((np.arange(rate) // (period // 2)) % 2 == 0, 32767, -32767).astype(np.int16)[None, :]
    y = AudioResampler(rate).process(x)[0]

    phase = (np.arange(len(y)) * rate / TARGET) % period  # in input samples
    positive = phase < period / 2
    to_edge = np.minimum(phase % (period / 2), period / 2 - phase % (period / 2))
    settled = to_edge > 3  # away from the transitions
    settled[:100] = False  # and from the start-up transient

    assert y.max() == 32767  # the overshoot really was clipped
    assert np.all(y[settled & positive] > 0)
    assert np.all(y[settled & ~positive] < 0)

# -- streaming -------------------------------------------------------------


@pytest.mark.parametrize(
    "source_rate,target_rate",
    [(16000, 48000), (22050, 48000), (24000, 48000), (44100, 48000), (48000, 16000), (44101, 48000)],
)
def test_chunked_equals_one_shot(source_rate: int, target_rate: int) -> None:
    x = _noise(source_rate, channels=2, seed=source_rate)
    one_shot = AudioResampler(source_rate, target_rate).process(x)
    chunked = _feed_in_chunks(
        AudioResampler(source_rate, target_rate), x, _random_sizes(x.shape[1], seed=target_rate)
    )
    assert chunked.dtype == np.int16
    assert chunked.shape == one_shot.shape
    assert np.max(np.abs(chunked.astype(np.int32) - one_shot.astype(np.int32))) <= 1


@pytest.mark.parametrize("source_rate,target_rate", [(16000, 48000), (44100, 48000), (48000, 16000)])
def test_single_sample_chunks_equal_one_shot(source_rate: int, target_rate: int) -> None:
    x = _noise(2000, channels=1, seed=7)
    one_shot = AudioResampler(source_rate, target_rate).process(x)
    r = AudioResampler(source_rate, target_rate)
    chunked = np.concatenate([r.process(x[:, i : i + 1]) for i in range(x.shape[1])], axis=1)
    assert chunked.shape == one_shot.shape
    assert np.max(np.abs(chunked.astype(np.int32) - one_shot.astype(np.int32))) <= 1


def test_empty_chunk_returns_empty_int16() -> None:
    r = AudioResampler(16000)
    y = r.process(np.zeros((2, 0), dtype=np.int16))
    assert y.dtype == np.int16
    assert y.shape == (2, 0)


@pytest.mark.parametrize(
    "source_rate,target_rate",
    [(16000, 48000), (22050, 48000), (44100, 48000), (48000, 16000), (44101, 48000)],
)
def test_output_count_tracks_ratio_without_drift(source_rate: int, target_rate: int) -> None:
    r = AudioResampler(source_rate, target_rate)
    # The filter's look-ahead: 16 zero crossings each side at the lower rate, widened
    # by 1/0.9 for the cutoff below Nyquist, is held back; in output samples (plus
    # rounding) that is:
    max_lag = 18 * max(1.0, target_rate / source_rate) + 2
    rng = np.random.default_rng(1)
    chunk = np.zeros((1, 2000), dtype=np.int16)
    fed = 0
    produced = 0
    # ~5 minutes of audio in irregular chunks.
    while fed < 300 * source_rate:
        n = int(rng.integers(0, 2000))
        produced += r.process(chunk[:, :n]).shape[1]
        fed += n
        expected = fed * target_rate / source_rate
        # Never ahead of the input, never more than the filter delay behind.
        assert expected - max_lag <= produced <= expected + 1
    assert abs(produced - fed * target_rate / source_rate) <= max_lag


# -- identity, reset -------------------------------------------------------


def test_identity_returns_input_values() -> None:
    x = _noise(1234, channels=2, seed=3)
    r = AudioResampler(48000, 48000)
    y = r.process(x)
    assert y.dtype == np.int16
    np.testing.assert_array_equal(y, x)
    assert y is not x  # a new array: the caller may reuse its buffer
    np.testing.assert_array_equal(r.process(x[:, :1]), x[:, :1])


def test_reset_makes_output_match_fresh_resampler() -> None:
    first = _noise(5000, channels=2, seed=11)
    second = _noise(5000, channels=2, seed=12)
    used = AudioResampler(22050)
    used.process(first[:, :3333])  # leaves history and a mid-period position
    used.reset()
    np.testing.assert_array_equal(used.process(second), AudioResampler(22050).process(second))


def test_reset_allows_a_new_channel_count() -> None:
    r = AudioResampler(16000)
    r.process(np.zeros((2, 100), dtype=np.int16))
    r.reset()
    mono = _noise(500, channels=1, seed=5)
    np.testing.assert_array_equal(r.process(mono), AudioResampler(16000).process(mono))


# -- validation ------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -16000, 16000.0, 16000.5, "16000", None, True])
def test_bad_source_rate_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="source_rate"):
        AudioResampler(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -48000, 48000.0, "48000", None])
def test_bad_target_rate_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="target_rate"):
        AudioResampler(16000, bad)  # type: ignore[arg-type]


def test_numpy_integer_rates_are_accepted() -> None:
    r = AudioResampler(np.int64(16000), np.int32(48000))  # type: ignore[arg-type]
    assert r.process(np.zeros((1, 1000), dtype=np.int16)).shape[0] == 1


@pytest.mark.parametrize(
    "chunk,shape_text,dtype_text",
    [
        (np.zeros((2, 10), dtype=np.float32), "(2, 10)", "float32"),
        (np.zeros((2, 10), dtype=np.int32), "(2, 10)", "int32"),
        (np.zeros(10, dtype=np.int16), "(10,)", "int16"),
        (np.zeros((1, 2, 10), dtype=np.int16), "(1, 2, 10)", "int16"),
        (np.zeros((0, 10), dtype=np.int16), "(0, 10)", "int16"),
    ],
)
def test_bad_chunk_raises_with_shape_and_dtype(chunk: np.ndarray, shape_text: str, dtype_text: str) -> None:
    for rate in (16000, 48000):  # resampling and identity paths validate alike
        with pytest.raises(ValueError) as info:
            AudioResampler(rate).process(chunk)
        message = str(info.value)
        assert shape_text in message
        assert dtype_text in message
        assert "int16" in message and "(channels, samples)" in message


def test_more_than_two_channels_raises() -> None:
    with pytest.raises(ValueError, match=r"mono or stereo.*3 channels"):
        AudioResampler(16000).process(np.zeros((3, 100), dtype=np.int16))


def test_non_array_chunk_raises() -> None:
    with pytest.raises(ValueError, match=r"int16.*\(channels, samples\).*list"):
        AudioResampler(16000).process([[0, 1, 2]])  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [16000, 48000])
def test_channel_count_change_raises(rate: int) -> None:
    r = AudioResampler(rate)
    r.process(np.zeros((2, 100), dtype=np.int16))
    with pytest.raises(ValueError, match=r"channel count changed from 2 to 1"):
        r.process(np.zeros((1, 100), dtype=np.int16))
    # The failed call must not have corrupted the stream.
    assert r.process(np.zeros((2, 100), dtype=np.int16)).shape[0] == 2
