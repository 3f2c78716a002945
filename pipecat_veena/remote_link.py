"""One WebSocket from a RemoteVeenaEngine to one speech server, carrying many utterances.

A reader task routes audio frames and ``done`` / ``error`` messages to the utterance they name;
a writer task sends queued messages in order (so closing a stream can queue its ``cancel``
without waiting). When the connection drops, every open utterance fails at once and, unless the
server closed it normally (idle), a background task redials with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from loguru import logger
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from pipecat_veena.errors import RemoteError, ServerUnavailableError
from pipecat_veena.protocol import (
    PROTOCOL_VERSION,
    AudioFrame,
    Cancel,
    Done,
    Error,
    ErrorCode,
    ProtocolError,
    Ready,
    Speak,
    decode_audio_frame,
    error_for,
    parse_server_message,
    to_json,
)
from pipecat_veena.tasks import cancel_and_wait

#: Redial delays after a dropped connection: doubling from the first to the last.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.1, 5.0
#: Largest message accepted from the server (audio frames are far smaller).
MAX_MESSAGE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class End:
    """The last item of an utterance: ``error`` None when it ended normally or was aborted."""

    error: Exception | None = None


class Pending:
    """An utterance in flight on a link: its audio frames and its end, in arrival order."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.finished = False
        self.queue: asyncio.Queue[AudioFrame | End] = asyncio.Queue()

    def put(self, frame: AudioFrame) -> None:
        """Queue an audio frame (ignored after the end)."""
        if not self.finished:
            self.queue.put_nowait(frame)

    def finish(self, error: Exception | None = None) -> None:
        """Queue the end (once)."""
        if not self.finished:
            self.finished = True
            self.queue.put_nowait(End(error))


class Link:
    """One WebSocket to one server; connects on demand, redials after a drop.

    Args:
        url: the server's WebSocket URL (``ws://host:port/v1/audio/stream``).
        headers: handshake headers (the bearer key).
        open_timeout_s: the most one connection attempt may take.
    """

    def __init__(self, url: str, headers: dict[str, str], open_timeout_s: float) -> None:
        self.url = url
        self.headers = headers
        self.open_timeout_s = open_timeout_s
        self.ready: Ready | None = None
        self.pending: dict[str, Pending] = {}
        self.fatal: RemoteError | None = None
        self.closed = False
        self.connects = 0
        self._ws: ClientConnection | None = None
        self._outbox: asyncio.Queue[str] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        """True while the WebSocket is open and the server said ``ready``."""
        return self._ws is not None

    async def ensure(self) -> None:
        """Connect unless connected (one attempt).

        Raises:
            RemoteError: refused for good (bad key, protocol version).
            ServerUnavailableError: unreachable, starting or draining: try later or elsewhere.
        """
        if self.fatal is not None:
            raise self.fatal
        async with self._lock:
            if self._ws is None and not self.closed:
                await self._connect_once()

    async def _connect_once(self) -> None:
        try:
            ws = await connect(
                self.url,
                additional_headers=self.headers,
                compression=None,  # PCM does not compress; deflate only adds latency
                max_size=MAX_MESSAGE_BYTES,
                open_timeout=self.open_timeout_s,
                close_timeout=2,
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as e:
            raise ServerUnavailableError(f"cannot connect to {self.url}: {e}") from e
        try:
            first = await asyncio.wait_for(ws.recv(), self.open_timeout_s)
            message = parse_server_message(first) if isinstance(first, str) else None
        except (ConnectionClosed, TimeoutError, ProtocolError) as e:
            await ws.close()
            raise ServerUnavailableError(f"{self.url} did not say ready: {e}") from e
        if isinstance(message, Error):
            await ws.close()
            error = error_for(message.code, f"{self.url}: {message.message}")
            if message.code == ErrorCode.UNAUTHORIZED:
                self.fatal = RemoteError(
                    f"{self.url} refused the API key: {message.message}", code=message.code
                )
                raise self.fatal
            raise error
        if not isinstance(message, Ready) or message.protocol != PROTOCOL_VERSION:
            await ws.close()
            self.fatal = RemoteError(
                f"{self.url} does not speak protocol version {PROTOCOL_VERSION} "
                f"(first message: {first!r:.120}); update pipecat-veena on one side",
                code=ErrorCode.BAD_MESSAGE,
            )
            raise self.fatal
        self._ws, self.ready = ws, message
        self._outbox = outbox = asyncio.Queue()
        self.connects += 1
        self._spawn(self._read(ws))
        self._writer = self._spawn(self._write(ws, outbox))
        logger.debug(f"connected to {self.url} ({message.model}, {message.sample_rate} Hz)")

    def _spawn(self, coro: object) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- utterances --------------------------------------------------------------------------
    def add(self, uid: str) -> Pending:
        """Register the inbox of utterance ``uid`` (before its ``speak`` is sent)."""
        pending = Pending(uid)
        self.pending[uid] = pending
        return pending

    async def speak(self, speak: Speak) -> None:
        """Send ``speak`` directly (one event-loop step less than the writer's queue).

        A connection lost meanwhile ends the utterance's inbox with ``ServerUnavailableError``.
        """
        ws = self._ws
        if ws is None:
            pending = self.pending.get(speak.id)
            if pending is not None:
                pending.finish(ServerUnavailableError(f"not connected to {self.url}"))
            return
        with contextlib.suppress(ConnectionClosed):  # the reader fails the inbox
            await ws.send(to_json(speak))

    def cancel(self, uid: str) -> None:
        """Ask the server to stop ``uid`` (no wait) and end its local iterator quietly."""
        pending = self.pending.pop(uid, None)
        if pending is not None and not pending.finished:
            pending.finish()
            self._send(to_json(Cancel(uid)))

    def forget(self, uid: str) -> None:
        """Drop a finished utterance's inbox."""
        self.pending.pop(uid, None)

    def _send(self, text: str) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(text)

    async def _write(self, ws: ClientConnection, outbox: asyncio.Queue[str]) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(await outbox.get())

    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    frame = decode_audio_frame(message)
                    pending = self.pending.get(frame.id)
                    if pending is not None:
                        pending.put(frame)
                    continue
                self._on_message(parse_server_message(message))
        except ConnectionClosed:
            pass
        except ProtocolError as e:
            logger.error(f"{self.url} sent a message outside the protocol: {e}")
            await ws.close()
        finally:
            self._dropped(ws)

    def _on_message(self, message: Ready | Done | Error) -> None:
        if isinstance(message, Done):
            pending = self.pending.pop(message.id, None)
            if pending is not None:
                pending.finish()
        elif isinstance(message, Error) and message.id is not None and message.ended:
            pending = self.pending.pop(message.id, None)
            if pending is not None:
                pending.finish(error_for(message.code, message.message))
        elif isinstance(message, Error):
            logger.warning(f"{self.url}: {message.code}: {message.message}")

    def _dropped(self, ws: ClientConnection) -> None:
        if self._ws is not ws:
            return
        self._ws = self._outbox = None
        if self._writer is not None:
            self._writer.cancel()
        code = ws.close_code
        reason = f"{code} {ws.close_reason or ''}".strip() if code is not None else "no close"
        error = ServerUnavailableError(
            f"the connection to {self.url} was lost ({reason})", code="connection_lost"
        )
        for pending in self.pending.values():
            pending.finish(error)
        self.pending.clear()
        if self.closed or code == 1000:  # shut down here, or closed as idle: dial on demand
            return
        logger.warning(f"lost the connection to {self.url} ({reason}); reconnecting")
        self._spawn(self._redial())

    async def _redial(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self.closed and self._ws is None and self.fatal is None:
            try:
                await self.ensure()
            except RemoteError as e:
                logger.debug(f"{self.url}: {e}; next try in {delay:g} s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    async def close(self) -> None:
        """Close the connection, fail what is open and stop redialing."""
        self.closed = True
        for pending in self.pending.values():
            pending.finish(ServerUnavailableError("the remote engine was shut down"))
        self.pending.clear()
        ws = self._ws
        if ws is not None:
            await ws.close()
        await cancel_and_wait(*self._tasks)
