"""OpenAI-compatible routes: ``POST /v1/audio/speech``, ``/v1/audio/voices``, ``/v1/models``.

Speech streams as it is generated, in any of OpenAI's response formats (``mp3`` by default, as
OpenAI's; raw ``pcm`` is 24 kHz s16le mono with no header; ``wav``, ``opus``, ``aac``, ``flac``:
see ``encode``), or with ``stream_format: sse`` as ``speech.audio.delta`` /
``speech.audio.done`` events carrying the same bytes (and ``speech.words``: word timings, after
the audio that completes them). The first audio is awaited before the
response starts, so errors up to then still get a proper status code and an OpenAI-shaped body;
a stream that cannot finish after that is aborted (an incomplete transfer, never a clean end).
The body is read against its limits: Content-Length first, then its size as it streams, within
a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from loguru import logger
from starlette.requests import ClientDisconnect

from pipecat_veena.audio import BYTES_PER_SAMPLE
from pipecat_veena.engine import check_speed
from pipecat_veena.remote.protocol import (
    OPTION_TYPES,
    ErrorCode,
    ProtocolError,
    check_option_types,
    check_sample_rate,
    check_unicode,
    load_json,
)
from pipecat_veena.server.audio_out import sse_audio_delta, sse_audio_done, sse_event, sse_words
from pipecat_veena.server.encode import AudioFormat, StreamEncoder, check_format
from pipecat_veena.server.http_stream import (
    AudioPump,
    AudioStreamResponse,
    PumpStopped,
    StreamAborted,
)
from pipecat_veena.server.limits import authenticate, client_address, voice_owner
from pipecat_veena.server.markup import check_markup
from pipecat_veena.server.settings import OPENAI_VOICES, ServerSettings
from pipecat_veena.server.speech import SpeechRun
from pipecat_veena.server.state import SpeechServer

#: OpenAI's ``pcm`` is 24 kHz s16le mono; every format uses that rate unless asked otherwise.
OPENAI_PCM_RATE = 24000
#: OpenAI's default ``response_format``.
DEFAULT_FORMAT = "mp3"
STREAM_FORMATS = ("audio", "sse")
#: Model names OpenAI clients send by default; any name is accepted (one server, one model).
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
_STATUS = {
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.NO_AUDIO: 422,
    ErrorCode.TOO_MANY_STREAMS: 429,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.GENERATION_FAILED: 500,
    ErrorCode.INTERNAL: 500,
    ErrorCode.SERVER_STARTING: 503,
    ErrorCode.SERVER_DRAINING: 503,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.TOO_MANY_CONNECTIONS: 503,
    ErrorCode.NOT_AUDIO: 415,
    ErrorCode.UNSUPPORTED_CODEC: 415,
    ErrorCode.BAD_VOICE_CLIP: 422,
    ErrorCode.VOICE_NAME_TAKEN: 409,
    ErrorCode.VOICE_NOT_OWNED: 403,
    ErrorCode.TOO_MANY_VOICES: 409,
    ErrorCode.TRANSCRIPT_UNSUPPORTED: 422,
    ErrorCode.ENROLMENT_UNSUPPORTED: 422,
}

router = APIRouter()


def error_response(
    error: ProtocolError, param: str | None = None, status: int | None = None
) -> JSONResponse:
    """An OpenAI-shaped error body with the status that fits the code (or ``status``)."""
    status = status or _STATUS.get(error.code, 400)
    kind = {401: "authentication_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    body = {"error": {"message": error.message, "type": kind, "param": param, "code": error.code}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass(frozen=True)
class SpeechRequest:
    """A checked ``POST /v1/audio/speech`` body."""

    input: str
    voice: str | None
    response_format: AudioFormat
    stream_format: str
    sample_rate: int
    options: dict[str, Any]


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, message)


def parse_speech_request(body: bytes) -> SpeechRequest:
    """Check a request body field by field; each problem names the field and the fix.

    Raises:
        ProtocolError: bad JSON, a missing or mistyped field, an unsupported value.
    """
    data = load_json(body, "the body")
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object with 'input', 'voice' and 'model'")
    text = data.get("input")
    if not isinstance(text, str):
        raise _bad("'input' (the text to speak) is required and must be a string")
    check_unicode(text, "'input'")
    if not isinstance(data.get("model", ""), str):
        raise _bad("'model' must be a string")
    voice = data.get("voice")
    if isinstance(voice, dict):  # OpenAI's custom voice object {"id": ...}
        if set(voice) != {"id"} or not isinstance(voice["id"], str):
            raise _bad(
                f"'voice' as an object must be OpenAI's custom voice {{\"id\": <voice>}}, got "
                f"the fields {sorted(voice)}; or send the voice name as a string"
            )
        voice = voice["id"]
    if voice is not None and not isinstance(voice, str):
        raise _bad("'voice' must be a voice name (or OpenAI's custom voice {\"id\": <voice>})")
    if voice is not None:
        check_unicode(voice, "'voice'")
    fmt = data.get("response_format") or DEFAULT_FORMAT
    if not isinstance(fmt, str):
        raise _bad("'response_format' must be a string such as 'mp3', 'pcm' or 'wav'")
    stream_format = data.get("stream_format") or "audio"
    if stream_format not in STREAM_FORMATS:
        raise _bad(f"stream_format must be 'audio' or 'sse', got {stream_format!r}")
    if data.get("speed") is not None:
        try:
            check_speed(data["speed"])
        except ValueError as e:
            raise _bad(f"'speed': {e}") from None
    if not isinstance(data.get("instructions") or "", str):
        raise _bad("'instructions' must be a string (it is accepted and ignored)")
    rate = data.get("sample_rate", OPENAI_PCM_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise _bad("'sample_rate' must be an integer number of Hz")
    check_sample_rate(rate, "'sample_rate'")
    try:
        audio_format = check_format(fmt, rate)
    except ValueError as e:
        raise _bad(str(e)) from None
    options = check_option_types({k: data[k] for k in OPTION_TYPES if k in data})
    return SpeechRequest(text, voice, audio_format, stream_format, rate, options)


def _stopped_message(code: str) -> str:
    if code == ErrorCode.SERVER_DRAINING:
        return "the server is shutting down; retry elsewhere"
    return f"the server stopped this request ({code}); retry it"


async def read_body(request: Request, settings: ServerSettings, cap: int | None = None) -> bytes:
    """The request body, read within ``body_timeout_s`` and never past ``cap``.

    ``cap``: None for ``max_message_bytes`` (uploads pass ``max_upload_bytes``).

    A declared Content-Length over the cap is refused before reading; a chunked body is read
    only up to the cap.

    Raises:
        ProtocolError: ``message_too_large`` or ``request_timeout``.
    """
    cap = cap or settings.max_message_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the body has {int(declared)} bytes (Content-Length), over this server's cap of {cap}",
        )
    body = bytearray()
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            async for piece in request.stream():
                body += piece
                if len(body) > cap:
                    raise ProtocolError(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"the body is over this server's cap of {cap} bytes",
                    )
    except TimeoutError:
        raise ProtocolError(
            ErrorCode.REQUEST_TIMEOUT,
            f"the body did not arrive whole within {settings.body_timeout_s:g} s "
            "(body_timeout_s); send it at once",
        ) from None
    return bytes(body)


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    """Speak ``input``: audio streams as it is generated (see the module docstring)."""
    server: SpeechServer = request.app.state.veena
    settings = server.settings
    try:
        key = authenticate(settings, request.headers.get("authorization"), None)
        req = parse_speech_request(await read_body(request, settings))
        problem = server.availability()
        if problem is not None:
            raise problem
        server.check_text(req.input)
        if not server.speakable(req.input):
            raise _bad("'input' has nothing to say (no letters or digits outside markup)")
        voice = server.resolve_voice(req.voice, voice_owner(settings, request))
        server.check_options(req.options)
        check_markup(req.input, req.options)
        run = SpeechRun(
            server, api="http", key=key, voice=voice, options=req.options,
            out_rate=req.sample_rate, cancel=lambda code: None, client=client_address(request),
            traceparent=request.headers.get("traceparent"),
            words=req.stream_format == "sse",
        )  # fmt: skip
    except ProtocolError as e:
        if e.code != ErrorCode.UNAUTHORIZED:
            server.metrics.requests.labels("http", "rejected").inc()
        server.metrics.error("http", e.code)
        return error_response(e)
    except ClientDisconnect:  # the client's business: one line, no traceback
        logger.info("speech server: a client disconnected before sending its whole request body")
        return Response(status_code=400)  # nobody reads it
    pump = AudioPump(run, req.input)
    try:
        first = await pump.next()
    except PumpStopped as e:
        await pump.close("cancelled")
        server.metrics.error("http", e.code)
        return error_response(ProtocolError(e.code, _stopped_message(e.code)))
    except Exception as e:
        await pump.close("failed")
        failure = run.failure(e)
        server.metrics.error("http", failure.code)
        return error_response(failure)
    except BaseException:
        await pump.close("disconnected")
        raise
    outcome = ["disconnected"]
    sse = req.stream_format == "sse"
    return AudioStreamResponse(
        _body(pump, first, req, outcome),
        pump=pump,
        slow_client_timeout_s=settings.slow_client_timeout_s,
        outcome=outcome,
        media_type="text/event-stream" if sse else req.response_format.media_type,
        headers={"x-request-id": run.request_id, "x-sample-rate": str(req.sample_rate)},
    )


async def _body(
    pump: AudioPump, first: bytes | None, req: SpeechRequest, outcome: list[str]
) -> AsyncIterator[bytes]:
    sse = req.stream_format == "sse"
    encoder = StreamEncoder(req.response_format, req.sample_rate)
    pcm = first
    sent_s = 0.0  # audio handed to the encoder (words within it may follow its delta)
    try:
        data = encoder.head()
        while pcm is not None:
            data += encoder.encode(pcm)
            sent_s += len(pcm) / (BYTES_PER_SAMPLE * req.sample_rate)
            if data:
                yield sse_audio_delta(data) if sse else data
                if sse and (words := pump.run.take_words(sent_s)):
                    yield sse_words(words)
            data = b""
            pcm = await pump.next()
        data = encoder.finish()
        if data:
            yield sse_audio_delta(data) if sse else data
        if sse and (words := pump.run.take_words()):
            yield sse_words(words)
    except Exception as e:  # after the head was sent: say why in SSE, then abort the transfer
        stopped = isinstance(e, PumpStopped)
        outcome[0] = "cancelled" if stopped else "failed"
        if stopped:
            code, message = e.code, _stopped_message(e.code)
        else:  # logged with its detail; the client gets the code and a line it may know
            failure = pump.run.failure(e, what="ended early")
            code, message = failure.code, failure.message
        message = f"{message} (cut short after {pump.run.audio_seconds:.2f} s of audio)"
        pump.run.server.metrics.error("http", code)
        if stopped:
            logger.bind(**pump.run.log_context).warning(
                f"speech server: {pump.run.request_id} ended early: {code}: {message}"
            )
        if sse:
            yield sse_event({"type": "error", "error": {"code": code, "message": message}})
        raise StreamAborted(f"{code}: {message}") from None
    finally:
        encoder.close()
    if sse:
        yield sse_audio_done(pump.run.tokens)
    outcome[0] = "completed"


def admitted(request: Request) -> SpeechServer:
    """The app's server, once the request's key is good and the engine is ready.

    Raises:
        ProtocolError: ``unauthorized``, or why the server cannot serve now.
    """
    server: SpeechServer = request.app.state.veena
    authenticate(server.settings, request.headers.get("authorization"), None)
    problem = server.availability()
    if problem is not None:
        raise problem
    return server


@router.get("/v1/audio/voices")
async def voices(request: Request) -> Response:
    """The voices this caller may use (default first), OpenAI's names' map, the model.

    ``voices`` holds the enrolled voices the caller may use too, ``enrolled`` only those
    (``POST`` enrols one); ``owned``: the enrolled voices this caller may remove (its own);
    ``shared``: the enrolled voices every caller may use. Another key's voice is not listed.
    ``demo`` is true on a demo checkpoint (random weights: its voices make sound, not words).
    """
    try:
        server = admitted(request)
    except ProtocolError as e:
        return error_response(e)
    engine = server.engine
    names, enrolled = server.voices_for(voice_owner(server.settings, request))
    return JSONResponse(
        {
            "voices": names,
            "enrolled": sorted(enrolled),
            "owned": sorted(n for n, (owned, _) in enrolled.items() if owned),
            "shared": sorted(n for n, (_, shared) in enrolled.items() if shared),
            "default": engine.voices[0],
            "voice_levels": server.voice_levels,
            "openai_aliases": {name: server.voice_map[name] for name in OPENAI_VOICES},
            "model": engine.model_name,
            "demo": server.demo,
        }
    )


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """OpenAI's model list: the served checkpoint and the names clients send by default."""
    server: SpeechServer = request.app.state.veena
    try:
        authenticate(server.settings, request.headers.get("authorization"), None)
    except ProtocolError as e:
        return error_response(e)
    names = [server.engine.model_name if server.ready else "veena", *MODEL_ALIASES]
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "pipecat-veena"} for n in names]
    return JSONResponse({"object": "list", "data": data})
