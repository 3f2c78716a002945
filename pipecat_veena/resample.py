"""A streaming resampler with a few milliseconds of lookahead (numpy only).

General-purpose stream resamplers buffer a lot: soxr's ResampleStream at its default qualities
returns nothing at all for an 80 ms chunk at 16 -> 8 kHz, so a phone caller would wait for the
engine's second chunk. This one is a polyphase windowed-sinc (Kaiser) FIR evaluated on the exact
output grid: an output sample needs only ``half_taps`` input samples past its own time, so each
chunk comes out at once except that lookahead (2 ms when upsampling from 16 kHz, 4 ms at 16 -> 8
kHz), which ``flush()`` releases at the end. Every output sample is the same dot product however
the input was chunked, so chunk joins are seamless; the total length is
``round(samples_in * out_rate / in_rate)``.

Any pair of rates works. Where the reduced ratio has few phases (every pair of the standard rates:
441 at most, for 16 -> 44.1 kHz) each phase has its own row of taps; beyond ``_EXACT_PHASES_MAX``
(16 -> 44.123 kHz has 44,123) the filter is tabulated at ``_TABLE_PHASES`` fractional positions
and each output's taps are interpolated linearly between the two rows around its position (as
libsamplerate and Speex do), so the table stays under a megabyte whatever the rates. Positions are
exact integers either way, so the output still does not depend on the chunking.

Letters: L / M the reduced up / down factors (out_rate / in_rate = L / M); T taps per phase.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pipecat_veena.audio import BYTES_PER_SAMPLE

#: Filter banks kept for reuse, one per (up, down, half, beta): a stream at a given pair of
#: rates builds its bank once per process, not once per stream.
_BANKS_KEPT = 32

#: Up to this many phases each phase has its own row of taps; beyond, rows are interpolated.
_EXACT_PHASES_MAX = 1024
#: Rows of the interpolated table (one more closes the interval [0, 1]): linear interpolation
#: between rows 1/1024 apart is off by under 1e-5 of the peak tap (about -100 dB).
_TABLE_PHASES = 1024

#: Up to this many phases, outputs are computed phase by phase (BLAS matrix-vector products);
#: beyond it, per-output dot products are cheaper than a Python loop over phases.
_PHASE_LOOP_MAX = 32


class StreamResampler:
    """Resamples mono int16 PCM chunk by chunk with a fixed, small lookahead.

    Args:
        in_rate: rate of the input in Hz.
        out_rate: rate of the output in Hz.
        half_taps: input samples on each side of an output sample's position when upsampling
            (doubled per factor of downsampling, to keep the same transition band at the lower
            rate); sets quality and lookahead.
        beta: Kaiser window shape (8.0: about 80 dB stopband).
    """

    def __init__(
        self, in_rate: int, out_rate: int, *, half_taps: int = 32, beta: float = 8.0
    ) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate, self.out_rate = in_rate, out_rate
        g = math.gcd(in_rate, out_rate)
        self._up, self._down = out_rate // g, in_rate // g  # L, M
        self._half = max(1, math.ceil(half_taps * max(1.0, self._down / self._up)))
        self._table = self._up > _EXACT_PHASES_MAX
        # (L, T), or (_TABLE_PHASES + 1, T) rows at fractions 0, 1/P, ... 1 when interpolated
        self._bank = _filter_bank(self._up, self._down, self._half, beta, table=self._table)
        self.reset()

    @property
    def lookahead_s(self) -> float:
        """Audio held back until more input (or ``flush``) arrives, in seconds."""
        return 0.0 if self._passthrough else self._half / self.in_rate

    @property
    def _passthrough(self) -> bool:
        return self._up == self._down

    def reset(self) -> None:
        """Forget the stream (an interruption): the next chunk starts a new one."""
        # Input samples from index self._buf_start on; the stream starts after `half` zeros,
        # so every output's window lies inside the buffer.
        self._buf = np.zeros(self._half, dtype=np.float32)
        self._buf_start = -self._half
        self._received = 0  # input samples received
        self._emitted = 0  # output samples emitted

    def resample(self, pcm: bytes) -> bytes:
        """Resample the next chunk of int16 little-endian PCM; returns what is ready now."""
        if self._passthrough:
            return bytes(pcm)
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        self._buf = np.concatenate([self._buf, x])
        self._received += len(x)
        return self._emit(available=self._received)

    def flush(self) -> bytes:
        """End the stream: emit everything still held back, then reset."""
        if self._passthrough:
            return b""
        total = round(self._received * self._up / self._down)
        self._buf = np.concatenate([self._buf, np.zeros(self._half + 1, dtype=np.float32)])
        out = self._emit(available=self._received + self._half + 1, limit=total)
        self.reset()
        return out

    def _emit(self, *, available: int, limit: int | None = None) -> bytes:
        """Emit every output whose inputs (indices below ``available``) are all there."""
        L, M, half = self._up, self._down, self._half
        # Output n sits at input time n*M/L and needs inputs up to floor(n*M/L) + half.
        end = ((available - half) * L - 1) // M + 1 if available > half else 0
        if limit is not None:
            end = min(end, limit)
        end = max(end, self._emitted)
        n = np.arange(self._emitted, end, dtype=np.int64)
        if len(n) == 0:
            return b""
        base = (n * M) // L  # newest input at or before each output's time
        phase = (n * M) % L
        # (N, T): the inputs at base-half .. base+half of each output
        windows = sliding_window_view(self._buf, 2 * half + 1)[base - half - self._buf_start]
        if self._table:  # taps interpolated between the two rows around each position
            at = phase * _TABLE_PHASES  # (exact: phase < L <= 48000)
            row = at // L
            frac = ((at % L) / L).astype(np.float32)[:, None]
            taps = self._bank[row] * (1 - frac) + self._bank[row + 1] * frac  # (N, T)
            y = np.einsum("nt,nt->n", windows, taps)
        elif L <= _PHASE_LOOP_MAX:  # few phases: one matrix-vector product per phase
            y = np.empty(len(n), dtype=np.float32)
            for p in range(min(L, len(n))):
                y[p::L] = windows[p::L] @ self._bank[phase[p]]
        else:  # many phases (e.g. 441 for 16 -> 44.1 kHz): per-output dot products
            y = np.einsum("nt,nt->n", windows, self._bank[phase])
        self._emitted = end
        # Inputs before the next output's window are never needed again.
        keep_from = (end * M) // L - half - self._buf_start
        if keep_from > 0:
            self._buf = self._buf[keep_from:]
            self._buf_start += keep_from
        return np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()


@functools.lru_cache(maxsize=_BANKS_KEPT)
def _filter_bank(up: int, down: int, half: int, beta: float, *, table: bool = False) -> np.ndarray:
    """Polyphase bank (L, T): row p weights inputs at offsets -half..half for phase p.

    Cached (one per rate pair and shape) and read-only: every stream at that pair shares it.
    With ``table``, (_TABLE_PHASES + 1, T): row r is for the fraction r / _TABLE_PHASES.

    Output n at input time t = n*M/L, with phase p = n*M mod L, takes the inputs at
    floor(t) + k (k in -half..half), each weighted by a Kaiser-windowed sinc of its distance
    to t; the cutoff sits below the lower Nyquist frequency so nothing aliases.
    """
    cutoff = 0.5 * min(1.0, up / down) * 0.94  # cycles per input sample, just below Nyquist
    k = np.arange(-half, half + 1, dtype=np.float64)
    if table:  # (P + 1, 1): fractions 0, 1/P, ..., 1
        frac = np.arange(_TABLE_PHASES + 1, dtype=np.float64)[:, None] / _TABLE_PHASES
    else:  # (L, 1): t - floor(t) per phase
        frac = np.arange(up, dtype=np.float64)[:, None] / up
    dist = k[None, :] - frac  # (L, T): input offset minus output time
    radius = half + 1.0  # the window reaches zero just past the outermost tap
    w = np.i0(beta * np.sqrt(np.clip(1.0 - (dist / radius) ** 2, 0.0, None))) / np.i0(beta)
    bank = 2 * cutoff * np.sinc(2 * cutoff * dist) * w
    bank /= bank.sum(axis=1, keepdims=True)  # unity gain at DC for every phase
    bank = bank.astype(np.float32)
    bank.flags.writeable = False
    return bank


def prepare_banks(in_rate: int, out_rates: Iterable[int]) -> None:
    """Build and keep the filter banks of streams from ``in_rate`` to each of ``out_rates``.

    A bank takes up to tens of milliseconds to build (441 phases at 16 -> 11.025 kHz); a server
    calls this off its event loop at start, so that no stream builds one on the loop.
    """
    for rate in out_rates:
        StreamResampler(in_rate, rate)


def resample_bytes(pcm: bytes, in_rate: int, out_rate: int) -> bytes:
    """Resample a whole clip of int16 PCM (one stream: chunk, then flush)."""
    resampler = StreamResampler(in_rate, out_rate)
    return resampler.resample(pcm) + resampler.flush()


#: Bytes per int16 sample, re-exported for callers that size buffers.
__all__ = ["BYTES_PER_SAMPLE", "StreamResampler", "prepare_banks", "resample_bytes"]
