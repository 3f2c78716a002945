"""Audio on the wire: a WAV header for a stream of unknown length, and server-sent events.

All PCM here is mono little-endian int16.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from pipecat_veena.audio import BYTES_PER_SAMPLE
from pipecat_veena.interface import WordTiming
from pipecat_veena.remote.protocol import word_json

#: RIFF and data sizes of a WAV whose length is not known when its header is sent.
_UNKNOWN_SIZE = 0xFFFFFFFF


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


def sse_words(words: list[WordTiming]) -> bytes:
    """Our ``speech.words`` event (OpenAI's clients skip types they do not know).

    ``words``: as the WebSocket's ``words`` message carries them (``word_json``); estimates.
    """
    payload = {"type": "speech.words", "words": [word_json(w) for w in words], "estimated": True}
    return sse_event(payload)


def sse_audio_done(output_tokens: int) -> bytes:
    """OpenAI's ``speech.audio.done`` event with the usage (LLM tokens generated)."""
    usage = {"input_tokens": 0, "output_tokens": output_tokens, "total_tokens": output_tokens}
    return sse_event({"type": "speech.audio.done", "usage": usage})
