"""Response formats of ``POST /v1/audio/speech``, encoded chunk by chunk as speech streams.

``pcm`` is the PCM as it is, ``wav`` a header of unknown length and then PCM, and the compressed
formats (``mp3``, ``opus`` in Ogg, ``aac`` in ADTS, ``flac``) go through FFmpeg's encoders and
muxers by way of PyAV, into a sink that never seeks: every byte a chunk produces is sent at
once. What each encoder holds back (its frame size and look-ahead) comes out with the next chunk
or at the end, so no audio is lost or sent twice.

All PCM here is mono little-endian int16.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from loguru import logger

from pipecat_veena.audio import BYTES_PER_SAMPLE
from pipecat_veena.remote.protocol import SAMPLE_RATES
from pipecat_veena.server.audio_out import wav_header

#: Sample rates of MPEG audio (mp3 and aac take these, and nothing in between): the served rates.
_MPEG_RATES = SAMPLE_RATES


@dataclass(frozen=True)
class AudioFormat:
    """One ``response_format``.

    Attributes:
        name: the name a request uses.
        media_type: the response's Content-Type.
        container: the FFmpeg muxer; None for raw PCM (``pcm``, ``wav``).
        codec: the FFmpeg encoder; None for raw PCM.
        bit_rate: bits per second asked of a lossy encoder (None: the encoder's choice).
        rates: the sample rates the encoder takes; None: any.
        options: muxer options. Ogg: a page per 20 ms, so pages leave as they fill. mp3: no ID3
            tag and no Xing frame (a stream cannot go back to fill in its length), so the body
            is plain MPEG frames from the first byte.
    """

    name: str
    media_type: str
    container: str | None = None
    codec: str | None = None
    bit_rate: int | None = None
    rates: tuple[int, ...] | None = None
    options: tuple[tuple[str, str], ...] = ()


_MP3 = AudioFormat(
    "mp3", "audio/mpeg", container="mp3", codec="libmp3lame", bit_rate=64000, rates=_MPEG_RATES,
    options=(("id3v2_version", "0"), ("write_xing", "0")),
)  # fmt: skip
_OPUS = AudioFormat(
    "opus", "audio/ogg", container="ogg", codec="libopus", bit_rate=32000,
    rates=(8000, 12000, 16000, 24000, 48000), options=(("page_duration", "20000"),),
)  # fmt: skip
_AAC = AudioFormat(
    "aac", "audio/aac", container="adts", codec="aac", bit_rate=64000, rates=_MPEG_RATES
)
_FLAC = AudioFormat("flac", "audio/flac", container="flac", codec="flac")

#: Every format the route serves, by name.
FORMATS = {
    f.name: f
    for f in (AudioFormat("pcm", "audio/pcm"), AudioFormat("wav", "audio/wav"), _MP3, _OPUS, _AAC,
              _FLAC)
}  # fmt: skip


def check_format(name: str, sample_rate: int) -> AudioFormat:
    """The format called ``name`` (any case) if it can carry ``sample_rate``.

    Raises:
        ValueError: an unknown format, or a rate its encoder does not take; the message lists
            what would work.
    """
    fmt = FORMATS.get(name.lower())
    if fmt is None:
        raise ValueError(
            f"response_format {name!r} is not supported; use one of {', '.join(FORMATS)} "
            "('pcm' is 24 kHz s16le mono with no header, as OpenAI's)"
        )
    if fmt.rates is not None and sample_rate not in fmt.rates:
        rates = ", ".join(str(r) for r in fmt.rates)
        raise ValueError(
            f"response_format {fmt.name!r} takes sample rates {rates} Hz, not {sample_rate}; "
            "leave 'sample_rate' out for 24000"
        )
    return fmt


class _Sink:
    """A write-only, non-seekable file for PyAV's muxer: it collects what the muxer writes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamEncoder:
    """Turns a stream of PCM chunks into the bytes of one response, piece by piece.

    Args:
        fmt: the response format (from ``check_format``).
        sample_rate: the PCM's rate (the response's rate).
    """

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        self.format = fmt
        self.sample_rate = sample_rate
        self._samples = 0
        self._container = None
        if fmt.container is None:
            return
        import av  # the server extra installs PyAV (FFmpeg's encoders and muxers)

        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=fmt.container,
                                  options=dict(fmt.options))  # fmt: skip
        stream = self._container.add_stream(fmt.codec, rate=sample_rate)
        stream.layout = "mono"
        if fmt.bit_rate is not None:
            stream.bit_rate = fmt.bit_rate
        self._stream = stream
        self._av = av

    def head(self) -> bytes:
        """What goes before the first chunk (the WAV header; nothing for the others)."""
        return wav_header(self.sample_rate) if self.format.name == "wav" else b""

    def encode(self, pcm: bytes) -> bytes:
        """The bytes ready to send after ``pcm`` (possibly none: an encoder filling a frame)."""
        if self._container is None:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._samples
        frame.time_base = Fraction(1, self.sample_rate)
        self._samples += len(pcm) // BYTES_PER_SAMPLE
        return self._mux(self._stream.encode(frame))

    def finish(self) -> bytes:
        """The rest: what the encoder held back and the container's trailer."""
        if self._container is None:
            return b""
        out = self._mux(self._stream.encode(None))
        self.close()
        return out + self._sink.take()

    def close(self) -> None:
        """Release the encoder (safe to call twice; after ``finish`` it does nothing)."""
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except Exception as e:  # a stream cut short: the trailer may not fit; nothing to send
                logger.debug(f"speech server: closing a {self.format.name} encoder: {e}")

    def _mux(self, packets: list) -> bytes:
        for packet in packets:
            self._container.mux(packet)
        return self._sink.take()
