"""Server messages: ``ready``, ``done`` and ``error`` (JSON) and the binary audio frame."""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from pipecat_veena.remote.protocol.codes import ErrorCode, ProtocolError

PROTOCOL_VERSION = 1
#: WebSocket close code of a server that is going away (draining, stopping): 1012, "service
#: restart". It follows a ``goaway``; the client redials (through the same URL a new connection
#: reaches another server) and retries there what had not started.
CLOSE_GOING_AWAY = 1012
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
    openai_aliases: dict[str, str] = field(default_factory=dict)
    enrols_voices: bool = False
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


@dataclass(frozen=True)
class GoAway:
    """The server is going away (draining): send no new ``speak`` on this connection.

    Utterances in flight on it finish; then the server closes it with ``CLOSE_GOING_AWAY``.
    Connect again (a new connection through the same URL reaches another server) for new ones.
    """

    code: str
    message: str
    type: str = "goaway"


_SERVER_TYPES: dict[str, type] = {c.type: c for c in (Ready, Done, Error, GoAway)}  # type: ignore[attr-defined]


def parse_server_message(text: str) -> Ready | Done | Error | GoAway | None:
    """Parse a server text frame (the client's side), forward-compatibly.

    Fields this version does not know are ignored, and so is a message of a type it does not
    know (None): a later server may add both without breaking this client.

    Raises:
        ProtocolError: not JSON, no ``type``, or a known message missing a field it needs.
    """
    try:
        data = json.loads(text)
        cls = _SERVER_TYPES.get(data["type"])
        if cls is None:
            return None
        known = {f.name for f in dataclasses.fields(cls)} - {"type"}
        return cls(**{k: v for k, v in data.items() if k in known})
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
