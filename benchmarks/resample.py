"""Stream resampling for the wire: how much of the engine's first chunk each resampler lets out at
once, how close the result is to an offline resample, and what it costs per chunk.

The engine's first BiCodec chunk is 4 frames (80 ms at 16 kHz; SNAC's first is 1 frame at
24 kHz). A resampler that holds it back makes the caller wait for the second chunk. Compared:
``pipecat_veena.resample.StreamResampler`` and soxr's ResampleStream (what Pipecat's
``create_stream_resampler`` uses, quality VHQ, and LiveKit plugins, HQ). Quality: a 440 Hz +
1-3 kHz chirp mix resampled in random chunk sizes, against soxr VHQ resampling the whole clip.

    .venv/bin/python -m benchmarks.resample
"""

from __future__ import annotations

import time

import numpy as np
import soxr

from benchmarks._report import cli, update_section
from pipecat_veena.resample import StreamResampler

CASES = [(16000, r) for r in (8000, 16000, 22050, 24000, 44100, 48000)] + [(24000, 8000)]
FIRST_MS = 80


def _signal(rate: int, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (1000 * t + 500 * t * t))


def _first_ms(make, rate_in: int, rate_out: int) -> float:
    """Milliseconds of audio out of the first 80 ms chunk."""
    chunk = (_signal(rate_in)[: rate_in * FIRST_MS // 1000] * 32767).astype("<i2")
    return len(make(chunk)) / rate_out * 1000


def _ours(rate_in: int, rate_out: int):
    resampler = StreamResampler(rate_in, rate_out)
    return lambda x: np.frombuffer(resampler.resample(x.tobytes()), "<i2")


def _soxr(rate_in: int, rate_out: int, quality: str):
    stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="int16", quality=quality)
    return lambda x: stream.resample_chunk(x)


def _quality(rate_in: int, rate_out: int) -> tuple[float, float]:
    """SNR (dB) of ours in random chunks vs soxr VHQ offline; microseconds per 20 ms chunk."""
    x = _signal(rate_in)
    pcm = (x * 32767).astype("<i2")
    rng = np.random.default_rng(0)
    resampler, parts, pos, spent, chunks = StreamResampler(rate_in, rate_out), [], 0, 0.0, 0
    while pos < len(pcm):
        n = int(rng.integers(rate_in // 100, rate_in // 10))
        start = time.perf_counter()
        parts.append(resampler.resample(pcm[pos : pos + n].tobytes()))
        spent += time.perf_counter() - start
        chunks += n / (rate_in * 0.02)
        pos += n
    parts.append(resampler.flush())
    ours = np.frombuffer(b"".join(parts), "<i2").astype(float)
    reference = soxr.resample(x * 32767, rate_in, rate_out, quality="VHQ")
    n = min(len(ours), len(reference))
    cut = slice(rate_out // 100, n - rate_out // 100)  # the edges differ by design (padding)
    err = ours[cut] - reference[cut]
    snr = 10 * np.log10(np.sum(reference[cut] ** 2) / max(np.sum(err**2), 1e-9))
    return snr, spent / chunks * 1e6


def main(write: bool) -> str:
    """Measure every case; write the BENCHMARKS.md section."""
    lines = [
        f"First chunk: {FIRST_MS} ms of codec audio pushed into a fresh stream resampler; the "
        "columns give the milliseconds of audio that come out at once (the rest waits for the "
        "next chunk). Quality: SNR of ours (random 10-100 ms chunks) against soxr VHQ on the "
        "whole clip; cost: CPU per 20 ms of input.",
        "",
        "| in -> out Hz | ours | soxr VHQ (Pipecat) | soxr HQ (LiveKit) | ours: held back ms "
        "| SNR vs soxr VHQ dB | us per 20 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for rate_in, rate_out in CASES:
        ours = _first_ms(_ours(rate_in, rate_out), rate_in, rate_out)
        vhq = _first_ms(_soxr(rate_in, rate_out, "VHQ"), rate_in, rate_out)
        hq = _first_ms(_soxr(rate_in, rate_out, "HQ"), rate_in, rate_out)
        snr, cost = _quality(rate_in, rate_out)
        held = StreamResampler(rate_in, rate_out).lookahead_s * 1000
        lines.append(
            f"| {rate_in} -> {rate_out} | {ours:.1f} | {vhq:.1f} | {hq:.1f} | {held:.1f} | "
            f"{'passthrough' if rate_in == rate_out else f'{snr:.1f}'} | {cost:.0f} |"
        )
    body = "\n".join(lines)
    if write:
        update_section(
            "resample",
            "Stream resampling: first audio at every output rate",
            "python -m benchmarks.resample",
            body,
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
