"""Server messages: ``ready``, ``done`` and ``error`` (JSON) and the binary audio frame."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from pipecat_veena.protocol.codes import ErrorCode, ProtocolError

PROTOCOL_VERSION = 1
#: First byte of a binary audio frame (a kind byte lets later versions add other frames).
AUDIO_FRAME = 0x01
_TOKENS = struct.Struct("<I")


@dataclass(frozen=True)
class Ready:
    """First message on every connection: what the server speaks and its limits."""

    model: str
    sample_rate: int
    voices: list[str]
    default_voice: str
    voice_levels: bool
    limits: dict[str, Any]
    emotion_tags: list[str] = field(default_factory=list)
    protocol: int = PROTOCOL_VERSION
    type: str = "ready"


@dataclass(frozen=True)
class Done:
    """An utterance ended: ``completed`` (all its audio was sent) or ``cancelled``.

    ``warning``: why a completed utterance said less than asked ("nothing_to_speak",
    "loop_guard", "token_cap"), or None.
    """

    id: str
    reason: str
    tokens: int
    audio_seconds: float
    ttfa_ms: float | None
    elapsed_ms: float
    sample_rate: int
    request_id: str
    warning: str | None = None
    type: str = "done"


@dataclass(frozen=True)
class Error:
    """A request failed; ``ended`` tells whether utterance ``id`` is over because of it."""

    code: str
    message: str
    id: str | None = None
    ended: bool = False
    type: str = "error"


def parse_server_message(text: str) -> Ready | Done | Error:
    """Parse a server text frame (the client's side).

    Raises:
        ProtocolError: not a message of this protocol version.
    """
    try:
        data = json.loads(text)
        kind = data.pop("type")
        cls = {"ready": Ready, "done": Done, "error": Error}[kind]
        return cls(**data)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        message = f"not a server message: {text[:200]!r} ({e})"
        raise ProtocolError(ErrorCode.BAD_MESSAGE, message) from None


@dataclass(frozen=True)
class AudioFrame:
    """A binary audio frame: int16 LE mono ``pcm`` of utterance ``id``.

    Attributes:
        id: the utterance.
        tokens: LLM tokens generated for the utterance up to this audio.
        pcm: the samples, at the utterance's rate.
    """

    id: str
    tokens: int
    pcm: bytes


def encode_audio_frame(uid: str, tokens: int, pcm: bytes) -> bytes:
    """``[0x01][id length][id, ASCII][tokens, u32 LE][int16 LE PCM]``."""
    raw = uid.encode("ascii")
    return bytes((AUDIO_FRAME, len(raw))) + raw + _TOKENS.pack(min(tokens, 0xFFFFFFFF)) + pcm


def decode_audio_frame(data: bytes) -> AudioFrame:
    """Inverse of ``encode_audio_frame``.

    Raises:
        ProtocolError: not an audio frame of this protocol version.
    """
    if len(data) < 2 or data[0] != AUDIO_FRAME or len(data) < 2 + data[1] + _TOKENS.size:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"not an audio frame ({len(data)} bytes)")
    end = 2 + data[1]
    (tokens,) = _TOKENS.unpack_from(data, end)
    return AudioFrame(data[2:end].decode("ascii"), tokens, data[end + _TOKENS.size :])
