"""The speech server's WebSocket protocol: every message, the audio frame and the error codes.

Shared by the server (``pipecat_veena.server``) and its client (``RemoteVeenaEngine``); no web
framework here. Client messages are JSON text frames, server audio is binary frames, every other
server message is a JSON text frame. docs/protocol.md describes it for client writers.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from pipecat_veena.errors import (
    GenerationError,
    MalformedStreamError,
    NoAudioError,
    RemoteError,
    ServerUnavailableError,
    UnknownVoiceError,
    VeenaError,
)

PROTOCOL_VERSION = 1
#: Where the server takes WebSocket connections.
STREAM_PATH = "/v1/audio/stream"
#: Output rates a ``speak`` may ask for (the engine's rate when it asks for none).
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
#: Utterance ids: 1-64 characters of A-Z a-z 0-9 . _ : -
MAX_ID_LENGTH = 64
_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")
#: First byte of a binary audio frame (a kind byte lets later versions add other frames).
AUDIO_FRAME = 0x01
_TOKENS = struct.Struct("<I")

#: Sampling options of ``speak`` and the JSON types each accepts.
OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_k": (int,),
    "top_p": (int, float),
    "repetition_penalty": (int, float),
    "seed": (int,),
    "max_tokens": (int,),
}


class ErrorCode:
    """The stable error codes of ``error`` messages (and of the HTTP API's error bodies)."""

    # the connection (the server closes it after the error)
    UNAUTHORIZED = "unauthorized"
    SERVER_STARTING = "server_starting"
    SERVER_DRAINING = "server_draining"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CLIENT = "slow_client"
    # one message (the connection and its utterances carry on)
    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_TYPE = "unknown_type"
    BINARY_NOT_EXPECTED = "binary_not_expected"
    MESSAGE_TOO_LARGE = "message_too_large"
    DUPLICATE_ID = "duplicate_id"
    UNKNOWN_ID = "unknown_id"
    # one utterance (it ends)
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_VOICE = "unknown_voice"
    BAD_OPTIONS = "bad_options"
    TOO_MANY_STREAMS = "too_many_streams"
    NO_AUDIO = "no_audio"
    GENERATION_FAILED = "generation_failed"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL = "internal"


#: Codes after which the same request may succeed elsewhere or later.
RETRYABLE = frozenset(
    {
        ErrorCode.SERVER_STARTING,
        ErrorCode.SERVER_DRAINING,
        ErrorCode.TOO_MANY_STREAMS,
        ErrorCode.GENERATION_FAILED,
        ErrorCode.ENGINE_UNAVAILABLE,
        ErrorCode.IDLE_TIMEOUT,
        ErrorCode.INTERNAL,
    }
)


class RemoteInputError(RemoteError, ValueError):
    """The server refused the request's input (options, text length); a retry cannot help."""


class ProtocolError(ValueError):
    """A client message the server cannot take; becomes an ``error`` message.

    Args:
        code: an ``ErrorCode``.
        message: what is wrong and how to fix it.
        ref: the utterance id the message named, when it named one.
        ended: True when utterance ``ref`` is over because of this error (e.g. its ``speak``
            was refused).
    """

    def __init__(
        self, code: str, message: str, ref: str | None = None, *, ended: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ref = ref
        self.ended = ended


# -- client messages -------------------------------------------------------------------------
@dataclass(frozen=True)
class Speak:
    """Start an utterance: ``text`` in ``voice``; with ``final`` false more text may follow."""

    id: str
    text: str
    voice: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None
    final: bool = True
    type: str = "speak"


@dataclass(frozen=True)
class Append:
    """Add text to an open utterance (complete sentences are spoken as they arrive)."""

    id: str
    text: str
    type: str = "append"


@dataclass(frozen=True)
class Flush:
    """Speak the open utterance's buffered text now, even without a sentence end."""

    id: str
    type: str = "flush"


@dataclass(frozen=True)
class End:
    """No more text for this utterance: speak the rest; ``done`` follows its last audio."""

    id: str
    type: str = "end"


@dataclass(frozen=True)
class Cancel:
    """Stop an utterance now (its LLM request is aborted); ``done`` says ``cancelled``."""

    id: str
    type: str = "cancel"


ClientMessage = Speak | Append | Flush | End | Cancel
_CLIENT_TYPES: dict[str, type] = {c.type: c for c in (Speak, Append, Flush, End, Cancel)}  # type: ignore[attr-defined]
_FIELDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    # field: (accepted JSON types, required)
    "speak": {
        "text": ((str,), True),
        "voice": ((str, type(None)), False),
        "options": ((dict, type(None)), False),
        "sample_rate": ((int, type(None)), False),
        "final": ((bool,), False),
    },
    "append": {"text": ((str,), True)},
    "flush": {},
    "end": {},
    "cancel": {},
}


def load_json(text: str | bytes, what: str) -> Any:
    """``json.loads`` with every failure (syntax, nesting depth, encoding) as ``bad_json``.

    Raises:
        ProtocolError: ``bad_json``, naming ``what`` was not JSON.
    """
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise ProtocolError(ErrorCode.BAD_JSON, f"{what} is not valid JSON ({reason})") from None


def check_unicode(value: str, what: str, ref: str | None = None) -> None:
    """Raise ``bad_message`` for text that is not valid Unicode (a lone surrogate escape)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE, f"{what} is not valid Unicode (a lone surrogate)", ref
        ) from None


def to_json(message: Any) -> str:
    """One protocol message (a dataclass of this module) as a JSON text frame."""
    return json.dumps(asdict(message), separators=(",", ":"))


def parse_client_message(text: str) -> ClientMessage:
    """Parse and type-check one client text frame.

    Raises:
        ProtocolError: bad JSON, an unknown type, a missing or mistyped field (naming it).
    """
    data = load_json(text, "the message")
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a message is a JSON object with a 'type'")
    kind = data.get("type")
    ref = data.get("id") if isinstance(data.get("id"), str) else None
    if kind not in _CLIENT_TYPES:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"unknown message type {kind!r}; valid: {', '.join(_CLIENT_TYPES)}",
            ref,
        )
    uid = data.get("id")
    if not isinstance(uid, str) or not _ID.fullmatch(uid):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"{kind}: 'id' must be a string of 1-{MAX_ID_LENGTH} characters from "
            f"A-Z a-z 0-9 . _ : - (got {uid!r:.80})",
        )
    spec = _FIELDS[kind]
    unknown = set(data) - set(spec) - {"type", "id"}
    if unknown:
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"{kind}: unknown field(s) {sorted(unknown)}; valid: {sorted(spec)}",
            uid,
        )
    for name, (types, required) in spec.items():
        if name not in data:
            if required:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{kind}: '{name}' is missing", uid)
            continue
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"{kind}: '{name}' must be {wanted}, got {type(value).__name__}",
                uid,
            )
    fields = {k: v for k, v in data.items() if k != "type" and v is not None}
    for name in ("text", "voice"):
        if isinstance(fields.get(name), str):
            check_unicode(fields[name], f"{kind}: '{name}'", uid)
    if kind == "speak":
        fields["options"] = check_option_types(fields.get("options") or {}, uid)
        rate = fields.get("sample_rate")
        if rate is not None and not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"speak: 'sample_rate' must be in [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz, "
                f"got {rate}",
                uid,
            )
    return _CLIENT_TYPES[kind](**fields)


def check_option_types(options: dict[str, Any], ref: str | None = None) -> dict[str, Any]:
    """Check sampling option names and JSON types; returns those that are not null.

    Raises:
        ProtocolError: an unknown option or a value of the wrong type (``bad_options``).
    """
    unknown = set(options) - set(OPTION_TYPES)
    if unknown:
        raise ProtocolError(
            ErrorCode.BAD_OPTIONS,
            f"unknown option(s) {sorted(unknown)}; valid: {sorted(OPTION_TYPES)}",
            ref,
        )
    for name, value in options.items():
        types = OPTION_TYPES[name]
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise ProtocolError(
                ErrorCode.BAD_OPTIONS,
                f"option '{name}' must be a {' or '.join(t.__name__ for t in types)}, "
                f"got {type(value).__name__}",
                ref,
            )
    return {k: v for k, v in options.items() if v is not None}


# -- server messages -------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """First message on every connection: what the server speaks and its limits."""

    model: str
    sample_rate: int
    voices: list[str]
    default_voice: str
    voice_levels: bool
    limits: dict[str, Any]
    protocol: int = PROTOCOL_VERSION
    type: str = "ready"


@dataclass(frozen=True)
class Done:
    """An utterance ended: ``completed`` (all its audio was sent) or ``cancelled``."""

    id: str
    reason: str
    tokens: int
    audio_seconds: float
    ttfa_ms: float | None
    elapsed_ms: float
    sample_rate: int
    request_id: str
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


# -- errors both ways ------------------------------------------------------------------------
def code_for(error: BaseException) -> str:
    """The error code the server reports for an engine exception."""
    if isinstance(error, UnknownVoiceError):
        return ErrorCode.UNKNOWN_VOICE
    if isinstance(error, NoAudioError):
        return ErrorCode.NO_AUDIO
    if isinstance(error, GenerationError | MalformedStreamError):
        return ErrorCode.GENERATION_FAILED
    if isinstance(error, ValueError):
        return ErrorCode.BAD_OPTIONS
    if isinstance(error, VeenaError):  # EngineDeadError, EngineNotRunningError, ...
        return ErrorCode.ENGINE_UNAVAILABLE
    return ErrorCode.INTERNAL


_CONNECTION_CODES = {
    ErrorCode.SERVER_STARTING,
    ErrorCode.SERVER_DRAINING,
    ErrorCode.TOO_MANY_STREAMS,
    ErrorCode.ENGINE_UNAVAILABLE,
    ErrorCode.IDLE_TIMEOUT,
}


def error_for(code: str, message: str) -> Exception:
    """The exception a client raises for a server ``error`` (the inverse of ``code_for``)."""
    if code == ErrorCode.UNKNOWN_VOICE:
        return UnknownVoiceError(message)
    if code == ErrorCode.NO_AUDIO:
        return NoAudioError(message)
    if code == ErrorCode.GENERATION_FAILED:
        return GenerationError(message)
    if code in _CONNECTION_CODES:
        return ServerUnavailableError(message, code=code)
    if code in (ErrorCode.BAD_OPTIONS, ErrorCode.TEXT_TOO_LONG, ErrorCode.BAD_MESSAGE):
        return RemoteInputError(message, code=code)
    return RemoteError(message, code=code, retryable=code in RETRYABLE)
