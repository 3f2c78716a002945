"""Speech-like test clips from espeak-ng (a Debian package the test machines install)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from pipecat_veena.audio import int16_to_float, read_wav
from pipecat_veena.resample import resample_bytes

SENTENCE = "The quick brown fox jumps over the lazy dog while seven engineers argue about latency. "


def espeak_wav(path: Path, text: str, voice: str = "en", wpm: int = 175, pitch: int = 50) -> Path:
    """Write espeak-ng's speech of ``text`` to ``path`` (mono int16 WAV at 22050 Hz)."""
    assert shutil.which("espeak-ng"), "espeak-ng (Debian package) is needed for speech clips"
    cmd = ["espeak-ng", "-w", str(path), "-v", voice, "-s", str(wpm), "-p", str(pitch), text]
    subprocess.run(cmd, check=True, capture_output=True)
    return path


def espeak(
    tmp: Path, voice: str, wpm: int, pitch: int, repeats: int, rate: int = 16000
) -> np.ndarray:
    """espeak-ng speech at ``rate``, float32 in [-1, 1]: "Hello." or ``repeats`` sentences."""
    text = "Hello." if repeats == 0 else SENTENCE * repeats
    path = espeak_wav(tmp / f"{voice}-{wpm}-{pitch}-{repeats}.wav", text, voice, wpm, pitch)
    pcm, source_rate = read_wav(path)
    return int16_to_float(resample_bytes(pcm.astype("<i2").tobytes(), source_rate, rate))
