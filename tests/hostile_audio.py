"""Hostile voice uploads, built with PyAV and byte patching (no binary files in the tree).

Each is an attack a review reproduced against ``POST /v1/audio/voices``: a header that claims an
absurd sample rate (the old decode cap was seconds *at the header's rate*), a tiny FLAC that
decodes to a great deal of audio, an SDP file (FFmpeg's sdp demuxer binds UDP ports), and a
clip whose sample rate changes mid-stream. ``HOSTILE`` names them all for the benchmark.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

import av
import numpy as np


def _encode(
    samples: np.ndarray, rate: int, container: str, codec: str, layout: str = "mono", **opts: str
) -> bytes:
    """Float32 ``samples`` (frames x channels, or mono) encoded with PyAV."""
    sink = io.BytesIO()
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    pcm = pcm.reshape(len(pcm), -1)
    with av.open(sink, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout, options=opts)
        step = 4096
        for at in range(0, len(pcm), step):
            chunk = np.ascontiguousarray(pcm[at : at + step].T.reshape(1, -1))
            frame = av.AudioFrame.from_ndarray(chunk, "s16", layout)
            frame.sample_rate = rate
            frame.pts = at
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return sink.getvalue()


def _noise(seconds: float, rate: int, level: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(7)
    return (level * rng.standard_normal(int(seconds * rate))).astype(np.float32)


def _ogg_crc(page: bytes) -> int:
    crc = 0
    for byte in page:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _patch_ogg_page(data: bytearray, at: int) -> None:
    """Recompute the CRC of the Ogg page holding byte ``at`` after it was patched."""
    start = data.rfind(b"OggS", 0, at + 1)
    segments = data[start + 26]
    length = 27 + segments + sum(data[start + 27 : start + 27 + segments])
    data[start + 22 : start + 26] = b"\0\0\0\0"
    data[start + 22 : start + 26] = struct.pack("<I", _ogg_crc(bytes(data[start : start + length])))


def vorbis_claiming_rate(rate: int = 2_000_000_000, seconds: float = 20.0) -> bytes:
    """Ogg Vorbis whose identification header claims ``rate`` Hz (its audio: 8 kHz stereo)."""
    data = bytearray(
        _encode(
            np.repeat(_noise(seconds, 8000)[:, None], 2, 1),
            8000,
            "ogg",
            "vorbis",
            "stereo",
            strict="experimental",  # FFmpeg's own Vorbis encoder (stereo only)
        )
    )
    at = data.index(b"\x01vorbis") + 7 + 4 + 1  # after the version (4) and channels (1)
    data[at : at + 4] = struct.pack("<I", rate)
    _patch_ogg_page(data, at)
    return bytes(data)


def flac_bomb(blocks: int = 200, rate: int = 655350, channels: int = 8) -> bytes:
    """A FLAC of ``blocks`` identical blocks of silence at ``rate`` Hz and ``channels``: about
    32 bytes a block of tens of thousands of samples a channel, so a few KB decode to hundreds of
    MB; its STREAMINFO says the length is unknown."""
    layout = {1: "mono", 2: "stereo", 8: "7.1"}[channels]
    encoded = _encode(np.zeros((1 << 16, channels), np.float32), rate, "flac", "flac", layout)
    with av.open(io.BytesIO(encoded), format="flac") as container:
        block = bytes(next(iter(container.demux(container.streams.audio[0]))))
    at = encoded.index(b"fLaC") + 4
    info = bytearray(encoded[at + 4 : at + 4 + 34])  # STREAMINFO alone, the last metadata block
    packed = int.from_bytes(info[10:18], "big") & ~((1 << 36) - 1)  # total samples: unknown
    info[10:18] = packed.to_bytes(8, "big")
    info[18:34] = bytes(16)  # no MD5
    return b"fLaC" + bytes([0x80, 0, 0, 34]) + bytes(info) + block * blocks


def sdp(port: int) -> bytes:
    """An SDP description (150 bytes): FFmpeg's sdp demuxer would bind UDP port ``port``."""
    return (
        "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=voice\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    ).encode()


def rate_change_mp3(seconds: float = 4.0, clip: np.ndarray | None = None) -> bytes:
    """An MP3 at 44.1 kHz whose frames switch to 22.05 kHz half way (a valid MPEG stream):
    ``seconds`` of noise each half, or ``clip`` (44.1 kHz) then ``clip`` again at 22.05 kHz."""
    first = clip if clip is not None else _noise(seconds, 44100)
    second = first[::2] if clip is not None else _noise(seconds, 22050)
    return _encode(first, 44100, "mp3", "libmp3lame") + _frames_only(
        _encode(second, 22050, "mp3", "libmp3lame")
    )


def _frames_only(mp3: bytes) -> bytes:
    """``mp3`` without its ID3 tag."""
    if mp3[:3] == b"ID3":
        size = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(mp3[6:10]))
        mp3 = mp3[size:]
    return mp3


def webm_opus(samples: np.ndarray, rate: int = 48000) -> bytes:
    """``samples`` at ``rate`` as WebM / Opus, what Chromium's MediaRecorder records."""
    return _encode(samples, rate, "webm", "libopus")


#: Every hostile upload (name -> bytes), for the benchmark. The SDP names a port per call.
HOSTILE: dict[str, Callable[[], bytes]] = {
    "vorbis_2ghz": vorbis_claiming_rate,
    "flac_bomb": flac_bomb,
    "sdp": lambda: sdp(40000),
    "rate_change": rate_change_mp3,
}
