"""Voice-clip uploads: a multipart body parsed in memory, and its audio decoded with PyAV.

``POST /v1/audio/voices`` reads its body against ``max_upload_bytes`` (Content-Length first,
then its size as it streams, within ``body_timeout_s``), parses the multipart form in memory
(no part is spooled to a temporary file: nothing uploaded ever touches the disk) and decodes the
``file`` part from memory. Only what browsers and phones record is opened: WAV (PCM), FLAC,
MP3, Ogg (Opus or Vorbis), M4A / MP4 / AAC (ADTS) and WebM (Opus), recognised by their first
bytes and opened with that one FFmpeg demuxer (no other demuxer, so no file or network a
demuxer could reach for: an SDP or playlist upload is refused before FFmpeg sees it). The
header's codec, sample rate (8-192 kHz), channels (at most 8) and duration are checked before
decoding; decoding resamples to ``DECODE_RATE`` mono float32 and stops once the *output* is
longer than an enrolment clip may be, so no header, and no mid-stream rate change, moves the
cap: a small, very compressible file cannot make the server decode hours.
Every refusal is a ``ProtocolError`` whose code and message name the problem.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import av
import numpy as np
from loguru import logger
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartException, MultiPartParser

from pipecat_veena.remote.protocol import ErrorCode, ProtocolError

#: Containers a clip may come in: the demuxer FFmpeg is told to use for each (no other demuxer
#: ever runs on an upload: not sdp, rtp, hls, concat, image2 ...) and what its bytes start with.
CONTAINERS = {
    "wav": "wav",  # RIFF....WAVE
    "flac": "flac",  # fLaC
    "ogg": "ogg",  # OggS: Vorbis, Opus (Firefox's MediaRecorder), Ogg FLAC
    "mp3": "mp3",  # ID3 tag or an MPEG audio frame
    "aac": "aac",  # an ADTS frame
    "mp4": "mov",  # ....ftyp: M4A, MP4 (Safari's MediaRecorder, phones' voice memos)
    "webm": "matroska",  # EBML: WebM / Matroska (Chromium's MediaRecorder: WebM / Opus)
}
#: Decoders a clip may use: PCM in WAV (any ``pcm_*``), MP3, Opus and Vorbis, AAC, FLAC, ALAC.
CODECS = frozenset({"mp3", "mp3float", "opus", "libopus", "vorbis", "libvorbis", "aac", "flac",
                    "alac"})  # fmt: skip
#: What a refusal of another format or codec lists.
FORMATS = "WAV (PCM), FLAC, MP3, Ogg (Opus or Vorbis), M4A / MP4 / AAC or WebM (Opus)"
#: Sample rates (Hz) a clip's header and every decoded frame must have.
MIN_RATE, MAX_RATE = 8000, 192000
#: Most channels a clip may have.
MAX_CHANNELS = 8
#: The rate every clip is decoded to (the speaker encoder's): the cap on decoded samples is
#: ``max_seconds`` at this rate, whatever the file's header says.
DECODE_RATE = 16000
#: A declared duration may exceed the cap by this much (container estimates are rough).
_DURATION_SLACK_S = 1.0
#: FFmpeg options for every upload: no file or network a demuxer could reach for.
_OPTIONS = {"protocol_whitelist": "none", "enable_drefs": "0"}
#: Most form fields a voice upload has (file, name, transcript, consent).
MAX_FIELDS = 8


class _InMemoryParser(MultiPartParser):
    """Starlette's multipart parser with every file part kept in memory (the body is capped)."""

    spool_max_size = 1 << 62


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def parse_form(headers: Headers, body: bytes) -> FormData:
    """The multipart form of an upload's (already capped) body.

    Raises:
        ProtocolError: ``bad_message`` when the body is not ``multipart/form-data``.
    """
    if not headers.get("content-type", "").startswith("multipart/form-data"):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            "send the voice as multipart/form-data with the fields 'file' (the clip), 'name' "
            "and 'consent' (true), e.g. curl -F file=@clip.wav -F name=asha -F consent=true",
        )
    parser = _InMemoryParser(
        headers, _once(body), max_files=1, max_fields=MAX_FIELDS, max_part_size=len(body) + 1
    )
    try:
        return await parser.parse()
    except MultiPartException as e:
        message = f"the multipart form is malformed: {e}"
        raise ProtocolError(ErrorCode.BAD_MESSAGE, message) from None


def sniff_container(data: bytes) -> str:
    """The demuxer (a value of ``CONTAINERS``) for a clip, from its first bytes.

    Raises:
        ProtocolError: ``not_audio`` for an empty file or one in no accepted container.
    """
    if not data:
        raise ProtocolError(ErrorCode.NOT_AUDIO, "the 'file' part is empty: attach the voice clip")
    head = data[:12]
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return CONTAINERS["wav"]
    if head[:4] == b"fLaC":
        return CONTAINERS["flac"]
    if head[:4] == b"OggS":
        return CONTAINERS["ogg"]
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return CONTAINERS["webm"]
    if head[4:8] == b"ftyp":
        return CONTAINERS["mp4"]
    if head[:3] == b"ID3" and len(data) >= 10:  # a tag first: what follows it decides
        size = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(data[6:10]))
        tagged = data[size : size + 4]
        if tagged[:4] == b"fLaC":
            return CONTAINERS["flac"]
        return CONTAINERS["aac"] if _adts(tagged) else CONTAINERS["mp3"]
    if _adts(head):
        return CONTAINERS["aac"]
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return CONTAINERS["mp3"]  # an MPEG audio frame (layer I-III; the codec check follows)
    raise ProtocolError(
        ErrorCode.NOT_AUDIO, f"the file is not audio in an accepted format; send {FORMATS}"
    )


def _adts(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0


def _too_long(max_seconds: float) -> ProtocolError:
    return ProtocolError(
        ErrorCode.BAD_VOICE_CLIP,
        f"the voice clip is longer than {max_seconds:g} s; enrol with 3-{max_seconds:g} s of "
        "one speaker (10 s is plenty): trim it",
    )


def _check_rate_and_channels(rate: int, channels: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ProtocolError(
            ErrorCode.BAD_VOICE_CLIP,
            f"the clip's sample rate ({rate} Hz) is outside {MIN_RATE}-{MAX_RATE} Hz: "
            "record or export it at 16-48 kHz",
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise ProtocolError(
            ErrorCode.BAD_VOICE_CLIP,
            f"the clip has {channels} audio channels; send mono or stereo (at most "
            f"{MAX_CHANNELS} channels)",
        )


def _check_header(container: Any, stream: Any, max_seconds: float) -> None:
    """Refuse a clip by what its headers say, before anything is decoded."""
    codec = stream.codec_context.name if stream.codec_context else "unknown"
    if not (codec in CODECS or (codec.startswith("pcm_") and container.format.name == "wav")):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_CODEC,
            f"the audio codec {codec!r} is not supported for voice clips; send {FORMATS}",
        )
    context = stream.codec_context
    _check_rate_and_channels(int(context.sample_rate or 0), int(context.channels or 0))
    seconds = None
    if stream.duration and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration:
        seconds = container.duration / av.time_base
    if seconds is not None and seconds > max_seconds + _DURATION_SLACK_S:
        raise _too_long(max_seconds)


def decode_clip(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """Decode an uploaded clip to mono float32 samples in [-1, 1] at ``DECODE_RATE``.

    The container is recognised from the bytes and FFmpeg is told to use that demuxer alone;
    the header's codec, rate, channels and duration are checked before decoding; every frame is
    resampled to ``DECODE_RATE`` (a frame whose rate or layout differs from the last one's gets
    a fresh resampler) and decoding stops once the output is longer than ``max_seconds``, so
    no header can move the cap.

    Args:
        data: the file's bytes.
        max_seconds: the longest clip (the clip is refused past it).

    Returns:
        (samples, ``DECODE_RATE``).

    Raises:
        ProtocolError: ``not_audio`` (no accepted container, no audio track, a broken file),
            ``unsupported_codec`` (audio in a codec outside ``CODECS``), ``bad_voice_clip``
            (a rate or channel count out of range, or longer than ``max_seconds``).
    """
    demuxer = sniff_container(data)
    options = {**_OPTIONS, **({"enable_drefs": "0"} if demuxer == "mov" else {})}
    try:
        container = av.open(io.BytesIO(data), mode="r", format=demuxer, options=options)
    except (av.error.FFmpegError, ValueError, OverflowError) as e:
        logger.debug(f"voice upload: FFmpeg cannot open it as {demuxer}: {e}")
        raise ProtocolError(
            ErrorCode.NOT_AUDIO,
            f"the file is not audio that can be read (it starts like {demuxer} but is not "
            f"valid); send {FORMATS}",
        ) from None
    with container:
        if not container.streams.audio:
            raise ProtocolError(ErrorCode.NOT_AUDIO, f"the file has no audio track; send {FORMATS}")
        stream = container.streams.audio[0]
        _check_header(container, stream, max_seconds)
        try:
            samples = _decode(container, stream, max_seconds)
        except ProtocolError:  # a ValueError too: it already names the problem
            raise
        except (av.error.FFmpegError, ValueError, OverflowError) as e:
            logger.debug(f"voice upload: decoding failed: {type(e).__name__}: {e}")
            raise ProtocolError(
                ErrorCode.NOT_AUDIO, "the audio cannot be decoded: is the file whole?"
            ) from None
    if not samples.size:
        raise ProtocolError(ErrorCode.NOT_AUDIO, "the file holds no audio samples")
    return np.clip(np.nan_to_num(samples), -1.0, 1.0), DECODE_RATE


def _decode(container: Any, stream: Any, max_seconds: float) -> np.ndarray:
    """``stream``'s audio at ``DECODE_RATE``, mono; at most ``max_seconds`` of it."""
    out = np.empty(int(max_seconds * DECODE_RATE) + 1, np.float32)
    count, seconds_in = 0, 0.0
    resampler, shape = None, None

    def keep(frames: list[av.AudioFrame]) -> None:
        nonlocal count
        for frame in frames:
            pcm = frame.to_ndarray().reshape(-1)
            if count + pcm.size > out.size:
                raise _too_long(max_seconds)
            out[count : count + pcm.size] = pcm
            count += pcm.size

    for frame in container.decode(stream):
        _check_rate_and_channels(frame.sample_rate, frame.layout.nb_channels)
        seconds_in += frame.samples / frame.sample_rate
        if seconds_in > max_seconds + _DURATION_SLACK_S:  # the input side of the same cap
            raise _too_long(max_seconds)
        now = (frame.sample_rate, frame.layout.name, frame.format.name)
        if now != shape:  # the first frame, or the rate or layout changed mid-stream
            if resampler is not None:
                keep(resampler.resample(None))
            resampler = av.AudioResampler(format="flt", layout="mono", rate=DECODE_RATE)
            shape = now
        frame.pts = None  # a fresh resampler takes any frame; timestamps do not matter here
        keep(resampler.resample(frame))
    if resampler is not None:
        keep(resampler.resample(None))
    return out[:count].copy()
