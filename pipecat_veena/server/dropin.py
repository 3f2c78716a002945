"""What the drop-in endpoints (Cartesia's and ElevenLabs' APIs) share.

Both are other vendors' protocols over our own machinery: a socket is a ``ws.Connection``
(``DropinConnection``: no greeting, closed once its contexts end when the server drains) whose
contexts are ``WsUtterance``s (``BufferedContext``: text without a sentence end waits at most a
delay), an HTTP request is a ``SpeechRun`` streamed by an ``AudioPump`` (``stream_speech``).
Here too: the API key from a vendor's header, output rates (any from 8 to 48 kHz), G.711 and
float encodings, the speed and language options, and a refused WebSocket handshake.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, Response

from pipecat_veena.engine import check_speed
from pipecat_veena.remote.protocol import CLOSE_GOING_AWAY, ErrorCode, ProtocolError, Speak
from pipecat_veena.server.encode import FORMATS, StreamEncoder
from pipecat_veena.server.http_stream import (
    AudioPump,
    AudioStreamResponse,
    PumpStopped,
    StreamAborted,
)
from pipecat_veena.server.limits import authenticate, client_address, voice_owner
from pipecat_veena.server.openai_routes import _STATUS as HTTP_STATUS
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.speech import SpeechRun
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.ws import CLOSE_POLICY, CLOSE_TRY_LATER, Connection
from pipecat_veena.server.ws_utterance import WsUtterance

#: Output rates served: any whole number of Hz in this range (the resampler takes any pair).
MIN_RATE, MAX_RATE = 8000, 48000
#: Raw encodings served (mono): 16-bit and float PCM, G.711 μ-law and A-law.
ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
#: Longest context id taken (Pipecat sends UUIDs, LiveKit 12-character ids).
MAX_CONTEXT_ID = 256


def bad(message: str, ref: str | None = None) -> ProtocolError:
    """A ``bad_message`` error."""
    return ProtocolError(ErrorCode.BAD_MESSAGE, message, ref)


def http_status(code: str) -> int:
    """The HTTP status of an error code (400 unless the code says otherwise)."""
    return HTTP_STATUS.get(code, 400)


# -- requests -------------------------------------------------------------------------------
def check_output_rate(rate: Any, where: str, ref: str | None = None) -> int:
    """An output rate in Hz: a whole number from ``MIN_RATE`` to ``MAX_RATE``.

    Raises:
        ProtocolError: ``unsupported_sample_rate`` (``bad_message`` for a non-integer).
    """
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise bad(f"{where} must be an integer number of Hz", ref)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"{where} {rate} Hz is not served; use any rate from {MIN_RATE} to {MAX_RATE} Hz",
            ref,
        )
    return rate


def language_options(language: Any, where: str, ref: str | None = None) -> dict[str, str]:
    """The engine options a language code asks for: ``hi...`` reads numbers in Hindi.

    Anything else (``en``, None, ...) leaves each sentence to its script.

    Raises:
        ProtocolError: ``bad_message`` for a language that is not a string.
    """
    if language is not None and not isinstance(language, str):
        raise bad(f"{where} must be a language code such as 'hi' or 'en' (or null)", ref)
    return {"language": "hi"} if language and language.lower().startswith("hi") else {}


def speed_option(speed: Any, where: str, ref: str | None = None) -> dict[str, float]:
    """The engine option for a requested speed (0.5-2.0; 1.0 or None: nothing).

    Raises:
        ProtocolError: ``bad_options`` naming ``where``.
    """
    if speed is None:
        return {}
    try:
        speed = check_speed(speed)
    except ValueError as e:
        raise ProtocolError(ErrorCode.BAD_OPTIONS, f"{where}.{e}", ref) from None
    return {} if speed == 1 else {"speed": speed}


def header_key(
    settings: ServerSettings,
    connection: Request | WebSocket,
    header: str,
    query: tuple[str, ...] = (),
) -> str:
    """The caller's key name from a vendor's header or ``query`` parameters, else as ours take.

    Raises:
        ProtocolError: ``unauthorized``, naming ``header``.
    """
    value = connection.headers.get(header)
    for name in query:
        value = value or connection.query_params.get(name)
    authorization = f"Bearer {value}" if value else connection.headers.get("authorization")
    try:
        return authenticate(settings, authorization, connection.query_params.get("api_key"))
    except ProtocolError as e:
        if value:
            raise ProtocolError(e.code, f"the {header} key is not valid here") from None
        raise ProtocolError(
            e.code, f"this server needs an API key: send it in the {header} header"
        ) from None


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
    """A checked output format: ``container`` raw, wav or mp3; ``encoding`` one of ENCODINGS."""

    container: str
    encoding: str
    sample_rate: int


# -- the WebSocket --------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextSpeak(Speak):
    """A ``speak`` for a drop-in context: ``Speak`` plus how the context is sent."""

    encoding: str = "pcm_s16le"
    buffer_delay_ms: int = 0


class BufferedContext(WsUtterance):
    """A drop-in context: an utterance whose text waits for a sentence end, at most a delay.

    Text without a sentence end is spoken ``buffer_delay_ms`` after it came (0: each piece of
    text is spoken as it comes).
    """

    def __init__(self, conn: Connection, msg: ContextSpeak, voice: str) -> None:
        self.encoding = msg.encoding
        self.buffer_delay_ms = msg.buffer_delay_ms
        self._timer: asyncio.TimerHandle | None = None
        self._taken = 0  # text segments the task has taken (the last may still be speaking)
        self._spoken = 0  # of those, the ones whose audio is out
        self._marks: deque[tuple[int, str]] = deque()  # (segments spoken, message) to send
        super().__init__(conn, msg, voice)
        if not msg.final:
            self._buffered()

    def after_queued(self, message: str) -> None:
        """Send ``message`` once the text queued so far has been spoken (its audio is out)."""
        mark = self._taken + self.texts.qsize() - (1 if self.closed else 0)  # (less the end)
        if mark <= self._spoken:
            self.conn.outbox.push_control(message)
        else:
            self._marks.append((mark, message))

    async def _next_text(self) -> str | None:
        self._spoken = self._taken  # (asked for the next one: the one before is spoken)
        while self._marks and self._marks[0][0] <= self._spoken:
            await self.conn.outbox.put(self._marks.popleft()[1])
        text = await super()._next_text()
        if text is not None:
            self._taken += 1
        return text

    def _buffered(self) -> None:
        """Text without a sentence end waits at most ``buffer_delay_ms``."""
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

    def _close(self, outcome: str, final: Any) -> None:
        self._disarm()
        super()._close(outcome, final)


class DropinConnection(Connection):
    """A drop-in socket: ``ws.Connection`` without a greeting, whose utterances are contexts.

    Neither vendor has a drain message (either client would take one for an error): when the
    server drains, the socket closes once its contexts in flight end, and the clients reconnect.
    """

    #: How a client ends a context, for the cap's error message.
    end_hint = "end one"
    _closing: asyncio.Task[None] | None = None  # a close the socket asked for, or at a drain

    def _hello(self) -> str | None:
        return None  # nothing until the first request

    def go_away(self) -> None:
        """The server drains: close once the contexts in flight end."""
        if self.leaving:
            return
        self.leaving = True
        if not self.utterances:  # else the send loop closes after the last context's end
            self.close_soon(CLOSE_GOING_AWAY)

    def close_soon(self, code: int) -> None:
        """Close the socket with ``code`` from a task of its own (the receive loop goes on)."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close_with(None, code))

    def _check_open_cap(self) -> None:
        try:
            super()._check_open_cap()
        except ProtocolError as e:
            cap = self.settings.max_open_utterances
            raise ProtocolError(
                e.code,
                f"this socket already has {cap} contexts taking text, the server's cap "
                f"(max_open_utterances); {self.end_hint} first",
            ) from None

    def check_size(self, text: str, hint: str) -> None:
        """Refuse a message over ``max_message_bytes`` (``hint``: how to send less at once).

        Raises:
            ProtocolError: ``message_too_large``.
        """
        limit = self.settings.max_message_bytes
        if len(text) > limit or len(text.encode()) > limit:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a message may have at most {limit} bytes; {hint}",
            )


def check_context_id(context_id: Any, name: str) -> str:
    """A context id: a string of 1-``MAX_CONTEXT_ID`` characters.

    Raises:
        ProtocolError: ``bad_message`` naming the field.
    """
    if not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID:
        raise bad(f"{name!r} must be a string of 1-{MAX_CONTEXT_ID} characters")
    return context_id


async def refuse_handshake(websocket: WebSocket, problem: ProtocolError, body: Any) -> None:
    """Refuse a WebSocket handshake with the HTTP status of ``problem`` and ``body``.

    Each client then takes its own connection-error path (the status is what they report);
    a server without the denial extension closes with 1008 (a bad key) or 1013 instead.
    """
    server: SpeechServer = websocket.app.state.veena
    server.metrics.error("ws", problem.code)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        status = http_status(problem.code)
        await websocket.send_denial_response(JSONResponse(body, status_code=status))
    else:
        policy = problem.code == ErrorCode.UNAUTHORIZED
        await websocket.close(CLOSE_POLICY if policy else CLOSE_TRY_LATER)


# -- HTTP -----------------------------------------------------------------------------------
#: How a vendor's API words an error: the body for a ``ProtocolError``.
ErrorBody = Callable[[ProtocolError], Any]


@dataclass(frozen=True)
class HttpSpeech:
    """One checked HTTP speech request: what to say, in what voice, how."""

    text: str
    voice: str | None
    options: dict[str, Any]
    output: OutputFormat


def refused_response(error: ProtocolError, body_of: ErrorBody) -> JSONResponse:
    """The vendor's error body with the status of ``error`` (``Retry-After`` on 429 and 503)."""
    status = http_status(error.code)
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(body_of(error), status_code=status, headers=headers)


def http_refused(server: SpeechServer, error: ProtocolError, body_of: ErrorBody) -> JSONResponse:
    """A request refused before it started: counted (a bad key is not a request), answered."""
    if error.code != ErrorCode.UNAUTHORIZED:
        server.metrics.requests.labels("http", "rejected").inc()
    server.metrics.error("http", error.code)
    return refused_response(error, body_of)


async def stream_speech(
    request: Request, key: str, speech: HttpSpeech, body_of: ErrorBody
) -> Response:
    """Speak ``speech`` as a streamed body; its status waits for the first audio.

    An error before the first audio gets its status and ``body_of`` it; a stream that cannot
    finish after that is cut short (an incomplete transfer, never a clean end).
    """
    server: SpeechServer = request.app.state.veena
    settings = server.settings
    try:
        problem = server.availability()
        if problem is not None:
            raise problem
        server.check_text(speech.text)
        if not server.speakable(speech.text):
            raise bad("the text has nothing to say (no letters or digits outside markup)")
        voice = server.resolve_voice(speech.voice, voice_owner(settings, request))
        server.check_options(speech.options)
        run = SpeechRun(
            server, api="http", key=key, voice=voice, options=speech.options,
            out_rate=speech.output.sample_rate, cancel=lambda code: None,
            client=client_address(request),
        )  # fmt: skip
    except ProtocolError as e:
        return http_refused(server, e, body_of)
    pump = AudioPump(run, speech.text)
    try:
        first = await pump.next()
    except PumpStopped as e:
        await pump.close("cancelled")
        server.metrics.error("http", e.code)
        stopped = ProtocolError(e.code, "the server stopped this request; retry it")
        return refused_response(stopped, body_of)
    except Exception as e:
        await pump.close("failed")
        return refused_response(run.failure(e), body_of)
    except BaseException:
        await pump.close("disconnected")
        raise
    outcome = ["disconnected"]
    output = speech.output
    media = {"wav": "audio/wav", "mp3": "audio/mpeg"}.get(output.container, "audio/pcm")
    return AudioStreamResponse(
        _body(pump, first, output, outcome),
        pump=pump,
        slow_client_timeout_s=settings.slow_client_timeout_s,
        outcome=outcome,
        media_type=media,
        headers={"x-request-id": run.request_id, "x-sample-rate": str(output.sample_rate)},
    )


async def _body(
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
