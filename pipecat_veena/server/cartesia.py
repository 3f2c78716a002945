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
context on it. The server sends only ``chunk``, ``timestamps``, ``done`` and ``error``: Pipecat
turns any type it does not know into an error. docs/protocol.md lists what is supported and
what is refused.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from loguru import logger
from starlette.requests import ClientDisconnect

from pipecat_veena.engine import check_speed
from pipecat_veena.interface import WordTiming
from pipecat_veena.remote.protocol import (
    CLOSE_GOING_AWAY,
    Done,
    Error,
    ErrorCode,
    ProtocolError,
    Speak,
    check_sample_rate,
    check_unicode,
    load_json,
)
from pipecat_veena.server.encode import FORMATS, StreamEncoder
from pipecat_veena.server.http_stream import (
    AudioPump,
    AudioStreamResponse,
    PumpStopped,
    StreamAborted,
)
from pipecat_veena.server.limits import authenticate, client_address, voice_owner
from pipecat_veena.server.openai_routes import _STATUS as HTTP_STATUS
from pipecat_veena.server.openai_routes import read_body
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.speech import SpeechRun
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.ws import CLOSE_POLICY, CLOSE_TRY_LATER, Connection
from pipecat_veena.server.ws_utterance import WsUtterance

#: Cartesia's paths (the clients append them to the base URL they are given).
WS_PATH = "/tts/websocket"
BYTES_PATH = "/tts/bytes"
#: ``output_format.encoding`` values served (``container: "raw"``).
ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
#: ``max_buffer_delay_ms`` when a message leaves it out (Cartesia's default) and its cap.
DEFAULT_BUFFER_DELAY_MS = 3000
MAX_BUFFER_DELAY_MS = 5000
#: Longest ``context_id`` taken (Pipecat sends UUIDs, LiveKit 12-character ids).
MAX_CONTEXT_ID = 256
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
        "status_code": HTTP_STATUS.get(code, 400),
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


# -- audio ----------------------------------------------------------------------------------
#: G.711 segment ends (μ-law on 14-bit, A-law on 13-bit magnitudes).
_ULAW_SEGMENTS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENTS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def encode_pcm(pcm: bytes, encoding: str) -> bytes:
    """Mono int16 PCM in ``encoding`` (one of ``ENCODINGS``); G.711 bit-exact with audioop."""
    if encoding == "pcm_s16le":
        return pcm
    x = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    if encoding == "pcm_f32le":
        return (x / 32768.0).astype("<f4").tobytes()
    if encoding == "pcm_mulaw":  # on 14 bits, bias 33, clip 8159 (Sun's g711.c, audioop)
        v = x >> 2
        mask = np.where(v < 0, 0x7F, 0xFF)
        mag = np.minimum(np.abs(v), 8159) + 33
        seg = np.searchsorted(_ULAW_SEGMENTS, mag)
        code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> np.minimum(seg + 1, 8)) & 0x0F))
        return ((code ^ mask) & 0xFF).astype(np.uint8).tobytes()
    if encoding == "pcm_alaw":  # on 13 bits, even bits inverted
        v = x >> 3
        mask = np.where(v >= 0, 0xD5, 0x55)
        mag = np.where(v >= 0, v, -v - 1)
        seg = np.searchsorted(_ALAW_SEGMENTS, mag)
        quant = (mag >> np.clip(seg, 1, 8)) & 0x0F
        code = np.where(seg >= 8, 0x7F, (seg << 4) | quant)
        return ((code ^ mask) & 0xFF).astype(np.uint8).tobytes()
    raise ValueError(f"unknown encoding {encoding!r}")


@dataclass(frozen=True)
class OutputFormat:
    """A checked ``output_format``."""

    container: str
    encoding: str
    sample_rate: int


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
        raise _bad("'output_format' must be an object {container, encoding, sample_rate}", ref)
    containers = ("raw", "wav", "mp3") if http else ("raw",)
    container = data.get("container", "raw")
    if container not in containers:
        raise _bad(
            f"output_format.container {container!r} is not served here; use "
            f"{' or '.join(repr(c) for c in containers)}",
            ref,
        )
    encoding = data.get("encoding", "pcm_s16le")
    if container == "raw" and encoding not in ENCODINGS:
        raise _bad(
            f"output_format.encoding {encoding!r} is not served; use one of {', '.join(ENCODINGS)}",
            ref,
        )
    if container == "wav" and encoding not in (None, "pcm_s16le"):
        raise _bad("a 'wav' container carries pcm_s16le only; use container 'raw' for others", ref)
    rate = data.get("sample_rate", default_rate)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise _bad("output_format.sample_rate must be an integer number of Hz", ref)
    check_sample_rate(rate, "output_format.sample_rate", ref)
    if container == "mp3" and rate not in (FORMATS["mp3"].rates or ()):
        raise _bad(f"an 'mp3' container takes the rates {FORMATS['mp3'].rates}, not {rate}", ref)
    return OutputFormat(container, "pcm_s16le" if container != "raw" else encoding, rate)


# -- requests -------------------------------------------------------------------------------
def _bad(message: str, ref: str | None = None) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, message, ref)


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
        raise _bad("'transcript' (the text to speak) is required and must be a string", ref)
    check_unicode(transcript, "'transcript'", ref)
    voice = data.get("voice")
    if voice is not None:
        if not isinstance(voice, dict):
            raise _bad("'voice' must be an object {\"mode\": \"id\", \"id\": <voice>}", ref)
        if voice.get("mode", "id") != "id":
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"voice mode {voice.get('mode')!r} is not served: this server has no voice "
                "embeddings; use {\"mode\": \"id\", \"id\": <voice>} with one of its voices "
                "(GET /v1/audio/voices), an OpenAI voice name, or a voice enrolled with "
                "POST /v1/audio/voices",
                ref,
            )
        voice = voice.get("id")
        if not isinstance(voice, str):
            raise _bad("voice.id must be a voice name (string)", ref)
        check_unicode(voice, "voice.id", ref)
    output = parse_output_format(data.get("output_format"), default_rate, ref, http=http)
    options: dict[str, Any] = {}
    language = data.get("language")
    if language is not None and not isinstance(language, str):
        raise _bad("'language' must be a language code such as 'hi' or 'en' (or null)", ref)
    if language and language.lower().startswith("hi"):
        options["language"] = "hi"
    speed = _check_generation_config(data.get("generation_config"), ref)
    if speed is not None and speed != 1:
        options["speed"] = speed
    if data.get("pronunciation_dict_id"):
        raise _bad(
            "pronunciation_dict_id is not served: this server has no pronunciation "
            "dictionaries; leave it out",
            ref,
        )
    delay = data.get("max_buffer_delay_ms")
    if delay is None:
        delay = DEFAULT_BUFFER_DELAY_MS
    bad_delay = isinstance(delay, bool) or not isinstance(delay, int)
    if bad_delay or not 0 <= delay <= MAX_BUFFER_DELAY_MS:
        raise _bad(f"max_buffer_delay_ms must be an integer from 0 to {MAX_BUFFER_DELAY_MS}", ref)
    flags = {}
    for name in ("add_timestamps", "continue", "flush"):
        value = data.get(name, False)
        if not isinstance(value, bool):
            raise _bad(f"{name!r} must be true or false", ref)
        flags[name] = value
    return GenerationRequest(
        transcript, voice, output, options, flags["add_timestamps"], flags["continue"],
        delay, flags["flush"], data.get("output_format") is not None,
    )  # fmt: skip


def _check_generation_config(config: Any, ref: str | None) -> float | None:
    """``generation_config``: its speed (0.5-2.0, or None); volume 1.0 only, no emotion.

    Never a silent ignore: anything else is a ``bad_options`` naming it.
    """
    if config is None:
        return None
    if not isinstance(config, dict):
        raise _bad("'generation_config' must be an object", ref)
    speed = config.get("speed")
    if speed is not None:
        try:
            speed = check_speed(speed)
        except ValueError as e:
            raise ProtocolError(ErrorCode.BAD_OPTIONS, f"generation_config.{e}", ref) from None
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
    """The caller's key name: ``X-API-Key`` (Cartesia's header), else what our routes take.

    Raises:
        ProtocolError: ``unauthorized``.
    """
    header = connection.headers.get("x-api-key")
    authorization = f"Bearer {header}" if header else connection.headers.get("authorization")
    try:
        return authenticate(settings, authorization, connection.query_params.get("api_key"))
    except ProtocolError as e:
        if header:
            raise ProtocolError(e.code, "the X-API-Key is not valid here") from None
        raise ProtocolError(
            e.code, "this server needs an API key: send it in the X-API-Key header"
        ) from None


# -- the WebSocket --------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextSpeak(Speak):
    """A ``speak`` for a Cartesia context: ``Speak`` plus how the context is sent."""

    encoding: str = "pcm_s16le"
    buffer_delay_ms: int = DEFAULT_BUFFER_DELAY_MS
    voice_given: str | None = None


class CartesiaContext(WsUtterance):
    """One Cartesia context: an utterance whose messages are Cartesia's.

    Words go out before the audio they describe is complete (all the engine has timed so far,
    ahead of each chunk): Pipecat queues them in the context, LiveKit matches each with the text
    it sent.
    """

    def __init__(self, conn: CartesiaConnection, msg: ContextSpeak, voice: str) -> None:
        self.encoding = msg.encoding
        self.buffer_delay_ms = msg.buffer_delay_ms
        self.fixed = (msg.voice_given, msg.encoding, msg.sample_rate)  # the same on every message
        self._timer: asyncio.TimerHandle | None = None
        super().__init__(conn, msg, voice)
        if not msg.final:
            self._buffered()

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
            raise _bad(
                f"context {self.id!r} keeps the voice and output_format of its first message; "
                "use a new context_id for another",
                self.id,
            )
        if req.transcript:
            self.append(req.transcript)  # over max_text_chars: the context ends with an error
        if self.closed:
            return
        if req.flush:
            self.flush()
        if req.more:
            self._buffered()
        else:
            self._disarm()
            self.end()

    # -- buffering --------------------------------------------------------------------------
    def _buffered(self) -> None:
        """Text without a sentence end waits at most ``max_buffer_delay_ms``."""
        if self.buffer_delay_ms == 0:
            self.flush()
        elif not self.pending.strip():
            self._disarm()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.buffer_delay_ms / 1000, self._buffer_due)

    def _buffer_due(self) -> None:
        self._timer = None
        if not self.closed:
            self.flush()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- what the client gets ---------------------------------------------------------------
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

    def _close(self, outcome: str, final: Done | Error | None) -> None:
        self._disarm()
        super()._close(outcome, final)


class CartesiaConnection(Connection):
    """A ``/tts/websocket`` socket: ``ws.Connection`` with Cartesia's messages and contexts."""

    utterance_type = CartesiaContext
    utterances: dict[str, CartesiaContext]  # type: ignore[assignment]
    _closing: asyncio.Task[None] | None = None  # the close of a socket idle at a drain

    def _hello(self) -> str | None:
        return None  # Cartesia sends nothing until the first request

    def _error_text(self, error: Error) -> str:
        return _json(error_body(error.code, error.message, error.id))

    def go_away(self) -> None:
        """The server drains: close once the contexts in flight end (the clients reconnect).

        Cartesia has no message for it (either client would take one for an error).
        """
        if self.leaving:
            return
        self.leaving = True
        if not self.utterances:  # else the send loop closes after the last context's done
            self._closing = asyncio.get_running_loop().create_task(
                self._close_with(None, CLOSE_GOING_AWAY)
            )

    def _check_open_cap(self) -> None:
        try:
            super()._check_open_cap()
        except ProtocolError as e:
            cap = self.settings.max_open_utterances
            raise ProtocolError(
                e.code,
                f"this socket already has {cap} contexts taking text (continue: true), the "
                "server's cap (max_open_utterances); end one (continue: false) first",
            ) from None

    def _handle(self, text: str) -> str | None:
        limit = self.settings.max_message_bytes
        if len(text) > limit or len(text.encode()) > limit:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a message may have at most {limit} bytes; send long text in several messages "
                "of one context (continue: true)",
            )
        data = load_json(text, "the message")
        if not isinstance(data, dict):
            raise _bad("a message must be a JSON object with a 'context_id'")
        context_id = data.get("context_id")
        if not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID:
            raise _bad(f"'context_id' must be a string of 1-{MAX_CONTEXT_ID} characters")
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
                buffer_delay_ms=req.buffer_delay_ms, voice_given=req.voice,
            )  # fmt: skip
            self._speak(speak)
            if req.flush and req.more:
                self.utterances[context_id].flush()
        return None


async def cartesia_websocket(websocket: WebSocket) -> None:
    """``/tts/websocket``: check the key, then serve Cartesia contexts on the socket.

    A bad key (or a server that cannot take streams) is refused in the handshake with the HTTP
    status and Cartesia's error body, so each client takes its own connection-error path.
    """
    server: SpeechServer = websocket.app.state.veena
    key = None
    try:
        key = _cartesia_key(server.settings, websocket)
        problem = server.availability()
    except ProtocolError as e:
        problem = e
    if problem is not None:
        server.metrics.error("ws", problem.code)
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            status = HTTP_STATUS.get(problem.code, 400)
            body = error_body(problem.code, problem.message, None)
            await websocket.send_denial_response(JSONResponse(body, status_code=status))
        else:
            policy = problem.code == ErrorCode.UNAUTHORIZED
            await websocket.close(CLOSE_POLICY if policy else CLOSE_TRY_LATER)
        return
    await websocket.accept()
    await CartesiaConnection(websocket, server, key).run()


router.add_api_websocket_route(WS_PATH, cartesia_websocket)


# -- POST /tts/bytes ------------------------------------------------------------------------
def _refused(error: ProtocolError) -> JSONResponse:
    status = HTTP_STATUS.get(error.code, 400)
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    body = error_body(error.code, error.message, None)
    return JSONResponse(body, status_code=status, headers=headers)


@router.post(BYTES_PATH)
async def tts_bytes(request: Request) -> Response:
    """Cartesia's ``/tts/bytes``: the whole transcript's audio as one streamed body."""
    server: SpeechServer = request.app.state.veena
    settings = server.settings
    try:
        key = _cartesia_key(settings, request)
        data = load_json(await read_body(request, settings), "the body")
        if not isinstance(data, dict):
            raise _bad("the body must be a JSON object with 'transcript', 'voice', 'output_format'")
        req = parse_request(data, server.engine.sample_rate, http=True)
        problem = server.availability()
        if problem is not None:
            raise problem
        server.check_text(req.transcript)
        if not server.speakable(req.transcript):
            raise _bad("'transcript' has nothing to say (no letters or digits outside markup)")
        voice = server.resolve_voice(req.voice, voice_owner(settings, request))
        server.check_options(req.options)
        run = SpeechRun(
            server, api="http", key=key, voice=voice, options=req.options,
            out_rate=req.output.sample_rate, cancel=lambda code: None,
            client=client_address(request),
        )  # fmt: skip
    except ProtocolError as e:
        if e.code != ErrorCode.UNAUTHORIZED:
            server.metrics.requests.labels("http", "rejected").inc()
        server.metrics.error("http", e.code)
        return _refused(e)
    except ClientDisconnect:
        logger.info("speech server: a client disconnected before sending its whole request body")
        return Response(status_code=400)
    pump = AudioPump(run, req.transcript)
    try:
        first = await pump.next()
    except PumpStopped as e:
        await pump.close("cancelled")
        server.metrics.error("http", e.code)
        return _refused(ProtocolError(e.code, "the server stopped this request; retry it"))
    except Exception as e:
        await pump.close("failed")
        return _refused(run.failure(e))
    except BaseException:
        await pump.close("disconnected")
        raise
    outcome = ["disconnected"]
    media = {"wav": "audio/wav", "mp3": "audio/mpeg"}.get(req.output.container, "audio/pcm")
    return AudioStreamResponse(
        _bytes_body(pump, first, req.output, outcome),
        pump=pump,
        slow_client_timeout_s=settings.slow_client_timeout_s,
        outcome=outcome,
        media_type=media,
        headers={"x-request-id": run.request_id, "x-sample-rate": str(req.output.sample_rate)},
    )


async def _bytes_body(
    pump: AudioPump, first: bytes | None, output: OutputFormat, outcome: list[str]
) -> AsyncIterator[bytes]:
    raw = output.container == "raw"
    encoder = StreamEncoder(FORMATS["pcm" if raw else output.container], output.sample_rate)
    pcm = first
    try:
        data = encoder.head()
        while pcm is not None:
            data += encode_pcm(pcm, output.encoding) if raw else encoder.encode(pcm)
            if data:
                yield data
            data = b""
            pcm = await pump.next()
        data = encoder.finish()
        if data:
            yield data
    except Exception as e:  # after the head was sent: abort the transfer (never a clean end)
        stopped = isinstance(e, PumpStopped)
        outcome[0] = "cancelled" if stopped else "failed"
        code = e.code if stopped else pump.run.failure(e, what="ended early").code
        pump.run.server.metrics.error("http", code)
        raise StreamAborted(code) from None
    finally:
        encoder.close()
    outcome[0] = "completed"
