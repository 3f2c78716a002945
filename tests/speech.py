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


#: Container and encoder of each clip format a voice upload takes (PyAV / FFmpeg names).
CLIP_FORMATS = {
    "wav": ("wav", "pcm_s16le"),
    "mp3": ("mp3", "libmp3lame"),
    "ogg": ("ogg", "libopus"),
    "flac": ("flac", "flac"),
    "m4a": ("ipod", "aac"),
    "mp2": ("mp2", "mp2"),  # a codec voice uploads refuse
}


def encode_clip(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    """Mono float32 ``samples`` at ``rate`` as a file of format ``fmt`` (see CLIP_FORMATS)."""
    import io

    import av

    container, codec = CLIP_FORMATS[fmt]
    sink = io.BytesIO()
    with av.open(sink, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        frame_size = 960
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        for at in range(0, len(pcm), frame_size):
            frame = av.AudioFrame.from_ndarray(pcm[None, at : at + frame_size], "s16", "mono")
            frame.sample_rate = rate
            frame.pts = at
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return sink.getvalue()
