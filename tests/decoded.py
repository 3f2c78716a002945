"""What the speech server's compressed responses decode to (PyAV), for the tests and
benchmarks/encode.py."""

from __future__ import annotations

import io

import av
import numpy as np


def decode(data: bytes, rate: int) -> np.ndarray:
    """A whole mp3 / Ogg Opus / ADTS / FLAC response as float32 mono at ``rate``.

    Decoders give their own rate (Opus always 48 kHz): the audio is resampled back to ``rate``.
    """
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    with av.open(io.BytesIO(data)) as container:
        frames = [r for f in container.decode(audio=0) for r in resampler.resample(f)]
    frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


def decoded_samples(data: bytes, rate: int) -> int:
    """How many samples at ``rate`` a compressed response decodes to (frame lengths, scaled)."""
    with av.open(io.BytesIO(data)) as container:
        return sum(f.samples * rate // f.sample_rate for f in container.decode(audio=0))
