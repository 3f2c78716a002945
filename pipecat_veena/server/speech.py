"""One utterance on the shared engine as both APIs run it: slot, request id, resampling, figures."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_veena import tracing
from pipecat_veena.audio import BYTES_PER_SAMPLE
from pipecat_veena.interface import WordTiming
from pipecat_veena.logs import log_failure
from pipecat_veena.remote.protocol import ErrorCode, ProtocolError, code_for
from pipecat_veena.remote.protocol.codes import client_message
from pipecat_veena.resample import StreamResampler
from pipecat_veena.text import utf16_length

if TYPE_CHECKING:
    from pipecat_veena.server.state import SpeechServer


class SpeechRun:
    """An accepted utterance: holds its stream slot from creation until ``close()``.

    Text is spoken in one or more segments (incremental text), in one voice, through one
    resampler, so there is no seam between segments. Creating it takes a slot (or raises).

    Args:
        server: the server's shared state.
        api: "ws" or "http" (metrics label and request id prefix).
        key: the API key name (per-key stream cap).
        client: the client's address (the per-client cap of a server without keys).
        voice: the resolved engine voice.
        options: sampling options, already checked.
        out_rate: the rate the client gets.
        cancel: called with an error code when the server must stop this utterance (drain).
        whole_text: True when all the text was known at the start (its real-time factor is
            then a property of the engine, not of the client's typing speed).
        client_id: the client's id of the utterance (a WebSocket ``speak`` id), if it gave one.
        traceparent: the caller's W3C trace context (``speak.traceparent``, the HTTP header):
            the utterance's ``veena.speech`` span continues that trace (with OpenTelemetry).
        words: keep the engine's word timings for ``take_words`` (the client asked for them).

    Raises:
        ProtocolError: ``too_many_streams``.
    """

    def __init__(
        self,
        server: SpeechServer,
        *,
        api: str,
        key: str,
        voice: str,
        options: dict[str, Any],
        out_rate: int,
        cancel: Callable[[str], None],
        whole_text: bool = True,
        client: str | None = None,
        client_id: str | None = None,
        traceparent: str | None = None,
        words: bool = False,
    ) -> None:
        # the resampler first: a slot is taken only once nothing else here can fail
        self.resampler = StreamResampler(server.engine.sample_rate, out_rate)
        server.slots.acquire(key, client)
        self.server = server
        self.api = api
        self.key = key
        self.client = client
        self.voice = voice
        self.options = options
        self.out_rate = out_rate
        self.cancel = cancel
        self.whole_text = whole_text
        self.request_id = server.new_request_id(api)
        #: What every log line about this utterance carries (``logger.contextualize``):
        #: ``request_id``, the client's id where it gave one (a RemoteVeenaEngine logs the same
        #: id), else the server's; ``server_request_id``, the server's (engine requests start
        #: with it).
        self.log_context = {
            "request_id": client_id or self.request_id,
            "server_request_id": self.request_id,
        }
        self.tokens = 0
        self.samples = 0
        self.engine_samples = 0  # at the engine's rate: where each segment's words start
        self.text_chars = 0  # of the segments spoken so far: where each one's words start
        self.text_utf16 = 0  # the same in UTF-16 code units (WordTiming.offset_utf16)
        #: Word timings in the utterance's time and text, not yet taken (None: not asked for).
        self.words: deque[WordTiming] | None = deque() if words else None
        self.speakable = False  # some segment had something to say
        self.cut: str | None = None  # why the engine cut it short (AudioChunk.cut), if it did
        self.started = time.monotonic()
        self.first_audio_at: float | None = None
        self.queue_s: float | None = None  # the engine's wait for its first token (AudioChunk)
        self.last_audio_at: float | None = None
        self.closed = False
        server.metrics.active_streams.labels(api).inc()
        server.register(self)
        self.span = tracing.server_span(
            traceparent,
            {"veena.api": api, "veena.voice": voice, **self.log_context},
        )

    async def segment(self, text: str) -> AsyncIterator[bytes]:
        """Speak one piece of text; yields PCM at ``out_rate`` as the engine decodes it.

        Closing the iterator (or cancelling its consumer) aborts the engine request at once.
        """
        base = self.tokens
        at_s = self.engine_samples / self.server.engine.sample_rate
        at_char, at_utf16 = self.text_chars, self.text_utf16
        self.text_chars += len(text)
        self.text_utf16 += utf16_length(text)
        wide = self.text_utf16 - at_utf16 != len(text)  # (characters outside the BMP)
        self.speakable = self.speakable or self.server.speakable(text)
        stream = tracing.traced(
            self.span,
            self.server.engine.stream(text, self.voice, request_id=self.request_id, **self.options),
        )
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                if self.queue_s is None and chunk.queue_s is not None:
                    self.queue_s = chunk.queue_s
                    self.server.metrics.queue_wait.labels(self.api).observe(chunk.queue_s)
                self.tokens = base + chunk.tokens
                self.cut = self.cut or chunk.cut
                self.engine_samples += chunk.num_samples
                if self.words is not None:
                    self.words.extend(
                        WordTiming(
                            w.word, at_s + w.start, at_s + w.end, at_char + w.offset,
                            at_utf16 + (utf16_length(text[: w.offset]) if wide else w.offset),
                        )
                        for w in chunk.words
                    )  # fmt: skip
                pcm = self.resampler.resample(chunk.pcm)
                if pcm:
                    self._count(pcm)
                    yield pcm

    def take_words(self, played_s: float | None = None) -> list[WordTiming]:
        """The kept words whose end lies within ``played_s`` seconds of audio (None: all).

        Words come in order of their audio, so a word is handed out only once the audio that
        covers its end was handed out: a client never gets a word ahead of its sound.
        """
        taken: list[WordTiming] = []
        while self.words and (played_s is None or self.words[0].end <= played_s):
            taken.append(self.words.popleft())
        return taken

    def finish(self) -> bytes:
        """The resampler's tail (call once after the last segment)."""
        tail = self.resampler.flush()
        if tail:
            self._count(tail)
        return tail

    def failure(self, error: Exception, *, what: str = "failed") -> ProtocolError:
        """Log why the engine failed this utterance and return what its client is told.

        The log gets the detail (a traceback without variables for an unexpected error); the
        client gets the stable code and, unless the error is about its request, a fixed line
        with the request id (``client_message``).
        """
        code = code_for(error)
        where = f"speech server: utterance {self.request_id} {what}"
        with logger.contextualize(**self.log_context):
            if code == ErrorCode.INTERNAL:
                log_failure(where, error)
            else:
                logger.warning(f"{where}: {code}: {error}")
        return ProtocolError(code, client_message(code, error, self.request_id))

    def _count(self, pcm: bytes) -> None:
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
        self.last_audio_at = now
        self.samples += len(pcm) // BYTES_PER_SAMPLE
        if self.whole_text:  # (with text still arriving, gaps are the client's typing)
            margin = self.audio_seconds - (now - self.first_audio_at)
            self.server.metrics.real_time_margin.labels(self.api).observe(margin)

    @property
    def warning(self) -> str | None:
        """Why a completed utterance said less than asked (``done.warning``), or None.

        "nothing_to_speak" (its text had no letters or digits outside markup), "loop_guard"
        or "token_cap" (``AudioChunk.cut``).
        """
        if self.cut is not None:
            return self.cut
        return "nothing_to_speak" if not self.speakable and self.samples == 0 else None

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio produced so far."""
        return self.samples / self.out_rate

    @property
    def ttfa_ms(self) -> float | None:
        """Milliseconds from acceptance to the first audio (None: no audio yet)."""
        if self.first_audio_at is None:
            return None
        return (self.first_audio_at - self.started) * 1000

    @property
    def elapsed_ms(self) -> float:
        """Milliseconds since acceptance."""
        return (time.monotonic() - self.started) * 1000

    def close(self, outcome: str) -> None:
        """Release the slot and record the outcome (idempotent; the first outcome counts)."""
        if self.closed:
            return
        self.closed = True
        metrics = self.server.metrics
        self.server.slots.release(self.key, self.client)
        self.server.unregister(self)
        metrics.active_streams.labels(self.api).dec()
        metrics.requests.labels(self.api, outcome).inc()
        if self.first_audio_at is not None:
            metrics.time_to_first_audio.labels(self.api).observe(self.ttfa_ms / 1000)
        metrics.tokens.labels(self.api).inc(self.tokens)
        tracing.end_span(
            self.span,
            {
                "veena.outcome": outcome,
                "veena.tokens": self.tokens,
                "veena.audio_seconds": self.audio_seconds,
                "veena.ttfa_seconds": None if self.ttfa_ms is None else self.ttfa_ms / 1000,
                "veena.queue_seconds": self.queue_s,
                "veena.cut": self.cut,
            },
        )
        logger.bind(**self.log_context).debug(
            f"speech server: {self.request_id} {outcome}: {self.audio_seconds:.2f} s audio, "
            f"{self.tokens} tokens, first audio after "
            f"{'-' if self.ttfa_ms is None else f'{self.ttfa_ms:.0f} ms'}"
        )
        if outcome == "completed" and self.whole_text and self.samples and self.last_audio_at:
            rtf = (self.last_audio_at - self.started) / self.audio_seconds
            metrics.real_time_factor.labels(self.api).observe(rtf)
            generating_s = self.last_audio_at - self.started - (self.queue_s or 0.0)
            if self.tokens and generating_s > 0:
                metrics.tokens_per_second.labels(self.api).observe(self.tokens / generating_s)
