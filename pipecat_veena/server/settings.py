"""The speech server's settings: one frozen dataclass owns every limit and timeout."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipecat_veena.remote.protocol import SAMPLE_RATES

#: OpenAI's 13 built-in voice names (all its clients can send), by how they sound.
OPENAI_FEMALE = ("alloy", "coral", "marin", "nova", "sage", "shimmer")
OPENAI_MALE = ("ash", "ballad", "cedar", "echo", "fable", "onyx", "verse")
OPENAI_VOICES = tuple(sorted(OPENAI_FEMALE + OPENAI_MALE))


class ApiKeys(Mapping[str, str]):
    """Read-only API key -> name table whose repr shows names only (settings get logged).

    Args:
        keys: key -> name.
    """

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self._keys = dict(keys or {})

    def __getitem__(self, key: str) -> str:
        return self._keys[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ApiKeys(<{len(self)} redacted: {', '.join(sorted(set(self.values())))}>)"


@dataclass(frozen=True)
class ServerSettings:
    """Limits, timeouts and API keys of a speech server.

    Parameters:
        api_keys: accepted bearer keys, mapped to a name used in logs and per-key limits.
            Empty: the server is open to anyone who can reach it (a warning is logged).
            Kept as ``ApiKeys``, whose repr (and so this object's) shows the names only.
        max_streams: most utterances in flight on the whole server (HTTP and WebSocket).
        max_streams_per_key: most utterances in flight per API key (None: no per-key cap).
        max_streams_per_anonymous_client: on a server without API keys, most utterances in
            flight per client address (None: no cap), so that one client cannot take every
            slot (``too_many_streams``). Behind a proxy the address is the one uvicorn's
            ``--forwarded-allow-ips`` trusts from ``X-Forwarded-For``, else the proxy's.
        max_open_utterances: most utterances sent with ``final: false`` that are still taking
            text, per WebSocket connection (``too_many_open_utterances``).
        open_utterance_timeout_s: an utterance still taking text that has nothing left to speak
            and gets no text for this long ends (``text_timeout``); it no longer holds its
            stream slot and keeps its connection from idling out forever.
        max_text_chars: longest text of one utterance (all its appended pieces together).
        max_message_bytes: longest WebSocket message or HTTP request body.
        max_upload_bytes: longest voice-clip upload (``POST /v1/audio/voices``, the whole
            multipart body); more gets a 413 (``message_too_large``).
        idle_timeout_s: a WebSocket with no utterance in flight and no message for this long
            is closed (``idle_timeout``).
        slow_client_timeout_s: a client that takes longer than this to accept one message
            (it stopped reading) is disconnected (``slow_client``) and its requests aborted.
        send_buffer_bytes: audio queued per connection before generation waits for the
            client; with the timeout above this bounds the memory a slow client can hold.
        drain_timeout_s: on SIGTERM, how long in-flight utterances may take to finish before
            they are cancelled.
        max_connections: most open TCP connections (HTTP and WebSocket); one over it gets a 503
            (``too_many_connections``) and is closed at once.
        header_timeout_s: a request's line and headers must arrive whole within this of the
            connection opening (or of the previous response); else the connection is closed
            (a 408 ``request_timeout`` when part of a request had arrived). This also closes
            connections that never send anything.
        body_timeout_s: an HTTP request body must arrive whole within this (408
            ``request_timeout``).
        max_header_bytes: longest request line plus headers (431 ``headers_too_large``).
        max_headers: most header fields in one request (431 ``headers_too_large``).
        voice_map: OpenAI voice name -> checkpoint voice (None: female-sounding names to
            ``female`` and the others to ``male`` when the checkpoint has both, else every
            name to the default voice).
        max_enrolled_voices: most enrolled voices (all keys together, the operator's
            included); an enrolment past it gets 409 ``too_many_voices`` (None: no cap).
    """

    api_keys: Mapping[str, str] = field(default_factory=dict)
    max_streams: int = 64
    max_streams_per_key: int | None = None
    max_streams_per_anonymous_client: int | None = 32
    max_open_utterances: int = 8
    open_utterance_timeout_s: float = 60.0
    max_text_chars: int = 4096
    max_message_bytes: int = 64 * 1024
    max_upload_bytes: int = 8 * 1024 * 1024
    idle_timeout_s: float = 300.0
    slow_client_timeout_s: float = 10.0
    send_buffer_bytes: int = 1 << 20
    drain_timeout_s: float = 30.0
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    voice_map: Mapping[str, str] | None = None
    max_enrolled_voices: int | None = 1000

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_text_chars", "max_message_bytes", "max_upload_bytes",
                     "send_buffer_bytes",
                     "max_open_utterances", "max_connections", "max_header_bytes",
                     "max_headers"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_streams_per_key", "max_streams_per_anonymous_client",
                     "max_enrolled_voices"):  # fmt: skip
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "slow_client_timeout_s", "drain_timeout_s",
                     "open_utterance_timeout_s", "header_timeout_s", "body_timeout_s"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        object.__setattr__(self, "api_keys", ApiKeys(self.api_keys))

    def limits(self) -> dict[str, float | int | list[int] | None]:
        """The limits a client should know (sent in the WebSocket ``ready`` message)."""
        return {
            "max_text_chars": self.max_text_chars,
            "max_message_bytes": self.max_message_bytes,
            "max_streams": self.max_streams,
            "max_streams_per_key": self.max_streams_per_key,
            "max_streams_per_anonymous_client": (
                None if self.api_keys else self.max_streams_per_anonymous_client
            ),
            "max_open_utterances": self.max_open_utterances,
            "open_utterance_timeout_s": self.open_utterance_timeout_s,
            "idle_timeout_s": self.idle_timeout_s,
            "sample_rates": list(SAMPLE_RATES),
        }


def read_api_keys(path: str | Path) -> dict[str, str]:
    """Read an API key file: one key per line, or ``name key``; ``#`` starts a comment.

    Returns:
        key -> name (keys without a name are called ``key1``, ``key2``... by line order).

    Raises:
        ValueError: an unreadable file, a malformed line or no key at all.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ValueError(f"cannot read the API key file {path}: {e}") from e
    keys: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ValueError(
                f"{path}:{number}: expected 'key' or 'name key', got {len(fields)} words"
            )
        name, key = fields if len(fields) == 2 else (f"key{len(keys) + 1}", fields[0])
        keys[key] = name
    if not keys:
        raise ValueError(f"{path}: no API key in the file (one per line, or 'name key')")
    return keys


def parse_voice_map(spec: str) -> dict[str, str]:
    """Parse ``alloy=female,echo=male`` into a voice map.

    Raises:
        ValueError: a pair without ``=`` or an OpenAI name OpenAI does not have.
    """
    mapping = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, voice = pair.partition("=")
        name = name.strip().lower()
        if not sep or not voice.strip():
            raise ValueError(f"voice map: expected openai_name=voice, got {pair!r}")
        if name not in OPENAI_VOICES:
            raise ValueError(
                f"voice map: {name!r} is not an OpenAI voice ({', '.join(OPENAI_VOICES)})"
            )
        mapping[name] = voice.strip()
    return mapping
