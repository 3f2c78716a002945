"""The OpenAI route's response formats: what each costs the server per second of speech, how
many bytes it sends, what the first chunk yields, and how close the decoded audio is.

Input: 10 s of a gliding tone with a syllable-rate envelope at 24 kHz (OpenAI's rate), fed in
80 ms chunks (the engine's first-chunk size) through ``pipecat_veena.server.encode``. The
encoder runs on the server's event loop, so its CPU per second of audio is the share of one
core each real-time stream takes.

    .venv/bin/python -m benchmarks.encode
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from decoded import decode  # noqa: E402

from benchmarks._report import cli, update_section  # noqa: E402
from pipecat_veena.audio import snr_db  # noqa: E402
from pipecat_veena.server.encode import FORMATS, StreamEncoder, check_format  # noqa: E402

RATE = 24000
CHUNK = RATE * 80 // 1000
SECONDS = 10.0


def _signal() -> np.ndarray:
    t = np.arange(int(RATE * SECONDS)) / RATE
    phase = 2 * np.pi * (200 * t + 35 * t**2)
    return (np.sin(phase) * (0.3 + 0.25 * np.sin(2 * np.pi * 4 * t)) * 26000).astype("<i2")


def _decode(data: bytes, name: str) -> np.ndarray:
    if name == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
    return decode(data, RATE)


def measure(name: str, repeats: int = 3) -> dict[str, float]:
    """CPU ms per second of audio (best of ``repeats``), kbit/s, first-chunk bytes, delay, SNR."""
    pcm = _signal()
    best, data, first = float("inf"), b"", 0
    for _ in range(repeats):
        start = time.perf_counter()
        encoder = StreamEncoder(check_format(name, RATE), RATE)
        pieces = [encoder.head()]
        for i in range(0, len(pcm), CHUNK):
            pieces.append(encoder.encode(pcm[i : i + CHUNK].tobytes()))
        pieces.append(encoder.finish())
        best = min(best, time.perf_counter() - start)
        data, first = b"".join(pieces), len(pieces[0]) + len(pieces[1])
    out = _decode(data, name)
    ref = pcm.astype(np.float32) / 32768.0
    delay = int(np.argmax(np.correlate(out[:6000], ref[:3000], mode="valid")))
    return {
        "ms_per_s": best * 1000 / SECONDS,
        "kbps": len(data) * 8 / SECONDS / 1000,
        "first": first,
        "delay_ms": delay / RATE * 1000,
        "snr": snr_db(ref, out[delay : delay + len(ref)]),
    }


def main(write: bool) -> str:
    """Measure every format; write the BENCHMARKS.md section."""
    lines = [
        f"{SECONDS:g} s of a gliding tone (24 kHz mono) in 80 ms chunks. CPU: encoder time per "
        "second of audio (best of 3), i.e. the share of one core a real-time stream costs the "
        "server. First chunk: bytes sent after the first 80 ms chunk. Delay: where the decoded "
        "audio starts (a lossy encoder's priming that a stream cannot signal). SNR: decoded vs "
        "input after that delay.",
        "",
        "| format | CPU ms per s of audio | kbit/s sent | first chunk bytes | delay ms | SNR dB |",
        "|---|---|---|---|---|---|",
    ]
    for name in FORMATS:
        m = measure(name)
        snr = "exact" if m["snr"] > 90 else f"{m['snr']:.1f}"
        lines.append(
            f"| {name} | {m['ms_per_s']:.2f} | {m['kbps']:.0f} | {m['first']} | "
            f"{m['delay_ms']:.1f} | {snr} |"
        )
    body = "\n".join(lines)
    if write:
        update_section(
            "encode",
            "Speech server: response formats (encoding cost and delay)",
            "python -m benchmarks.encode",
            body,
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
