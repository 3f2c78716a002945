"""Client messages (JSON text frames): their types, parsing and checks, and JSON helpers."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from pipecat_veena.remote.protocol.codes import ErrorCode, ProtocolError

#: Where the server takes WebSocket connections.
STREAM_PATH = "/v1/audio/stream"
#: Output rates a ``speak`` may ask for (the engine's rate when it asks for none): the usual
#: audio rates (those of MPEG audio). A list rather than a range: the resampler's filter bank
#: has out_rate / gcd(in_rate, out_rate) rows, 441 at most for these, 47999 for 47999 Hz.
SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
#: Utterance ids: 1-64 characters of A-Z a-z 0-9 . _ : -
MAX_ID_LENGTH = 64
_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")
#: A W3C trace context (``speak.traceparent``): version 00, trace id, parent span id, flags.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: Sampling options of ``speak`` and the JSON types each accepts.
OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_k": (int,),
    "top_p": (int, float),
    "repetition_penalty": (int, float),
    "seed": (int,),
    "max_tokens": (int,),
    "language": (str,),
    "normalize": (bool,),
    "speed": (int, float),
    "lexicon": (dict,),
    "ssml": (bool,),
}


@dataclass(frozen=True)
class Speak:
    """Start an utterance: ``text`` in ``voice``; with ``final`` false more text may follow."""

    id: str
    text: str
    voice: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None
    final: bool = True
    traceparent: str | None = None
    #: True: the server sends ``words`` messages (word timings) for this utterance. None (left
    #: out of the JSON) is false: servers from before word timings refuse the field.
    words: bool | None = None
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
        "traceparent": ((str, type(None)), False),
        "words": ((bool, type(None)), False),
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


#: Fields added after protocol 1 shipped, left out while null so that clients from before them
#: (which refused unknown fields) still read every message that does not use them.
_OMITTED_WHEN_NULL = ("warning", "traceparent", "words")


def to_json(message: Any) -> str:
    """One protocol message (a dataclass of this module) as a JSON text frame."""
    data = asdict(message)
    for name in _OMITTED_WHEN_NULL:
        if name in data and data[name] is None:
            del data[name]
    return json.dumps(data, separators=(",", ":"))


def parse_client_message(text: str, max_bytes: int | None = None) -> ClientMessage:
    """Parse and type-check one client text frame.

    A refused ``speak`` whose ``id`` is a string names that id and says ``ended``: the server
    will not run it, so its error is the last message the client gets about it.

    Args:
        text: the frame.
        max_bytes: the largest message taken (None: no cap): a larger one is refused with
            ``message_too_large``.

    Raises:
        ProtocolError: bad JSON, an unknown type, a missing or mistyped field (naming it), a
            message over ``max_bytes``.
    """
    too_large = None
    if max_bytes is not None and (len(text) > max_bytes or len(text.encode()) > max_bytes):
        too_large = ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"a message may have at most {max_bytes} bytes; send long text in several 'append' "
            "messages",
        )
    try:
        data = load_json(text, "the message")
    except ProtocolError:
        if too_large is not None:
            raise too_large from None
        raise
    speak_id = _speak_id(data)
    try:
        if too_large is not None:
            raise too_large
        return _parse(data)
    except ProtocolError as e:
        if speak_id is not None:
            e.ref, e.ended = speak_id, True
        raise


def _speak_id(data: Any) -> str | None:
    """The id of a ``speak`` message, when it has a string one (valid or not)."""
    if isinstance(data, dict) and data.get("type") == "speak" and isinstance(data.get("id"), str):
        return data["id"]
    return None


def _parse(data: Any) -> ClientMessage:
    """Type-check one decoded client message (``parse_client_message`` without its framing)."""
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
        if rate is not None:
            check_sample_rate(rate, "speak: 'sample_rate'", uid)
        trace = fields.get("traceparent")
        if trace is not None and not _TRACEPARENT.fullmatch(trace):
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"speak: 'traceparent' must be a W3C trace context "
                f"'00-<32 hex>-<16 hex>-<2 hex>' (lowercase), got {trace!r:.80}",
                uid,
            )
    return _CLIENT_TYPES[kind](**fields)


def check_sample_rate(rate: int, where: str, ref: str | None = None) -> None:
    """Check an output rate against ``SAMPLE_RATES``.

    Raises:
        ProtocolError: ``unsupported_sample_rate``, naming the rates that work.
    """
    if rate not in SAMPLE_RATES:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"{where} {rate} Hz is not supported; use one of "
            f"{', '.join(map(str, SAMPLE_RATES))} (or leave it out for the server's rate)",
            ref,
        )


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
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if value is not None and wrong:
            raise ProtocolError(
                ErrorCode.BAD_OPTIONS,
                f"option '{name}' must be a {' or '.join(t.__name__ for t in types)}, "
                f"got {type(value).__name__}",
                ref,
            )
    return {k: v for k, v in options.items() if v is not None}
