"""One utterance of a WebSocket connection: its text (whole or incremental) and its task."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from loguru import logger

from pipecat_veena.remote.protocol import (
    Done,
    Error,
    ErrorCode,
    ProtocolError,
    Speak,
    Words,
    encode_audio_frame,
    to_json,
)
from pipecat_veena.server.outbox import Outbox
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.speech import SpeechRun
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.text import add_sentences


class Connection(Protocol):
    """What an utterance needs of its connection (``ws.Connection``)."""

    server: SpeechServer
    settings: ServerSettings
    key: str
    client: str | None
    outbox: Outbox
    utterances: dict[str, WsUtterance]
    last_activity: float


class WsUtterance:
    """An utterance in flight on one connection; its task speaks queued text segments in order.

    With ``final`` the whole text is one segment (the engine splits it and keeps one voice).
    Otherwise appended text is cut where the engine's sentence splitter cuts it (not after
    "Rs. ", "Dr. ", "a.m. ") and each complete sentence is spoken as soon as it arrives;
    ``flush`` speaks the rest now, ``end`` closes the text.

    Args:
        conn: the connection.
        msg: the ``speak`` message.
        voice: the resolved engine voice.

    Raises:
        ProtocolError: ``too_many_streams`` (no slot).
    """

    def __init__(self, conn: Connection, msg: Speak, voice: str) -> None:
        server = conn.server
        self.conn = conn
        self.id = msg.id
        self.run = SpeechRun(
            server,
            api="ws",
            key=conn.key,
            client=conn.client,
            voice=voice,
            options=msg.options,
            out_rate=msg.sample_rate or server.engine.sample_rate,
            cancel=self._on_drain,
            whole_text=msg.final,
            client_id=msg.id,
            traceparent=msg.traceparent,
            words=bool(msg.words),
        )
        self.texts: asyncio.Queue[str | None] = asyncio.Queue()
        self.pending = ""
        self.chars = len(msg.text)
        self.closed = msg.final
        self.text_at = time.monotonic()  # the last text (or the end of the last speaking)
        self.stop_reason: str | ProtocolError | None = None
        if msg.final:
            self.texts.put_nowait(msg.text)
            self.texts.put_nowait(None)
        else:
            self._add(msg.text)
        self._ran = False
        self.task = asyncio.get_running_loop().create_task(self._main())
        self.task.add_done_callback(self._finished)

    # -- text ------------------------------------------------------------------------------
    def append(self, text: str) -> None:
        """Add text; complete sentences start speaking now.

        Text over the cap ends the utterance with ``text_too_long`` (reported by its task).

        Raises:
            ProtocolError: the utterance takes no more text (``final`` or ended).
        """
        self._check_open("append")
        self.text_at = time.monotonic()
        self.chars += len(text)
        limit = self.conn.server.settings.max_text_chars
        if self.chars > limit:
            self.closed = True
            self.stop(
                ProtocolError(
                    ErrorCode.TEXT_TOO_LONG,
                    f"utterance {self.id!r} has {self.chars} characters, over this server's cap "
                    f"of {limit}; end it and continue in a new one",
                    self.id,
                )
            )
            return
        self._add(text)

    def _add(self, text: str) -> None:
        complete, self.pending = add_sentences(self.pending, text)  # re-split when needed
        if complete.strip():
            self.texts.put_nowait(complete)
        else:  # white space alone stays: later words' offsets count it
            self.pending = complete + self.pending

    def flush(self) -> None:
        """Speak the buffered text now, even without a sentence end."""
        self._check_open("flush")
        self.text_at = time.monotonic()
        if self.pending.strip():  # (white space alone stays, as in _add)
            self.texts.put_nowait(self.pending)
            self.pending = ""

    def end(self) -> None:
        """No more text: speak the rest, then ``done``.

        Raises:
            ProtocolError: the utterance was already closed.
        """
        self.flush()
        self.closed = True
        self.texts.put_nowait(None)

    async def _next_text(self) -> str | None:
        """The next segment to speak; None: the text is over.

        While the utterance takes text, waiting longer than ``open_utterance_timeout_s`` since
        the last text (or since it last had something to speak) ends it with ``text_timeout``.
        """
        if self.texts.qsize() or self.closed:
            return await self.texts.get()
        limit = self.conn.settings.open_utterance_timeout_s
        self.text_at = max(self.text_at, time.monotonic())
        while (left := self.text_at + limit - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(left):
                    return await self.texts.get()
            except TimeoutError:
                continue  # text came meanwhile without a segment to speak: wait on
        raise ProtocolError(
            ErrorCode.TEXT_TIMEOUT,
            f"utterance {self.id!r} was sent with final false and got no text for {limit:g} s "
            "(open_utterance_timeout_s); send 'end' when the text is over",
            self.id,
        )

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"{what}: utterance {self.id!r} takes no more text (it was sent with final true "
                "or ended)",
                self.id,
            )

    # -- ending ----------------------------------------------------------------------------
    def stop(self, reason: str | ProtocolError) -> None:
        """End the utterance now: "cancel" (client), "drain", "gone" or an error to report."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.task.cancel()

    def _on_drain(self, code: str) -> None:
        self.stop("drain")

    def _done(self, reason: str) -> Done:
        run = self.run
        return Done(
            id=self.id,
            reason=reason,
            tokens=run.tokens,
            audio_seconds=round(run.audio_seconds, 4),
            ttfa_ms=None if run.ttfa_ms is None else round(run.ttfa_ms, 2),
            elapsed_ms=round(run.elapsed_ms, 2),
            sample_rate=run.out_rate,
            request_id=run.request_id,
            warning=run.warning if reason == "completed" else None,
        )

    def _stopped(self) -> tuple[str, Done | Error | None]:
        """Outcome and last message of an utterance whose task was cancelled."""
        reason = self.stop_reason
        cancels = self.conn.server.metrics.cancels
        if reason == "cancel":
            cancels.labels("ws", "client").inc()
            return "cancelled", self._done("cancelled")
        if reason == "drain":
            cancels.labels("ws", "drain").inc()
            message = (
                "the server is shutting down and cancelled this utterance; retry it on another "
                "server"
            )
            return "cancelled", Error(ErrorCode.SERVER_DRAINING, message, self.id, True)
        if isinstance(reason, ProtocolError):
            return "failed", Error(reason.code, reason.message, self.id, True)
        return "disconnected", None  # the connection is gone

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not self._ran:  # cancelled before its first step: _main never ran its finally
            self._close(*self._stopped())

    def _close(self, outcome: str, final: Done | Error | None) -> None:
        conn = self.conn
        conn.utterances.pop(self.id, None)
        conn.last_activity = time.monotonic()
        self.run.close(outcome)
        if isinstance(final, Error):
            conn.server.metrics.error("ws", final.code)
        if final is not None:
            conn.outbox.push_control(self._final_message(final))

    def _final_message(self, final: Done | Error) -> str:
        """The utterance's last message as its client reads it (a subclass's wire shape)."""
        return to_json(final)

    async def _send_audio(self, pcm: bytes) -> None:
        """One piece of audio for the client, then the words it completes."""
        await self.conn.outbox.put(encode_audio_frame(self.id, self.run.tokens, pcm))
        await self._send_words(self.run.audio_seconds)

    async def _send_words(self, played_s: float | None) -> None:
        """A ``words`` message for the words whose audio was sent (None: all that are left)."""
        if self.run.words:
            words = self.run.take_words(played_s)
            if words:
                await self.conn.outbox.put(to_json(Words.of(self.id, words)))

    async def _main(self) -> None:
        self._ran = True
        with logger.contextualize(**self.run.log_context):  # the engine's lines too
            await self._speak()

    async def _speak(self) -> None:
        run = self.run
        outcome: str = "failed"
        final: Done | Error | None = None
        try:
            while (text := await self._next_text()) is not None:
                async for pcm in run.segment(text):
                    await self._send_audio(pcm)
            tail = run.finish()
            if tail:
                await self._send_audio(tail)
            await self._send_words(None)
            outcome, final = "completed", self._done("completed")
        except asyncio.CancelledError:
            outcome, final = self._stopped()
        except ProtocolError as e:  # a limit of this utterance (text_timeout)
            self.closed = True
            final = Error(e.code, e.message, self.id, True)
        except Exception as e:
            failure = run.failure(e)
            final = Error(failure.code, failure.message, self.id, True)
        finally:
            self._close(outcome, final)
