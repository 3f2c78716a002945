"""Speed: a streaming, pitch-preserving time-scale modification stage (WSOLA, numpy only).

``TimeStretcher`` plays a stream of int16 samples faster or slower without changing its pitch:
waveform-similarity overlap-add. Output frames of ``window`` samples (Hann, periodic) are laid
every ``hop = window / 2`` samples; frame k is read from the input near its nominal position
``k * hop * speed``, shifted back by up to one hop to where its first half best continues what the
previous frame left in the overlap (normalised cross-correlation). Searching only backwards keeps
the lookahead to one window: frame k needs input up to its nominal position plus ``window``
samples, and nothing else.

State lives in the stretcher (one per utterance): every frame is computed from the input samples
alone, never from how they were chunked, so a stream fed in any chunks and flushed equals the
whole utterance stretched at once, sample for sample (``stretch``). The output length is
``round(output_time(input duration) * rate)``: exact duration. Speed 1.0 is a pass-through
(the very same bytes); the engine does not even build a stretcher then.

``set_speed`` changes the speed from the input fed so far on (an SSML ``<prosody rate>`` span):
input time maps to output time piecewise linearly (``output_time``), which is how word timings
follow the audio.

Why our own: no permissively licensed, maintained package streams with state (``audiotsm``:
MIT, streams, unmaintained since 2017; ``pytsmod``, ``pedalboard`` and ``pyrubberband``:
whole buffers, and Rubber Band is GPL). BENCHMARKS.md ("Speed") compares it with audiotsm's WSOLA
and a phase vocoder on real speech.
"""

from __future__ import annotations

import math

import numpy as np

#: The speeds a caller may ask for (inclusive).
SPEED_MIN = 0.5
SPEED_MAX = 2.0
#: Analysis window in seconds: a few pitch periods (long enough for 80 Hz voices, short enough
#: that stretching does not smear syllables). It is also the stage's latency (``latency_s``).
WINDOW_S = 0.03

__all__ = [
    "SPEED_MAX",
    "SPEED_MIN",
    "WINDOW_S",
    "TimeStretcher",
    "check_speed",
    "stretch",
]


def check_speed(speed: object) -> float:
    """``speed`` as a float, or ValueError naming the range.

    Args:
        speed: a number in [SPEED_MIN, SPEED_MAX] (1.0: as the model speaks; 2.0: twice as fast).
    """
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise ValueError(
            f"speed must be a number from {SPEED_MIN} to {SPEED_MAX}, got {type(speed).__name__}"
        )
    if not (SPEED_MIN <= speed <= SPEED_MAX):  # (NaN fails too)
        raise ValueError(
            f"speed must be from {SPEED_MIN} to {SPEED_MAX} (1.0: the model's own pace), "
            f"got {speed!r}"
        )
    return float(speed)


class TimeStretcher:
    """Stretches one stream of mono int16 audio, chunk by chunk, keeping its pitch.

    Args:
        sample_rate: the stream's rate in Hz (stretch before resampling: at the codec's rate).
        speed: playback speed in [0.5, 2.0]: 1.5 makes the audio 1/1.5 as long.
        window_s: analysis window in seconds (the stage's latency).
    """

    def __init__(self, sample_rate: int, speed: float = 1.0, *, window_s: float = WINDOW_S) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.sample_rate = sample_rate
        self._hop = max(2, round(window_s * sample_rate / 2))
        self._window = 2 * self._hop
        n = np.arange(self._window)
        # periodic Hann: frames a hop apart sum to exactly 1
        self._hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / self._window)
        self._first = self._hann.copy()
        self._first[: self._hop] = 1.0  # the first frame has nothing to fade in against
        self._initial_speed = check_speed(speed)
        self.reset()

    @property
    def speed(self) -> float:
        """The speed applied to input fed from now on."""
        return self._speed

    @property
    def latency_s(self) -> float:
        """Input held back until more arrives (or ``flush``): at most one window, in seconds."""
        return 0.0 if self._passing else self._window / self.sample_rate

    def reset(self) -> None:
        """Forget the stream (a new utterance): speed back to the one given at construction."""
        self._speed = self._initial_speed
        self._passing = self._speed == 1.0  # untouched: the very samples given
        # (input seconds, output seconds, speed) from which each speed applies
        self._segments: list[tuple[float, float, float]] = [(0.0, 0.0, self._speed)]
        self._received = 0  # input samples fed
        self._pending: list[tuple[int, float]] = []  # (input sample, speed) from set_speed_at
        self._begin(0)

    def _begin(self, at: int) -> None:
        """Start laying frames at input and output sample ``at`` (0, or where pass-through ends)."""
        self._buf = np.zeros(0, dtype=np.float64)  # input from sample self._buf_start on
        self._buf_start = at
        self._out = np.zeros(self._window, dtype=np.float64)  # output from self._out_start on
        self._out_start = at
        self._origin = at  # output position of frame 0
        self._emitted = at  # output samples returned so far
        self._frames = 0  # frames laid so far
        self._nominal = float(at)  # nominal input position of the next frame
        self._prev = at  # input position the last frame was read from

    def set_speed(self, speed: float) -> None:
        """Apply ``speed`` to the input fed from now on (what was fed keeps the old speed)."""
        speed = check_speed(speed)
        if speed == self._speed:
            return
        at = self._received / self.sample_rate
        self._segments.append((at, self.output_time(at), speed))
        self._speed = speed
        if self._passing:  # input and output times agree up to here: frames start from it
            self._passing = False
            self._begin(self._received)

    def set_speed_at(self, sample: int, speed: float) -> None:
        """Apply ``speed`` from input sample ``sample`` on (now, if it was fed already).

        For a span of an utterance at its own speed (SSML ``<prosody rate>``): where a part's
        audio starts and ends is known in samples of the unstretched stream, possibly before
        that audio is fed; changes apply in the order of their samples.
        """
        speed = check_speed(speed)
        if sample <= self._received:
            self.set_speed(speed)
            return
        self._pending.append((sample, speed))
        self._pending.sort(key=lambda change: change[0])

    def output_time(self, t: float) -> float:
        """Where input time ``t`` (seconds) lands in the output: divided by the speed(s)."""
        for start, out, speed in reversed(self._segments):
            if t >= start:
                return out + (t - start) / speed
        return t  # (negative times)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Stretch the next chunk of int16 samples; returns the int16 output ready now."""
        if not self._pending or self._pending[0][0] >= self._received + len(samples):
            return self._feed(samples)
        out = []
        while self._pending and self._pending[0][0] < self._received + len(samples):
            at, speed = self._pending.pop(0)
            cut = max(at - self._received, 0)
            out.append(self._feed(samples[:cut]))
            samples = samples[cut:]
            self.set_speed(speed)
        out.append(self._feed(samples))
        return np.concatenate(out).astype(np.int16)

    def _feed(self, samples: np.ndarray) -> np.ndarray:
        self._received += len(samples)
        if self._passing:
            return samples
        self._buf = np.concatenate([self._buf, samples.astype(np.float64)])
        return self._run(self._received)

    def flush(self) -> np.ndarray:
        """End the stream: the rest of the output (to the exact length), then reset."""
        if self._passing:
            self.reset()
            return np.zeros(0, dtype=np.int16)
        total = round(self.output_time(self._received / self.sample_rate) * self.sample_rate)
        # silence past the end, so every frame up to the total can be read in full
        left = total - (self._origin + self._frames * self._hop)
        tail = math.ceil(max(left, 0) * SPEED_MAX) + 2 * self._window
        self._buf = np.concatenate([self._buf, np.zeros(tail, dtype=np.float64)])
        out = self._run(self._buf_start + len(self._buf), total=total)
        self.reset()
        return out

    def _run(self, available: int, total: int | None = None) -> np.ndarray:
        """Lay every frame whose input is below ``available``; return the finished output."""
        hop, window = self._hop, self._window
        count, nominal = 0, self._nominal  # frames to lay now
        while math.floor(nominal) + window <= available and (
            total is None or self._origin + (self._frames + count) * hop < total
        ):
            count += 1
            nominal += hop * self._speed
        self._out = np.concatenate([self._out, np.zeros(count * hop)])
        for _ in range(count):
            pos = math.floor(self._nominal)
            if self._frames == 0:
                at, weights = pos, self._first
            else:
                at, weights = self._best(pos), self._hann
            frame = self._buf[at - self._buf_start : at + window - self._buf_start]
            start = self._origin + self._frames * hop - self._out_start
            self._out[start : start + window] += weights * frame
            self._prev = at
            self._frames += 1
            self._nominal += hop * self._speed
        # outputs before the next frame's start are final
        done = self._origin + self._frames * hop if total is None else total
        return self._take(done)

    def _best(self, pos: int) -> int:
        """Input position in [pos - hop, pos] whose first half best continues the last frame."""
        hop, base = self._hop, self._buf_start
        lo = max(pos - hop, self._origin)
        template = self._buf[self._prev + hop - base : self._prev + 2 * hop - base]
        region = self._buf[lo - base : pos + hop - base]
        corr = np.correlate(region, template, mode="valid")  # (pos - lo + 1,)
        energy = np.cumsum(np.concatenate([[0.0], region * region]))
        norm = np.sqrt(np.maximum(energy[hop:] - energy[:-hop], 0.0)) + 1e-3
        return lo + int(np.argmax(corr / norm))

    def _take(self, done: int) -> np.ndarray:
        """Output samples up to ``done`` as int16; drop input no later frame can read."""
        count = max(done - self._emitted, 0)
        begin = self._emitted - self._out_start
        y = self._out[begin : begin + count]
        out = np.clip(np.rint(y), -32768, 32767).astype(np.int16)
        self._emitted += count
        drop = self._emitted - self._out_start
        if drop > 0:
            self._out = self._out[drop:]
            self._out_start += drop
        # the next frame reads from pos - hop at the earliest; its template from prev + hop
        keep = min(math.floor(self._nominal) - self._hop, self._prev + self._hop)
        if keep > self._buf_start:
            self._buf = self._buf[keep - self._buf_start :]
            self._buf_start = keep
        return out


def stretch(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """A whole clip of int16 samples at ``speed`` (one stream: process, then flush)."""
    stretcher = TimeStretcher(sample_rate, speed)
    return np.concatenate([stretcher.process(samples), stretcher.flush()])
