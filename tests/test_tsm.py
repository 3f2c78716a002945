"""The speed stage (streaming/tsm.py, engine/speed.py): unit tests on synthetic speech.

Quality on real speech (F0, spectral centroid, CPU, a library stretcher and a phase vocoder
compared) is measured by benchmarks/speed.py, not here.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipecat_veena.audio import snr_db
from pipecat_veena.engine.speed import at_speed
from pipecat_veena.interface import AudioChunk, WordTiming
from pipecat_veena.streaming.tsm import WINDOW_S, TimeStretcher, check_speed, stretch

RATE = 16000
SPEEDS = (0.5, 0.75, 1.25, 1.5, 2.0)


def voiced(seconds: float = 2.0, rate: int = RATE, f0: float = 140.0) -> np.ndarray:
    """A gliding harmonic tone with syllable-like bursts and gaps (int16)."""
    t = np.arange(round(seconds * rate)) / rate
    freq = f0 * (1 + 0.15 * np.sin(2 * np.pi * 0.8 * t))
    phase = 2 * np.pi * np.cumsum(freq) / rate
    tone = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 0.5
    noise = np.random.default_rng(1).normal(0, 0.02, len(t))
    return (6000 * (tone * envelope + noise)).astype(np.int16)


def streamed(x: np.ndarray, speed: float, seed: int, stretcher: TimeStretcher | None = None):
    s = stretcher or TimeStretcher(RATE, speed)
    rng, out, i = np.random.default_rng(seed), [], 0
    while i < len(x):
        n = int(rng.choice([1, 7, 160, 1280, 4000, int(rng.integers(1, 9000))]))
        out.append(s.process(x[i : i + n]))
        i += n
    out.append(s.flush())
    return np.concatenate(out)


def f0(x: np.ndarray, rate: int = RATE) -> float:
    """Median F0 of the voiced 40 ms frames (autocorrelation peak, 70-400 Hz)."""
    n, values = round(0.04 * rate), []
    for i in range(0, len(x) - n, n):
        frame = x[i : i + n].astype(np.float64)
        if np.sqrt(np.mean(frame**2)) < 1000:
            continue
        ac = np.correlate(frame, frame, "full")[n - 1 :]
        lo, hi = rate // 400, rate // 70
        values.append(rate / (lo + int(np.argmax(ac[lo:hi]))))
    return float(np.median(values))


@pytest.mark.parametrize("speed", SPEEDS)
def test_duration_is_the_target(speed):
    x = voiced()
    y = stretch(x, RATE, speed)
    assert len(y) == round(len(x) / speed)  # (the benchmark's 2% target, exactly)


@pytest.mark.parametrize("speed", SPEEDS)
@pytest.mark.parametrize("seed", range(3))
def test_streamed_in_random_chunks_equals_the_whole_utterance(speed, seed):
    x = voiced(1.5)
    whole = stretch(x, RATE, speed)
    chunked = streamed(x, speed, seed)
    assert len(chunked) == len(whole)
    assert snr_db(whole, chunked) >= 40
    assert np.array_equal(whole, chunked)  # (in fact sample for sample)


def test_speed_one_is_a_bit_identical_bypass():
    x = voiced(0.5)
    s = TimeStretcher(RATE, 1.0)
    assert s.latency_s == 0
    pieces = [s.process(x[:333]), s.process(x[333:]), s.flush()]
    assert np.concatenate(pieces).tobytes() == x.tobytes()
    assert pieces[0] is not None and len(pieces[2]) == 0


@pytest.mark.parametrize("speed", SPEEDS)
def test_pitch_is_kept(speed):
    x = voiced(2.0)
    assert f0(stretch(x, RATE, speed)) == pytest.approx(f0(x), rel=0.03)


def test_each_utterance_starts_afresh():
    a, b = voiced(1.0, f0=120.0), voiced(0.8, f0=200.0)
    s = TimeStretcher(RATE, 1.5)
    first = streamed(a, 1.5, 0, s)
    assert np.array_equal(first, stretch(a, RATE, 1.5))
    s.process(a[:5000])
    s.set_speed(0.75)  # an utterance cut short (reset), or ended (flush), forgets its speed too
    s.reset()
    second = streamed(b, 1.5, 1, s)
    assert np.array_equal(second, stretch(b, RATE, 1.5))


def test_latency_is_one_window():
    """Fed sample by sample, the output never trails the input's target by more than a window."""
    x = voiced(0.6)
    for speed in SPEEDS:
        s = TimeStretcher(RATE, speed)
        assert s.latency_s == pytest.approx(WINDOW_S, abs=1 / RATE)
        out, worst = 0, 0.0
        for i in range(0, len(x), 16):
            out += len(s.process(x[i : i + 16]))
            fed = min(i + 16, len(x))
            worst = max(worst, fed / RATE - out * speed / RATE)  # input seconds held back
        assert worst <= s.latency_s + 16 / RATE


def test_a_speed_change_mid_stream_maps_time_piecewise():
    x = voiced(2.0)
    s = TimeStretcher(RATE, 1.0)
    out = [s.process(x[:RATE])]  # 1 s at 1.0: passed through untouched
    assert np.array_equal(out[0], x[:RATE])
    s.set_speed(2.0)
    out += [s.process(x[RATE:]), s.flush()]
    y = np.concatenate(out)
    assert len(y) == RATE + RATE // 2
    assert np.array_equal(y[: RATE + 100], x[: RATE + 100])  # no seam where stretching begins
    assert f0(y[RATE:]) == pytest.approx(f0(x[RATE:]), rel=0.03)


def test_output_time_follows_the_speeds():
    s = TimeStretcher(RATE, 1.5)
    s.process(np.zeros(RATE, dtype=np.int16))
    s.set_speed(0.5)
    assert s.output_time(0.75) == pytest.approx(0.5)
    assert s.output_time(1.0) == pytest.approx(1 / 1.5)
    assert s.output_time(1.5) == pytest.approx(1 / 1.5 + 1.0)


@pytest.mark.parametrize("bad", [0.49, 2.01, 0, -1, float("nan"), float("inf"), True, "1.5", None])
def test_speeds_outside_the_range_are_refused_naming_it(bad):
    with pytest.raises(ValueError, match="0.5 to 2.0"):
        check_speed(bad)
    with pytest.raises(ValueError, match="0.5 to 2.0"):
        TimeStretcher(RATE, bad)


def test_chunks_at_speed_carry_scaled_words_after_their_audio():
    x = voiced(2.0)
    words = [
        WordTiming("ek", 0.1, 0.5, 0),
        WordTiming("do", 0.6, 1.2, 3),
        WordTiming("teen", 1.3, 1.95, 6),
    ]
    cuts = [0, 5000, 21000, len(x)]
    chunks = [
        AudioChunk(
            x[a:b].tobytes(),
            RATE,
            tokens=i,
            words=tuple(w for w in words if a / RATE < w.end <= b / RATE),
        )
        for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))
    ]

    async def source():
        for c in chunks:
            yield c

    async def collect():
        return [c async for c in at_speed(source(), TimeStretcher(RATE, 1.5))]

    out = asyncio.run(collect())
    audio = np.concatenate([np.frombuffer(c.pcm, "<i2") for c in out])
    assert np.array_equal(audio, stretch(x, RATE, 1.5))
    got = [w for c in out for w in c.words]
    assert [w.word for w in got] == ["ek", "do", "teen"]
    for before, after in zip(words, got, strict=True):
        assert after.start == pytest.approx(before.start / 1.5, abs=1e-4)
        assert after.end == pytest.approx(before.end / 1.5, abs=1e-4)
        assert after.offset == before.offset
    emitted = 0
    for c in out:  # a word rides the chunk by whose end its audio is out, or a later one
        emitted += c.num_samples
        assert all(w.end <= emitted / RATE + 1e-6 for w in c.words)
    assert out[-1].tokens == 2


def test_speed_changes_scheduled_at_samples_apply_there_whatever_the_chunks():
    """A span at its own speed (SSML <prosody rate>): set_speed_at before its audio arrives
    equals set_speed called exactly at its first sample."""
    x = voiced(2.0)
    exact = TimeStretcher(RATE, 1.0)
    out = [exact.process(x[:8000])]
    exact.set_speed(1.5)
    out.append(exact.process(x[8000:20000]))
    exact.set_speed(1.0)
    out += [exact.process(x[20000:]), exact.flush()]
    want = np.concatenate(out)
    for seed in range(3):
        s = TimeStretcher(RATE, 1.0)
        s.set_speed_at(20000, 1.0)
        s.set_speed_at(8000, 1.5)
        got = streamed(x, 1.0, seed, s)
        assert np.array_equal(got, want)
    assert len(want) == 8000 + round(12000 / 1.5) + (len(x) - 20000)
    with pytest.raises(ValueError, match="0.5 to 2.0"):
        TimeStretcher(RATE).set_speed_at(10, 3.0)
