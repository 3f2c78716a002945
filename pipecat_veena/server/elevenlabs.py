"""ElevenLabs' multi-context TTS WebSocket on the speech server.

``/v1/text-to-speech/{voice_id}/multi-stream-input``: a bot built on Pipecat's
``ElevenLabsTTSService(url=...)`` or LiveKit's ``elevenlabs.TTS(base_url=...)`` speaks through
this server by changing its URL (and key). The socket is a drop-in socket (``server.dropin``:
our WebSocket's send loop, caps, slots, drain and metrics, counted as ``api="ws"``) whose
contexts are ElevenLabs contexts. The voice, ``output_format`` (``pcm_<rate>`` for any rate
from 8 to 48 kHz, ``ulaw_8000``, ``alaw_8000``, ``mp3_<rate>_<kbps>``) and ``language_code``
are the socket's, from its URL; a bad key, voice or format is refused in the handshake.

A context's texts are concatenated verbatim and spoken from sentence ends, on ``flush``, or
(``auto_mode=true``) each as it comes. ``close_context`` right after a flush with no text ends
the context's input (what is queued is still spoken, then ``isFinal``); any other
``close_context`` (text not flushed, or the context already ended) is a barge-in and aborts the
context's generation at once: both clients close a context that way at a normal end and on an
interruption. ``close_socket`` and closing the socket abort every context on it.

Audio messages carry ``alignment`` and ``normalizedAlignment`` (the caller's words as written,
a character at a time) in milliseconds from the context's first audio. Each message's
characters end with a space timed 0 + 0 ms: Pipecat, which adds each message's last start and
duration to a running clock, keeps its clock at 0 and so reads the same absolute times LiveKit
reads (docs/protocol.md gives the residual error).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, WebSocket

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
    BufferedContext,
    ContextSpeak,
    DropinConnection,
    OutputFormat,
    bad,
    check_context_id,
    check_output_rate,
    encode_pcm,
    header_key,
    http_status,
    language_options,
    refuse_handshake,
    speed_option,
)
from pipecat_veena.server.encode import FORMATS, StreamEncoder
from pipecat_veena.server.limits import voice_owner
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.ws import CLOSE_NORMAL

#: ElevenLabs' path (Pipecat appends it to its ``url``, LiveKit from ``/text-to-speech`` on to
#: its ``base_url``, so LiveKit's base URL ends in ``/v1``).
WS_PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"
#: ElevenLabs' key header, and the query parameters a key may come in.
KEY_HEADER = "xi-api-key"
KEY_QUERY = ("xi-api-key", "xi_api_key")
#: ``output_format`` when the URL leaves it out (ElevenLabs' default).
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
#: How long text without a sentence end waits for more without ``auto_mode`` (ms).
BUFFER_DELAY_MS = 3000

_PCM = re.compile(r"pcm_(\d+)")
_MP3 = re.compile(r"mp3_(\d+)_(\d+)")
_G711 = {"ulaw_8000": "pcm_mulaw", "alaw_8000": "pcm_alaw"}

router = APIRouter()


# -- messages -------------------------------------------------------------------------------
def _json(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def alignment(words: list[WordTiming], closing_ms: int | None = None) -> dict[str, list]:
    """ElevenLabs' character alignment of ``words`` (times in ms from the context's audio start).

    Each word's characters share its time evenly and a space follows each word; the message's
    last space is timed 0 + 0 ms, so a client adding each message's last start and duration to
    a clock (Pipecat) keeps it at 0. ``closing_ms``: one more space at that time, the end of the
    context's last word (its end, for a client that takes a word's end from what follows it).
    """
    chars: list[str] = []
    starts: list[int] = []
    durations: list[int] = []
    for w in words:
        n = len(w.word)
        step = (w.end - w.start) * 1000 / n
        for i, char in enumerate(w.word):
            chars.append(char)
            starts.append(round(w.start * 1000 + i * step))
            durations.append(round(step))
        chars.append(" ")
        starts.append(0)
        durations.append(0)
    if closing_ms is not None:
        chars.append(" ")
        starts.append(closing_ms)
        durations.append(0)
    return {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}


def audio_message(context_id: str, audio: bytes, aligned: dict[str, list] | None) -> str:
    """An audio message: base64 audio (may be empty) and the alignment of the words timed so far."""
    message: dict[str, Any] = {"audio": base64.b64encode(audio).decode(), "isFinal": False}
    if aligned is not None:
        message["alignment"] = message["normalizedAlignment"] = aligned
    message["contextId"] = context_id
    return _json(message)


def final_message(context_id: str) -> str:
    """``isFinal``: the context is over (its last audio was sent before it)."""
    return _json({"isFinal": True, "contextId": context_id})


def error_message(code: str, message: str, context_id: str | None, *, ended: bool) -> str:
    """An error: ``error`` is our stable code (docs/protocol.md), ``code`` its HTTP status.

    LiveKit raises ``APIError`` on ``error``; Pipecat reads no error field, so an error that ends
    a context also carries ``isFinal``, which ends the context there.
    """
    body: dict[str, Any] = {"error": code, "message": message, "code": http_status(code)}
    if ended and context_id is not None:
        body["isFinal"] = True
    body["contextId"] = context_id
    return _json(body)


def http_error_body(error: ProtocolError) -> dict[str, Any]:
    """ElevenLabs' HTTP error body: ``{"detail": {"status", "message"}}``."""
    return {"detail": {"status": error.code, "message": error.message}}


# -- the socket's settings ------------------------------------------------------------------
def parse_output_format(name: str) -> OutputFormat:
    """``output_format``: ``pcm_<rate>``, ``ulaw_8000``, ``alaw_8000`` or ``mp3_<rate>_<kbps>``.

    Raises:
        ProtocolError: ``unsupported_sample_rate`` or ``bad_message``, naming what works.
    """
    if name in _G711:
        return OutputFormat("raw", _G711[name], 8000)
    if match := _PCM.fullmatch(name):
        return OutputFormat("raw", "pcm_s16le", check_output_rate(int(match[1]), name))
    mp3 = FORMATS["mp3"]
    if (match := _MP3.fullmatch(name)) and int(match[1]) in (mp3.rates or ()):
        return OutputFormat(f"mp3_{int(match[2])}", "pcm_s16le", int(match[1]))
    raise bad(
        f"output_format {name!r} is not served; use pcm_<rate> (any rate from 8000 to 48000), "
        f"ulaw_8000, alaw_8000 or mp3_<rate>_<kbps> with a rate of {mp3.rates}"
    )


@dataclass(frozen=True)
class SocketSettings:
    """What a socket's URL asks: the voice, the output format, options, buffering."""

    voice: str
    output: OutputFormat
    options: dict[str, Any]
    buffer_delay_ms: int


def parse_query(voice: str, query: Any) -> SocketSettings:
    """Check the socket's query parameters; those not named here are accepted and ignored.

    Raises:
        ProtocolError: the first problem, naming the parameter.
    """
    check_unicode(voice, "the voice_id", None)
    output = parse_output_format(query.get("output_format", DEFAULT_OUTPUT_FORMAT))
    options = language_options(query.get("language_code"), "language_code")
    if query.get("enable_ssml_parsing", "false").lower() == "true":
        raise bad(
            "enable_ssml_parsing=true is not served on this socket: SSML needs a whole document "
            "at once here (POST /v1/audio/speech); leave it false"
        )
    auto_mode = query.get("auto_mode", "false").lower() == "true"
    return SocketSettings(voice, output, options, 0 if auto_mode else BUFFER_DELAY_MS)


def context_options(data: dict[str, Any], ref: str) -> dict[str, Any]:
    """Engine options of a context's first message: ``voice_settings.speed`` (others ignored).

    Raises:
        ProtocolError: a speed out of range, or pronunciation dictionaries (not served).
    """
    settings = data.get("voice_settings") or {}
    if not isinstance(settings, dict):
        raise bad("'voice_settings' must be an object", ref)
    if data.get("pronunciation_dictionary_locators"):
        raise bad(
            "pronunciation_dictionary_locators are not served: this server has no pronunciation "
            "dictionaries; leave them out",
            ref,
        )
    return speed_option(settings.get("speed"), "voice_settings", ref)


# -- the WebSocket --------------------------------------------------------------------------
class ElevenLabsContext(BufferedContext):
    """One ElevenLabs context: a buffered drop-in context whose messages are ElevenLabs'.

    Each audio message carries the alignment of every word the engine has timed so far (Pipecat
    queues them with the context's audio, LiveKit accumulates them).
    """

    def __init__(self, conn: ElevenLabsConnection, msg: ContextSpeak, voice: str) -> None:
        output = conn.socket.output
        self.encoder: StreamEncoder | None = None
        if output.container.startswith("mp3_"):
            kbps = int(output.container.removeprefix("mp3_"))
            mp3 = replace(FORMATS["mp3"], bit_rate=kbps * 1000)
            self.encoder = StreamEncoder(mp3, output.sample_rate)
        self.input_flushed = False  # a flush with no text came, and no text since
        self.settings: Any = None  # the voice_settings of its first message
        super().__init__(conn, msg, voice)

    def take(self, text: str | None, flush: bool) -> None:
        """A later message of this context: more text, a flush, or a keep-alive (no text).

        Raises:
            ProtocolError: text for a context that was closed and is still speaking.
        """
        if self.closed:
            if text and text.strip():
                raise ProtocolError(
                    ErrorCode.DUPLICATE_ID,
                    f"context {self.id!r} was closed (close_context) and is still speaking; it "
                    "takes no more text: use a new context_id",
                    self.id,
                )
            return  # a flush or keep-alive for an ended context: nothing to do
        self.append(text or "")  # ("": a keep-alive, which restarts the open-context timer)
        if self.closed:
            return  # over max_text_chars: the context ends with an error
        if text and text.strip():
            self.input_flushed = False
        if flush:
            self.flush()
            self.input_flushed = self.input_flushed or not (text and text.strip())
        else:
            self._buffered()

    def close_context(self) -> None:
        """``close_context``: the end of the input right after a flush, else a barge-in."""
        if self.input_flushed and not self.closed:
            self._disarm()
            self.end()
        else:
            self.stop("cancel")

    # -- what the client gets ---------------------------------------------------------------
    def _encode(self, pcm: bytes) -> bytes:
        if self.encoder is not None:
            return self.encoder.encode(pcm)
        return encode_pcm(pcm, self.encoding)

    async def _send_audio(self, pcm: bytes) -> None:
        audio = self._encode(pcm)
        words = self.run.take_words(None) if self.run.words else []
        if audio or words:
            aligned = alignment(words) if words else None
            await self.conn.outbox.put(audio_message(self.id, audio, aligned))

    async def _send_words(self, played_s: float | None) -> None:
        # (called once, after the context's last audio: the encoder's tail, the last words)
        tail = self.encoder.finish() if self.encoder is not None else b""
        words = self.run.take_words(None) if self.run.words else []
        end_ms = round(self.run.engine_samples * 1000 / self.conn.server.engine.sample_rate)
        aligned = alignment(words, closing_ms=end_ms)
        await self.conn.outbox.put(audio_message(self.id, tail, aligned))

    def _final_message(self, final: Done | Error) -> str:
        if isinstance(final, Done):
            return final_message(self.id)
        message = final.message
        if final.code == ErrorCode.TEXT_TIMEOUT:
            message = (
                f"context {self.id!r} got no text for "
                f"{self.conn.settings.open_utterance_timeout_s:g} s while open "
                "(open_utterance_timeout_s); send flush and close_context when its text is over"
            )
        return error_message(final.code, message, self.id, ended=True)

    def _close(self, outcome: str, final: Done | Error | None) -> None:
        if self.encoder is not None:
            self.encoder.close()
        super()._close(outcome, final)


class ElevenLabsConnection(DropinConnection):
    """A ``multi-stream-input`` socket: a drop-in socket with ElevenLabs' messages and contexts.

    Args:
        websocket: the accepted WebSocket.
        server: the app's shared state.
        key: the caller's API key name.
        socket: what the socket's URL asks.
    """

    utterance_type = ElevenLabsContext
    utterances: dict[str, ElevenLabsContext]  # type: ignore[assignment]
    end_hint = "close one (close_context)"

    def __init__(
        self, websocket: WebSocket, server: SpeechServer, key: str, socket: SocketSettings
    ) -> None:
        super().__init__(websocket, server, key)
        self.socket = socket

    def _error_text(self, error: Error) -> str:
        return error_message(error.code, error.message, error.id, ended=error.ended)

    def _handle(self, text: str) -> str | None:
        self.check_size(text, "send long text in several messages of one context")
        data = load_json(text, "the message")
        if not isinstance(data, dict):
            raise bad("a message must be a JSON object with a 'context_id'")
        if data.get("close_socket") is True:
            for context in list(self.utterances.values()):
                context.stop("gone")
            self.close_soon(CLOSE_NORMAL)
            return None
        said = data.get("text")
        if said is not None:
            if not isinstance(said, str):
                raise bad("'text' must be a string", data.get("context_id"))
            check_unicode(said, "'text'", data.get("context_id"))
        flush = data.get("flush", False)
        if not isinstance(flush, bool):
            raise bad("'flush' must be true or false", data.get("context_id"))
        if data.get("context_id") is None and not said and not flush:
            return None  # a keep-alive for the socket
        context_id = check_context_id(data.get("context_id"), "context_id")
        context = self.utterances.get(context_id)
        if data.get("close_context") is True:
            if context is not None:
                context.close_context()
            return None  # (an ended context: closing is idempotent)
        if context is not None:
            if data.get("voice_settings") and context.settings != data["voice_settings"]:
                raise bad(
                    f"context {context_id!r} is open: voice_settings go in its first message; "
                    "use a new context_id for other settings",
                    context_id,
                )
            context.take(said, flush)
        elif said:  # (a flush or keep-alive for a context that ended: nothing to do)
            socket = self.socket
            try:
                options = {**socket.options, **context_options(data, context_id)}
            except ProtocolError as e:
                e.ended = True  # (the context never opened: isFinal ends it for the client)
                raise
            speak = ContextSpeak(
                id=context_id, text=said, voice=socket.voice, options=options,
                sample_rate=socket.output.sample_rate, final=False, words=True,
                encoding=socket.output.encoding, buffer_delay_ms=socket.buffer_delay_ms,
            )  # fmt: skip
            self._speak(speak)
            context = self.utterances[context_id]
            context.settings = data.get("voice_settings")
            if flush:
                context.take(None, True)
        return None


async def elevenlabs_websocket(websocket: WebSocket, voice_id: str) -> None:
    """``multi-stream-input``: check the key, voice and format, then serve contexts.

    A bad key, an unknown voice, a format not served (or a server that cannot take streams) is
    refused in the handshake with its HTTP status and ElevenLabs' error body, so each client
    takes its own connection-error path.
    """
    server: SpeechServer = websocket.app.state.veena
    settings = server.settings
    key = ""
    try:
        key = header_key(settings, websocket, KEY_HEADER, KEY_QUERY)
        problem = server.availability()
        socket = parse_query(voice_id, websocket.query_params)
        server.resolve_voice(voice_id, voice_owner(settings, websocket))
    except ProtocolError as e:
        problem = e
    if problem is not None:
        await refuse_handshake(websocket, problem, http_error_body(problem))
        return
    await websocket.accept()
    await ElevenLabsConnection(websocket, server, key, socket).run()


router.add_api_websocket_route(WS_PATH, elevenlabs_websocket)
