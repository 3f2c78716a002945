"""Server messages: ``ready``, ``done``, ``error``, ``goaway``, ``words`` (JSON), audio (binary)."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipecat_veena.interface import WordTiming
from pipecat_veena.remote.protocol.codes import ErrorCode, ProtocolError

PROTOCOL_VERSION = 1
#: WebSocket close code of a server that is going away (draining, stopping): 1012, "service
#: restart". It follows a ``goaway``; the client redials (through the same URL a new connection
#: reaches another server) and retries there what had not started.
CLOSE_GOING_AWAY = 1012
#: First byte of a binary audio frame (a kind byte lets later versions add other frames).
AUDIO_FRAME = 0x01
_TOKENS = struct.Struct("<I")
#: Decimals of word times on the wire (0.1 ms: far finer than the estimates themselves).
_WORD_TIME_DECIMALS = 4


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
    #: True when a ``speak`` may ask for word timings (``"words": true``); servers from before
    #: them do not send it (False) and refuse the field.
    words: bool = False
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


def word_json(word: WordTiming) -> dict[str, Any]:
    """One word timing as JSON (the one wire form: WebSocket ``words`` and SSE events).

    ``offset_utf16`` (for JavaScript) is there when the word has one (the server's words do).
    """
    data: dict[str, Any] = {
        "word": word.word,
        "start": round(word.start, _WORD_TIME_DECIMALS),
        "end": round(word.end, _WORD_TIME_DECIMALS),
        "offset": word.offset,
    }
    if word.offset_utf16 is not None:
        data["offset_utf16"] = word.offset_utf16
    return data


def word_from_json(data: Any) -> WordTiming:
    """Inverse of ``word_json``.

    Raises:
        ProtocolError: not a word timing (a field missing or of the wrong type).
    """
    try:
        word, start, end, offset = data["word"], data["start"], data["end"], data["offset"]
    except (TypeError, KeyError) as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"not a word timing: {data!r:.200}") from e
    numbers = all(isinstance(t, int | float) and not isinstance(t, bool) for t in (start, end))
    utf16 = data.get("offset_utf16")
    given = (offset,) if utf16 is None else (offset, utf16)
    offsets = all(isinstance(o, int) and not isinstance(o, bool) for o in given)
    if not (isinstance(word, str) and numbers and offsets):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"not a word timing: {data!r:.200}")
    return WordTiming(word, float(start), float(end), offset, utf16)


@dataclass(frozen=True)
class Words:
    """Word timings of an utterance whose ``speak`` asked for them (``"words": true``).

    Sent after the audio frame that completes the last of them (never ahead of the audio).

    Attributes:
        id: the utterance.
        words: ``word_json`` objects: each word as written, its start and end in seconds from
            the utterance's first sample, its offset in the utterance's text as the client sent
            it (``offset``: Python code points; ``offset_utf16``: UTF-16 code units, the
            index of a JavaScript string).
        estimated: always true: the times are estimates from the generated audio.
    """

    id: str
    words: list[dict[str, Any]]
    estimated: bool = True
    type: str = "words"

    @classmethod
    def of(cls, uid: str, words: Iterable[WordTiming]) -> Words:
        """The message for ``words`` of utterance ``uid``."""
        return cls(uid, [word_json(w) for w in words])

    def timings(self) -> tuple[WordTiming, ...]:
        """The words as ``WordTiming``s.

        Raises:
            ProtocolError: an item is not a word timing.
        """
        if not isinstance(self.words, list):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'words' of a words message is a list")
        return tuple(word_from_json(w) for w in self.words)


_SERVER_TYPES: dict[str, type] = {c.type: c for c in (Ready, Done, Error, GoAway, Words)}  # type: ignore[attr-defined]


ServerMessage = Ready | Done | Error | GoAway | Words


def parse_server_message(text: str) -> ServerMessage | None:
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
        message = cls(**{k: v for k, v in data.items() if k in known})
        if isinstance(message, Words):
            message.timings()  # (checked here: a client never gets a broken one)
        return message
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
