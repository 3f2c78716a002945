"""Voice-clip uploads: a multipart body parsed in memory, and its audio decoded with PyAV.

``POST /v1/audio/voices`` reads its body against ``max_upload_bytes`` (Content-Length first,
then its size as it streams, within ``body_timeout_s``), parses the multipart form in memory
(no part is spooled to a temporary file: nothing uploaded ever touches the disk) and decodes the
``file`` part from memory: WAV (PCM), MP3, Ogg (Opus or Vorbis), M4A / AAC, FLAC, mixed down to
mono float32 at the clip's own rate. Decoding stops as soon as the clip is longer than an
enrolment clip may be, so a small, very compressible file cannot make the server decode hours.
Every refusal is a ``ProtocolError`` whose code and message name the problem.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import av
import numpy as np
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartException, MultiPartParser

from pipecat_veena.remote.protocol import ErrorCode, ProtocolError

#: Decoders a clip may use: PCM in WAV (any ``pcm_*``), MP3, Opus and Vorbis (Ogg), AAC (M4A,
#: ADTS), FLAC and ALAC.
CODECS = frozenset({"mp3", "mp3float", "opus", "libopus", "vorbis", "libvorbis", "aac", "flac",
                    "alac"})  # fmt: skip
#: What the refusal of another codec lists.
FORMATS = "WAV (PCM), MP3, Ogg (Opus or Vorbis), M4A / AAC or FLAC"
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


def decode_clip(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """Decode an uploaded clip to mono float32 samples in [-1, 1] at its own rate.

    Args:
        data: the file's bytes.
        max_seconds: decoding stops past this many seconds (the clip is refused).

    Returns:
        (samples, sample_rate).

    Raises:
        ProtocolError: ``not_audio`` (not a media file, or no audio track), ``unsupported_codec``
            (audio in a codec outside ``CODECS``), ``bad_voice_clip`` (longer than
            ``max_seconds``, or a file that breaks off).
    """
    if not data:
        raise ProtocolError(ErrorCode.NOT_AUDIO, "the 'file' part is empty: attach the voice clip")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError) as e:
        raise ProtocolError(
            ErrorCode.NOT_AUDIO, f"the file is not audio FFmpeg can read ({e}); send {FORMATS}"
        ) from None
    with container:
        if not container.streams.audio:
            raise ProtocolError(ErrorCode.NOT_AUDIO, f"the file has no audio track; send {FORMATS}")
        stream = container.streams.audio[0]
        codec = stream.codec_context.name if stream.codec_context else "unknown"
        if not (codec.startswith("pcm_") or codec in CODECS):
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_CODEC,
                f"the audio codec {codec!r} is not supported for voice clips; send {FORMATS}",
            )
        rate = stream.codec_context.sample_rate or stream.rate
        if not rate:
            raise ProtocolError(ErrorCode.NOT_AUDIO, "the audio track has no sample rate")
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        pieces: list[np.ndarray] = []
        count, limit = 0, int(max_seconds * rate) + 1
        try:
            for frame in container.decode(stream):
                for out in mono.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    count += pieces[-1].size
                if count > limit:
                    raise ProtocolError(
                        ErrorCode.BAD_VOICE_CLIP,
                        f"the voice clip is longer than {max_seconds:g} s; enrol with 3-"
                        f"{max_seconds:g} s of one speaker (10 s is plenty): trim it",
                    )
            for out in mono.resample(None):
                pieces.append(out.to_ndarray().reshape(-1))
        except av.error.FFmpegError as e:
            raise ProtocolError(
                ErrorCode.NOT_AUDIO, f"the audio cannot be decoded ({e}): is the file whole?"
            ) from None
    if not pieces or not sum(p.size for p in pieces):
        raise ProtocolError(ErrorCode.NOT_AUDIO, "the file holds no audio samples")
    samples = np.concatenate(pieces).astype(np.float32)
    return np.clip(np.nan_to_num(samples), -1.0, 1.0), int(rate)
