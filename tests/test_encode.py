"""The OpenAI route's response formats: chunk-by-chunk encoding loses and repeats nothing."""

from __future__ import annotations

import numpy as np
import pytest
from decoded import decode

from pipecat_veena.audio import snr_db
from pipecat_veena.server.encode import FORMATS, StreamEncoder, check_format

RATE = 24000
COMPRESSED = [name for name, fmt in FORMATS.items() if fmt.container is not None]


def _speechlike(seconds: float = 1.0) -> np.ndarray:
    """A tone gliding 200 -> 900 Hz with a syllable-rate envelope, int16."""
    t = np.arange(int(RATE * seconds)) / RATE
    phase = 2 * np.pi * (200 * t + 350 * t**2)
    envelope = 0.3 + 0.25 * np.sin(2 * np.pi * 4 * t)
    return (np.sin(phase) * envelope * 32767 * 0.8).astype("<i2")


def _encode(name: str, pcm: np.ndarray, cuts: list[int]) -> tuple[bytes, list[int]]:
    """Encode ``pcm`` split at ``cuts``; returns the bytes and how many each chunk gave."""
    encoder = StreamEncoder(check_format(name, RATE), RATE)
    pieces = [encoder.head()]
    for chunk in np.split(pcm, cuts):
        pieces.append(encoder.encode(chunk.tobytes()))
    pieces.append(encoder.finish())
    return b"".join(pieces), [len(p) for p in pieces[1:-1]]


@pytest.mark.parametrize("name", COMPRESSED)
def test_chunked_encoding_decodes_to_the_same_audio_as_one_piece(name):
    pcm = _speechlike()
    whole, _ = _encode(name, pcm, [])
    chunked, _ = _encode(name, pcm, [1920, 2400, 2401, 9000, 9480, 20000])  # odd seams
    a, b = decode(whole, RATE), decode(chunked, RATE)
    assert len(a) == len(b) and np.array_equal(a, b)


@pytest.mark.parametrize("name", COMPRESSED)
def test_decoded_audio_is_the_input(name):
    pcm = _speechlike()
    data, _ = _encode(name, pcm, list(range(1920, len(pcm), 1920)))
    out = decode(data, RATE)
    ref = pcm.astype(np.float32) / 32768.0
    # lossy encoders add a fixed delay and pad the last frame: find the delay, compare the rest
    corr = np.correlate(out[:4000], ref[:2000], mode="valid")
    delay = int(np.argmax(corr))
    assert delay <= 2200 and len(ref) <= len(out) - delay <= len(ref) + 2400
    floor = {"flac": 90.0}.get(name, 15.0)
    assert snr_db(ref, out[delay : delay + len(ref)]) > floor


@pytest.mark.parametrize("name", ["mp3", "opus"])
def test_low_latency_formats_send_bytes_with_the_first_chunk(name):
    encoder = StreamEncoder(check_format(name, RATE), RATE)
    assert encoder.encode(_speechlike(0.08).tobytes())  # the engine's first 80 ms
    encoder.close()


def test_format_errors_name_what_works():
    with pytest.raises(ValueError, match="use one of pcm, wav, mp3, opus, aac, flac"):
        check_format("ogg", RATE)
    with pytest.raises(ValueError, match="takes sample rates 8000, 12000, 16000, 24000"):
        check_format("opus", 22050)
    assert check_format("MP3", 16000).media_type == "audio/mpeg"
    assert check_format("flac", 44100).name == "flac"


def test_raw_formats_pass_pcm_through():
    pcm = _speechlike(0.1).tobytes()
    wav = StreamEncoder(check_format("wav", 16000), 16000)
    assert wav.head()[:4] == b"RIFF" and wav.encode(pcm) == pcm and wav.finish() == b""
    raw = StreamEncoder(check_format("pcm", RATE), RATE)
    assert raw.head() == b"" and raw.encode(pcm) == pcm
