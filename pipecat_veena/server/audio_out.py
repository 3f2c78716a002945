"""Audio on the wire: a streaming resampler, a WAV header for a stream of unknown length, SSE.

All PCM here is mono little-endian int16.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import numpy as np
import soxr

from pipecat_veena.audio import BYTES_PER_SAMPLE

#: RIFF and data sizes of a WAV whose length is not known when its header is sent.
_UNKNOWN_SIZE = 0xFFFFFFFF


class StreamResampler:
    """Resamples one utterance's PCM as it streams (one soxr stream: no seams between chunks).

    Every chunk comes out at once, less the filter's few milliseconds of delay, which
    ``flush()`` returns at the end. Equal rates pass through untouched.

    Args:
        in_rate: rate of the PCM pushed in.
        out_rate: rate of the PCM that comes out.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality="HQ")
        )

    def push(self, pcm: bytes) -> bytes:
        """Resample the next piece of the stream (may return fewer bytes at first)."""
        if self._stream is None:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2")
        return self._stream.resample_chunk(samples).astype("<i2").tobytes()

    def flush(self) -> bytes:
        """The tail the filter still holds; call once, at the end of the utterance."""
        if self._stream is None:
            return b""
        empty = np.zeros(0, dtype="<i2")
        return self._stream.resample_chunk(empty, last=True).astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None = None) -> bytes:
    """A 44-byte mono int16 WAV header; ``None`` samples: a stream (sizes 0xFFFFFFFF)."""
    if num_samples is None:
        riff_size = data_size = _UNKNOWN_SIZE
    else:
        data_size = num_samples * BYTES_PER_SAMPLE
        riff_size = 36 + data_size
    byte_rate = sample_rate * BYTES_PER_SAMPLE
    return (
        struct.pack("<4sI4s", b"RIFF", riff_size, b"WAVE")
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, sample_rate, byte_rate, BYTES_PER_SAMPLE, 16)
        + struct.pack("<4sI", b"data", data_size)
    )


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def sse_audio_delta(pcm: bytes) -> bytes:
    """OpenAI's ``speech.audio.delta`` event (base64 PCM in ``audio``)."""
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()})


def sse_audio_done(output_tokens: int) -> bytes:
    """OpenAI's ``speech.audio.done`` event with the usage (LLM tokens generated)."""
    usage = {"input_tokens": 0, "output_tokens": output_tokens, "total_tokens": output_tokens}
    return sse_event({"type": "speech.audio.done", "usage": usage})
