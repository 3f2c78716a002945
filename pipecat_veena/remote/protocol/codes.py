"""The protocol's error codes and error type, and their mapping to this package's exceptions.

Both sides use it: the server turns engine exceptions into codes (``code_for``), the client turns
codes back into exceptions (``error_for``). docs/protocol.md lists every code.
"""

from __future__ import annotations

from pipecat_veena.errors import (
    EnrolmentError,
    GenerationError,
    MalformedStreamError,
    NoAudioError,
    RemoteError,
    ServerUnavailableError,
    UnknownVoiceError,
    VeenaError,
)


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
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    TOO_MANY_OPEN_UTTERANCES = "too_many_open_utterances"
    TEXT_TIMEOUT = "text_timeout"
    UNKNOWN_VOICE = "unknown_voice"
    BAD_OPTIONS = "bad_options"
    TOO_MANY_STREAMS = "too_many_streams"
    NO_AUDIO = "no_audio"
    GENERATION_FAILED = "generation_failed"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL = "internal"
    # HTTP only: the request itself (the connection is closed after the answer)
    REQUEST_TIMEOUT = "request_timeout"
    HEADERS_TOO_LARGE = "headers_too_large"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    # HTTP only: voice enrolment (POST /v1/audio/voices)
    NOT_AUDIO = "not_audio"
    UNSUPPORTED_CODEC = "unsupported_codec"
    BAD_VOICE_CLIP = EnrolmentError.BAD_CLIP
    BAD_VOICE_NAME = EnrolmentError.BAD_NAME
    VOICE_NAME_TAKEN = EnrolmentError.NAME_TAKEN
    VOICE_NOT_OWNED = EnrolmentError.NOT_OWNER
    TOO_MANY_VOICES = EnrolmentError.TOO_MANY_VOICES
    ENROLMENT_UNSUPPORTED = EnrolmentError.UNSUPPORTED
    CONSENT_REQUIRED = "consent_required"
    TRANSCRIPT_UNSUPPORTED = "transcript_unsupported"
    UPLOADS_BUSY = "uploads_busy"


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
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.UPLOADS_BUSY,
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


#: Codes whose exception text is the server's business: the client gets this line instead (the
#: server's log keeps the detail); other codes' messages were written for the client.
_GENERIC_MESSAGES = {
    ErrorCode.INTERNAL: "the server failed unexpectedly",
    ErrorCode.GENERATION_FAILED: "generation failed on the server",
    ErrorCode.ENGINE_UNAVAILABLE: "the server's engine is not available",
}


def client_message(code: str, error: BaseException, request_id: str | None = None) -> str:
    """What the client is told about ``error`` reported as ``code`` (see ``code_for``).

    Errors about the request (unknown voice, bad options, no audio) keep their message, which
    names the fix; for the others the client gets a fixed line and the request id, never the
    exception's text (paths, backend internals), which only the server's log gets.
    """
    generic = _GENERIC_MESSAGES.get(code)
    if generic is None:
        return str(error) or type(error).__name__
    ref = f" (request {request_id})" if request_id else ""
    return f"{generic}{ref}; its log has the details"


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
    if code in (ErrorCode.BAD_OPTIONS, ErrorCode.TEXT_TOO_LONG, ErrorCode.BAD_MESSAGE,
                ErrorCode.UNSUPPORTED_SAMPLE_RATE):  # fmt: skip
        return RemoteInputError(message, code=code)
    return RemoteError(message, code=code, retryable=code in RETRYABLE)
