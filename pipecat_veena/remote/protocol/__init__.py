"""The speech server's WebSocket protocol: every message, the audio frame and the error codes.

Shared by the server (``pipecat_veena.server``) and its client (``RemoteVeenaEngine``); no web
framework here. Client messages are JSON text frames (``client``, checked strictly), server audio
is binary frames and every other server message a JSON text frame (``server``, read
forward-compatibly: unknown fields and types are ignored); ``codes`` holds the error codes.
docs/protocol.md describes it for client writers.
"""

from pipecat_veena.remote.protocol.client import (
    MAX_ID_LENGTH,
    OPTION_TYPES,
    SAMPLE_RATES,
    STREAM_PATH,
    Append,
    Cancel,
    ClientMessage,
    End,
    Flush,
    Speak,
    check_option_types,
    check_sample_rate,
    check_unicode,
    load_json,
    parse_client_message,
    to_json,
)
from pipecat_veena.remote.protocol.codes import (
    RETRYABLE,
    ErrorCode,
    ProtocolError,
    RemoteInputError,
    code_for,
    error_for,
)
from pipecat_veena.remote.protocol.server import (
    AUDIO_FRAME,
    CLOSE_GOING_AWAY,
    PROTOCOL_VERSION,
    AudioFrame,
    Done,
    Error,
    GoAway,
    Ready,
    ServerMessage,
    Words,
    decode_audio_frame,
    encode_audio_frame,
    parse_server_message,
    word_from_json,
    word_json,
)

__all__ = [
    "AUDIO_FRAME",
    "CLOSE_GOING_AWAY",
    "MAX_ID_LENGTH",
    "OPTION_TYPES",
    "PROTOCOL_VERSION",
    "RETRYABLE",
    "SAMPLE_RATES",
    "STREAM_PATH",
    "Append",
    "AudioFrame",
    "Cancel",
    "ClientMessage",
    "Done",
    "End",
    "Error",
    "ErrorCode",
    "Flush",
    "GoAway",
    "ProtocolError",
    "Ready",
    "RemoteInputError",
    "ServerMessage",
    "Speak",
    "Words",
    "check_option_types",
    "check_sample_rate",
    "check_unicode",
    "code_for",
    "decode_audio_frame",
    "encode_audio_frame",
    "error_for",
    "load_json",
    "parse_client_message",
    "parse_server_message",
    "to_json",
    "word_from_json",
    "word_json",
]
