"""Pure audio helpers: float/int16 conversion, crossfades, SNR, WAV files (numpy only)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

#: Bytes per sample of the int16 PCM this package emits.
BYTES_PER_SAMPLE = 2
_INT16_SCALE = 32767.0


def float_to_int16(audio: np.ndarray) -> np.ndarray:
    """Convert float audio in [-1, 1] to int16, clipping out-of-range values.

    Args:
        audio: float array of any shape.

    Returns:
        int16 array of the same shape (0.5 becomes 16384 by rounding, -1.0 becomes -32767).
    """
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return np.rint(clipped * _INT16_SCALE).astype(np.int16)


def int16_to_float(pcm: np.ndarray | bytes) -> np.ndarray:
    """Convert int16 PCM (array or little-endian bytes) to float32 in [-1, 1]."""
    if isinstance(pcm, bytes | bytearray | memoryview):
        pcm = np.frombuffer(pcm, dtype="<i2")
    return np.asarray(pcm, dtype=np.float32) / _INT16_SCALE


def to_pcm_bytes(audio: np.ndarray) -> bytes:
    """Float audio in [-1, 1] to mono little-endian int16 bytes."""
    return float_to_int16(audio).astype("<i2").tobytes()


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (inf when identical)."""
    reference = np.asarray(reference, dtype=np.float64)
    test = np.asarray(test, dtype=np.float64)
    if reference.shape != test.shape:
        raise ValueError(f"snr_db needs equal shapes, got {reference.shape} and {test.shape}")
    noise = float(np.sum((reference - test) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * np.log10(max(signal, 1e-30) / noise)


def write_wav(path: str | Path, pcm: bytes, sample_rate: int) -> Path:
    """Write mono int16 PCM bytes to a WAV file and return its path."""
    path = Path(path)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(BYTES_PER_SAMPLE)
        f.setframerate(sample_rate)
        f.writeframes(pcm)
    return path


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a mono int16 WAV file: returns (int16 samples, sample rate)."""
    with wave.open(str(path), "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != BYTES_PER_SAMPLE:
            raise ValueError(f"{path}: expected mono 16-bit PCM")
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2"), f.getframerate()


class ProgressiveFramer:
    """Cuts a stream of PCM into frames that start small and grow (20, 40, 80, 160, 200 ms).

    Small first frames reach the listener sooner; larger later frames cost less per frame.
    Nothing is held back: every byte given to ``split`` comes out of that call.

    Args:
        sample_rate: rate of the PCM.
        first_ms: duration of the first frame.
        max_ms: the size frames grow to.
    """

    def __init__(self, sample_rate: int, *, first_ms: int = 20, max_ms: int = 200) -> None:
        self._bytes_per_ms = sample_rate * BYTES_PER_SAMPLE / 1000
        self._next_ms = first_ms
        self._max_ms = max_ms

    def split(self, pcm: bytes) -> list[bytes]:
        """Cut ``pcm`` (int16 bytes) into frames of growing size, in order."""
        frames = []
        offset = 0
        while offset < len(pcm):
            size = int(self._next_ms * self._bytes_per_ms) & ~1
            frames.append(pcm[offset : offset + size])
            offset += size
            self._next_ms = min(self._next_ms * 2, self._max_ms)
        return frames
