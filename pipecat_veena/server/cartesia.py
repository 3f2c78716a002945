"""Cartesia's TTS API on the speech server: ``/tts/websocket`` and ``POST /tts/bytes``.

A bot built on Pipecat's ``CartesiaTTSService(url=...)`` or LiveKit's ``cartesia.TTS(base_url=...)``
speaks through this server by changing its URL (and key): the messages are Cartesia's (version
2026-03-01 shapes, as those clients send and read them), the machinery is our own WebSocket's.
A socket is a ``ws.Connection`` (its send loop, outbox, slow-client and idle handling, drain)
whose utterances are Cartesia *contexts* (``CartesiaContext``, a ``WsUtterance``: the same
``SpeechRun``, incremental sentence splitting, stream slots, caps and metrics, counted as
``api="ws"``; ``/tts/bytes`` counts as ``api="http"``).

A context's transcripts are concatenated verbatim and spoken from sentence boundaries (the same
splitter as our ``append``: "।" ends a sentence, "Rs. " does not), or, for text without one,
``max_buffer_delay_ms`` after it arrived (0: each transcript is spoken as it comes, which is
what both clients send in their default sentence mode). ``continue: false`` ends the context's
text; ``{"context_id", "cancel": true}`` aborts its generation; closing the socket aborts every
context on it. The server sends only ``chunk``, ``timestamps``, ``flush_done`` (after the audio
of a ``flush: true``), ``done`` and ``error``: Pipecat turns any type it does not know into an
error. What Cartesia's and ElevenLabs' endpoints share is in ``server.dropin``. docs/protocol.md
lists what is supported and what is refused.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response
from loguru import logger
from starlette.requests import ClientDisconnect

from pipecat_veena.interface import WordTiming
from pipecat_veena.remote.protocol import (
    Done,
    Error,
    ErrorCode,
    ProtocolError,
    check_unicode,
    load_json,
)
from pipecat_veena.server.dropin import (
    ENCODINGS,
    BufferedContext,
    ContextSpeak,
    DropinConnection,
    HttpSpeech,
    OutputFormat,
    bad,
    check_context_id,
    check_output_rate,
    encode_pcm,
    header_key,
    http_refused,
    http_status,
    language_options,
    refuse_handshake,
    speed_option,
    stream_speech,
)
from pipecat_veena.server.encode import FORMATS
from pipecat_veena.server.openai_routes import read_body
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.state import SpeechServer

#: Cartesia's paths (the clients append them to the base URL they are given).
WS_PATH = "/tts/websocket"
BYTES_PATH = "/tts/bytes"
#: Cartesia's key header.
KEY_HEADER = "x-api-key"
#: ``max_buffer_delay_ms`` when a message leaves it out (Cartesia's default) and its cap.
DEFAULT_BUFFER_DELAY_MS = 3000
MAX_BUFFER_DELAY_MS = 5000
#: Word times are sent in seconds with this many decimals.
_TIME_DECIMALS = 4
#: Cartesia's status code on every message of a stream still going.
_PARTIAL = 206

router = APIRouter()


# -- messages -------------------------------------------------------------------------------
def _json(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def done_message(context_id: str) -> str:
    """Cartesia's ``done``: the context is over (its last audio was sent before it)."""
    return _json({"type": "done", "done": True, "status_code": _PARTIAL, "context_id": context_id})


def error_body(code: str, message: str, context_id: str | None) -> dict[str, Any]:
    """Cartesia's ``error`` (also the body of a refused HTTP request).

    ``error_code`` is our stable code (docs/protocol.md), ``status_code`` the HTTP status that
    fits it. There is no ``done`` field: LiveKit's client reads ``done`` before ``type`` and
    would take the error for a normal end; both clients end the context on ``type: "error"``.
    """
    return {
        "type": "error",
        "title": code.replace("_", " ").capitalize(),
        "message": message,
        "error_code": code,
        "status_code": http_status(code),
        "context_id": context_id,
    }


def chunk_message(context_id: str, audio: bytes) -> str:
    """Cartesia's ``chunk``: a piece of the context's audio, base64."""
    data = base64.b64encode(audio).decode()
    return _json(
        {"type": "chunk", "data": data, "done": False, "status_code": _PARTIAL,
         "context_id": context_id}
    )  # fmt: skip


def timestamps_message(context_id: str, words: list[WordTiming]) -> str:
    """Cartesia's ``timestamps``: the transcript's own words, in seconds from its first audio."""
    stamps = {
        "words": [w.word for w in words],
        "start": [round(w.start, _TIME_DECIMALS) for w in words],
        "end": [round(w.end, _TIME_DECIMALS) for w in words],
    }
    return _json(
        {"type": "timestamps", "done": False, "status_code": _PARTIAL, "context_id": context_id,
         "word_timestamps": stamps}
    )  # fmt: skip


def parse_output_format(
    data: Any, default_rate: int, ref: str | None, *, http: bool
) -> OutputFormat:
    """Check ``output_format`` (None: raw pcm_s16le at the engine's rate).

    Raises:
        ProtocolError: ``bad_message`` for a container or encoding not served,
            ``unsupported_sample_rate`` for a rate not served.
    """
    if data is None:
        return OutputFormat("raw", "pcm_s16le", default_rate)
    if not isinstance(data, dict):
        raise bad("'output_format' must be an object {container, encoding, sample_rate}", ref)
    containers = ("raw", "wav", "mp3") if http else ("raw",)
    container = data.get("container", "raw")
    if container not in containers:
        raise bad(
            f"output_format.container {container!r} is not served here; use "
            f"{' or '.join(repr(c) for c in containers)}",
            ref,
        )
    encoding = data.get("encoding", "pcm_s16le")
    if container == "raw" and encoding not in ENCODINGS:
        raise bad(
            f"output_format.encoding {encoding!r} is not served; use one of {', '.join(ENCODINGS)}",
            ref,
        )
    if container == "wav" and encoding not in (None, "pcm_s16le"):
        raise bad("a 'wav' container carries pcm_s16le only; use container 'raw' for others", ref)
    rate = data.get("sample_rate", default_rate)
    rate = check_output_rate(rate, "output_format.sample_rate", ref)
    if container == "mp3" and rate not in (FORMATS["mp3"].rates or ()):
        raise bad(f"an 'mp3' container takes the rates {FORMATS['mp3'].rates}, not {rate}", ref)
    return OutputFormat(container, "pcm_s16le" if container != "raw" else encoding, rate)


# -- requests -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerationRequest:
    """What one generation request (a WebSocket message or a ``/tts/bytes`` body) asks."""

    transcript: str
    voice: str | None
    output: OutputFormat
    options: dict[str, Any]
    add_timestamps: bool = False
    more: bool = False  # ``continue``
    buffer_delay_ms: int = DEFAULT_BUFFER_DELAY_MS
    flush: bool = False
    output_given: bool = True  # (False: ``output`` is the default, the message had none)


def parse_request(
    data: dict[str, Any], default_rate: int, ref: str | None = None, *, http: bool = False
) -> GenerationRequest:
    """Check a generation request field by field; unknown fields are accepted and ignored.

    Raises:
        ProtocolError: the first problem, naming the field and what would work.
    """
    transcript = data.get("transcript")
    if not isinstance(transcript, str):
        raise bad("'transcript' (the text to speak) is required and must be a string", ref)
    check_unicode(transcript, "'transcript'", ref)
    voice = data.get("voice")
    if voice is not None:
        if not isinstance(voice, dict):
            raise bad('\'voice\' must be an object {"mode": "id", "id": <voice>}', ref)
        if voice.get("mode", "id") != "id":
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"voice mode {voice.get('mode')!r} is not served: this server has no voice "
                'embeddings; use {"mode": "id", "id": <voice>} with one of its voices '
                "(GET /v1/audio/voices), an OpenAI voice name, or a voice enrolled with "
                "POST /v1/audio/voices",
                ref,
            )
        voice = voice.get("id")
        if not isinstance(voice, str):
            raise bad("voice.id must be a voice name (string)", ref)
        check_unicode(voice, "voice.id", ref)
    output = parse_output_format(data.get("output_format"), default_rate, ref, http=http)
    options = language_options(data.get("language"), "'language'", ref)
    options.update(_check_generation_config(data.get("generation_config"), ref))
    if data.get("pronunciation_dict_id"):
        raise bad(
            "pronunciation_dict_id is not served: this server has no pronunciation "
            "dictionaries; leave it out",
            ref,
        )
    delay = data.get("max_buffer_delay_ms")
    if delay is None:
        delay = DEFAULT_BUFFER_DELAY_MS
    bad_delay = isinstance(delay, bool) or not isinstance(delay, int)
    if bad_delay or not 0 <= delay <= MAX_BUFFER_DELAY_MS:
        raise bad(f"max_buffer_delay_ms must be an integer from 0 to {MAX_BUFFER_DELAY_MS}", ref)
    flags = {}
    for name in ("add_timestamps", "continue", "flush"):
        value = data.get(name, False)
        if not isinstance(value, bool):
            raise bad(f"{name!r} must be true or false", ref)
        flags[name] = value
    return GenerationRequest(
        transcript, voice, output, options, flags["add_timestamps"], flags["continue"],
        delay, flags["flush"], data.get("output_format") is not None,
    )  # fmt: skip


def _check_generation_config(config: Any, ref: str | None) -> dict[str, float]:
    """``generation_config``: its speed option (0.5-2.0); volume 1.0 only, no emotion.

    Never a silent ignore: anything else is a ``bad_options`` naming it.
    """
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise bad("'generation_config' must be an object", ref)
    speed = speed_option(config.get("speed"), "generation_config", ref)
    volume = config.get("volume")
    if volume is not None and (isinstance(volume, bool) or volume != 1):
        raise ProtocolError(
            ErrorCode.BAD_OPTIONS,
            f"generation_config.volume {volume!r} is not served: the model speaks at its own "
            "volume; send 1.0 or leave it out",
            ref,
        )
    if config.get("emotion") is not None:
        raise ProtocolError(
            ErrorCode.BAD_OPTIONS,
            "generation_config.emotion is not served; leave it out (voices that take emotion "
            "tags read them inline in the transcript, see GET /v1/audio/voices)",
            ref,
        )
    return speed


def _cartesia_key(settings: ServerSettings, connection: Request | WebSocket) -> str:
    """The caller's key name from ``X-API-Key`` (Cartesia's header), else what our routes take.

    Raises:
        ProtocolError: ``unauthorized``.
    """
    return header_key(settings, connection, "X-API-Key")


def flush_done_message(context_id: str, flush_id: int) -> str:
    """Cartesia's ``flush_done``: the audio of the text before the ``flush`` was sent."""
    return _json(
        {"type": "flush_done", "flush_done": True, "flush_id": flush_id, "done": False,
         "status_code": _PARTIAL, "context_id": context_id}
    )  # fmt: skip


# -- the WebSocket --------------------------------------------------------------------------
class CartesiaContext(BufferedContext):
    """One Cartesia context: a buffered drop-in context whose messages are Cartesia's.

    Words go out before the audio they describe is complete (all the engine has timed so far,
    ahead of each chunk): Pipecat queues them in the context, LiveKit matches each with the text
    it sent.
    """

    def __init__(self, conn: CartesiaConnection, msg: ContextSpeak, voice: str) -> None:
        self.fixed = (msg.voice, msg.encoding, msg.sample_rate)  # the same on every message
        self.flushes = 0
        super().__init__(conn, msg, voice)

    def take(self, req: GenerationRequest) -> None:
        """A later message of this context: more text, a flush, or its end.

        Raises:
            ProtocolError: text for a context that was ended, or a voice or output format that
                differs from the context's first message.
        """
        if self.closed:
            if not req.more and not req.transcript.strip():
                return  # the end again (Pipecat may flush a context twice): nothing to do
            raise ProtocolError(
                ErrorCode.DUPLICATE_ID,
                f"context {self.id!r} was ended (continue: false) and is still speaking; it "
                "takes no more text: use a new context_id",
                self.id,
            )
        voice, encoding, rate = self.fixed  # (a message may leave them out)
        if (req.voice is not None and req.voice != voice) or (
            req.output_given and (req.output.encoding, req.output.sample_rate) != (encoding, rate)
        ):
            raise bad(
                f"context {self.id!r} keeps the voice and output_format of its first message; "
                "use a new context_id for another",
                self.id,
            )
        if req.transcript:
            self.append(req.transcript)  # over max_text_chars: the context ends with an error
        if self.closed:
            return
        if req.flush:
            self.flushed()
        if req.more:
            self._buffered()
        else:
            self._disarm()
            self.end()

    def flushed(self) -> None:
        """A ``flush: true``: speak the text so far now; ``flush_done`` after its audio."""
        if not self.closed:
            self.flush()
        self.flushes += 1
        self.after_queued(flush_done_message(self.id, self.flushes))

    async def _send_audio(self, pcm: bytes) -> None:
        await self._send_words(None)
        await self.conn.outbox.put(chunk_message(self.id, encode_pcm(pcm, self.encoding)))

    async def _send_words(self, played_s: float | None) -> None:
        if self.run.words:
            words = self.run.take_words(None)
            if words:
                await self.conn.outbox.put(timestamps_message(self.id, words))

    def _final_message(self, final: Done | Error) -> str:
        if isinstance(final, Done):
            return done_message(self.id)
        message = final.message
        if final.code == ErrorCode.TEXT_TIMEOUT:
            message = (
                f"context {self.id!r} got no transcript for "
                f"{self.conn.settings.open_utterance_timeout_s:g} s while open (continue: true; "
                "open_utterance_timeout_s); send continue: false when its text is over"
            )
        return _json(error_body(final.code, message, self.id))


class CartesiaConnection(DropinConnection):
    """A ``/tts/websocket`` socket: a drop-in socket with Cartesia's messages and contexts."""

    utterance_type = CartesiaContext
    utterances: dict[str, CartesiaContext]  # type: ignore[assignment]
    end_hint = "end one (continue: false)"

    def _error_text(self, error: Error) -> str:
        return _json(error_body(error.code, error.message, error.id))

    def _handle(self, text: str) -> str | None:
        self.check_size(text, "send long text in several messages of one context (continue: true)")
        data = load_json(text, "the message")
        if not isinstance(data, dict):
            raise bad("a message must be a JSON object with a 'context_id'")
        context_id = check_context_id(data.get("context_id"), "context_id")
        context = self.utterances.get(context_id)
        if data.get("cancel") is True:
            if context is not None:
                context.stop("cancel")
            return None  # (an ended context: cancelling is idempotent)
        req = parse_request(data, self.server.engine.sample_rate, context_id)
        if context is not None:
            context.take(req)
        elif not req.more and not req.transcript.strip():
            return done_message(context_id)  # ending what already ended (through the bound)
        else:
            speak = ContextSpeak(
                id=context_id, text=req.transcript, voice=req.voice, options=req.options,
                sample_rate=req.output.sample_rate, final=not req.more,
                words=req.add_timestamps, encoding=req.output.encoding,
                buffer_delay_ms=req.buffer_delay_ms,
            )  # fmt: skip
            self._speak(speak)
            if req.flush:
                self.utterances[context_id].flushed()
        return None


async def cartesia_websocket(websocket: WebSocket) -> None:
    """``/tts/websocket``: check the key, then serve Cartesia contexts on the socket.

    A bad key (or a server that cannot take streams) is refused in the handshake with the HTTP
    status and Cartesia's error body, so each client takes its own connection-error path.
    """
    server: SpeechServer = websocket.app.state.veena
    try:
        key = _cartesia_key(server.settings, websocket)
        problem = server.availability()
    except ProtocolError as e:
        key, problem = "", e
    if problem is not None:
        await refuse_handshake(websocket, problem, error_body(problem.code, problem.message, None))
        return
    await websocket.accept()
    await CartesiaConnection(websocket, server, key).run()


router.add_api_websocket_route(WS_PATH, cartesia_websocket)


# -- POST /tts/bytes ------------------------------------------------------------------------
def _error_of(error: ProtocolError) -> dict[str, Any]:
    return error_body(error.code, error.message, None)


@router.post(BYTES_PATH)
async def tts_bytes(request: Request) -> Response:
    """Cartesia's ``/tts/bytes``: the whole transcript's audio as one streamed body."""
    server: SpeechServer = request.app.state.veena
    try:
        key = _cartesia_key(server.settings, request)
        data = load_json(await read_body(request, server.settings), "the body")
        if not isinstance(data, dict):
            raise bad("the body must be a JSON object with 'transcript', 'voice', 'output_format'")
        req = parse_request(data, server.engine.sample_rate, http=True)
    except ProtocolError as e:
        return http_refused(server, e, _error_of)
    except ClientDisconnect:
        logger.info("speech server: a client disconnected before sending its whole request body")
        return Response(status_code=400)
    speech = HttpSpeech(req.transcript, req.voice, req.options, req.output)
    return await stream_speech(request, key, speech, _error_of)
