"""StreamResampler: the first chunk comes out at once at every rate, chunk joins are exact (the
same output whatever the chunking), lengths are exact, in-band audio matches soxr's best and
out-of-band audio does not alias."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from pipecat_veena.resample import StreamResampler, resample_bytes

RATES = [(16000, r) for r in (8000, 16000, 22050, 24000, 44100, 48000)] + [
    (24000, 8000),
    (24000, 16000),
    (24000, 22050),
]
#: Rates whose ratio has too many phases for a row each (interpolated taps): any rate works.
ODD_RATES = [(16000, 8001), (16000, 44123), (24000, 11111), (24000, 47999)]


def _tones(rate: int, seconds: float = 1.0) -> np.ndarray:
    """Float samples in int16 units: 440 Hz plus a 1-3 kHz sweep (in band for every rate)."""
    t = np.arange(int(rate * seconds)) / rate
    return (
        0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (1000 * t + 1000 * t * t))
    ) * 32767


@pytest.mark.parametrize(("rate_in", "rate_out"), RATES + ODD_RATES)
def test_first_chunk_comes_out_at_once(rate_in, rate_out):
    first = _tones(rate_in)[: rate_in * 80 // 1000].astype("<i2").tobytes()  # 80 ms
    resampler = StreamResampler(rate_in, rate_out)
    out_ms = len(resampler.resample(first)) / 2 / rate_out * 1000
    assert out_ms >= 80 - resampler.lookahead_s * 1000 - 1
    assert resampler.lookahead_s <= 0.0045  # a few milliseconds at most


@pytest.mark.parametrize(("rate_in", "rate_out"), RATES + ODD_RATES)
def test_chunking_changes_nothing_and_lengths_are_exact(rate_in, rate_out):
    pcm = _tones(rate_in).astype("<i2").tobytes()
    whole = resample_bytes(pcm, rate_in, rate_out)
    assert len(whole) // 2 == round(len(pcm) // 2 * rate_out / rate_in)
    rng = np.random.default_rng(rate_out)
    resampler, parts, pos = StreamResampler(rate_in, rate_out), [], 0
    while pos < len(pcm):
        n = 2 * int(rng.integers(1, 2000))
        parts.append(resampler.resample(pcm[pos : pos + n]))
        pos += n
    parts.append(resampler.flush())
    assert b"".join(parts) == whole


@pytest.mark.parametrize(("rate_in", "rate_out"), RATES + ODD_RATES)
def test_in_band_audio_matches_soxr_very_high_quality(rate_in, rate_out):
    x = _tones(rate_in)
    ours = np.frombuffer(resample_bytes(x.astype("<i2").tobytes(), rate_in, rate_out), "<i2")
    reference = soxr.resample(x, rate_in, rate_out, quality="VHQ")
    cut = slice(rate_out // 50, len(reference) - rate_out // 50)  # not the edges
    error = ours[cut].astype(float) - reference[cut]
    snr = 10 * np.log10(np.sum(reference[cut] ** 2) / max(np.sum(error**2), 1e-9))
    assert snr > 70, f"{rate_in} -> {rate_out}: {snr:.1f} dB"


@pytest.mark.parametrize(
    ("rate_in", "rate_out", "tone"), [(16000, 8000, 6000), (24000, 8000, 7000)]
)
def test_audio_above_the_new_nyquist_does_not_alias(rate_in, rate_out, tone):
    t = np.arange(rate_in) / rate_in
    pcm = (0.5 * 32767 * np.sin(2 * np.pi * tone * t)).astype("<i2").tobytes()
    out = np.frombuffer(resample_bytes(pcm, rate_in, rate_out), "<i2").astype(float)
    rms = np.sqrt(np.mean(out[100:-100] ** 2))
    assert 20 * np.log10(rms / (0.5 * 32767 / np.sqrt(2)) + 1e-12) < -60


@pytest.mark.parametrize(("rate_in", "rate_out"), ODD_RATES)
def test_odd_rates_have_no_seam_clicks(rate_in, rate_out):
    """A tone streamed in 20 ms chunks at a rate without a row per phase: no sample jumps more
    than the tone's own slope allows (no click at a join), and the table stays small."""
    t = np.arange(rate_in) / rate_in
    pcm = (0.5 * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    resampler, step = StreamResampler(rate_in, rate_out), 2 * rate_in // 50
    out = b"".join(resampler.resample(pcm[i : i + step]) for i in range(0, len(pcm), step))
    y = np.frombuffer(out + resampler.flush(), "<i2").astype(float)
    assert len(y) == round(rate_in * rate_out / rate_in)
    slope = 0.5 * 32767 * 2 * np.pi * 440 / rate_out  # the largest step of the ideal tone
    assert np.abs(np.diff(y[200:-200])).max() <= slope * 1.01 + 2
    assert resampler._bank.nbytes < 2**20


def test_reset_starts_a_new_stream_and_equal_rates_pass_through():
    pcm = _tones(16000, 0.1).astype("<i2").tobytes()
    resampler = StreamResampler(16000, 8000)
    first = resampler.resample(pcm) + resampler.flush()
    resampler.resample(pcm[:100])  # an interrupted utterance
    resampler.reset()
    assert resampler.resample(pcm) + resampler.flush() == first
    same = StreamResampler(16000, 16000)
    assert same.resample(pcm) == pcm and same.flush() == b"" and same.lookahead_s == 0
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 8000)
