"""One WebSocket from a RemoteVeenaEngine to one speech server, carrying many utterances.

A reader task routes audio frames and ``done`` / ``error`` messages to the utterance they name;
a writer task sends queued messages in order (so closing a stream can queue its ``cancel``
without waiting). When the connection drops, every open utterance on it fails at once and,
unless the server closed it normally (idle), a background task redials with jittered backoff.

A draining server says ``goaway`` (or refuses a ``speak`` with ``server_draining``), and a
server whose engine died says ``engine_unavailable`` (it restarts its engine, or exits): the
link then leaves that connection to finish its utterances in flight (and closes it once they
ended) and dials a new one at once, through the same URL (a load balancer or proxy routes it to
another server; a lone server answers again once its engine is back), for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

from loguru import logger
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from pipecat_veena.errors import RemoteError, ServerUnavailableError
from pipecat_veena.logs import redact
from pipecat_veena.remote.protocol import (
    CLOSE_GOING_AWAY,
    PROTOCOL_VERSION,
    AudioFrame,
    Cancel,
    Done,
    Error,
    ErrorCode,
    GoAway,
    ProtocolError,
    Ready,
    ServerMessage,
    Speak,
    Words,
    decode_audio_frame,
    error_for,
    parse_server_message,
    to_json,
)
from pipecat_veena.tasks import cancel_and_wait

#: Redial delays after a dropped connection: doubling from the first to the last, each one
#: jittered (``jittered``) so that the clients of a restarted server do not redial in step.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.1, 5.0
#: Largest message accepted from the server (audio frames are far smaller).
MAX_MESSAGE_BYTES = 16 * 2**20
#: Close codes of a server going away (draining, stopping): redial, and retry there what had not
#: started. 1012 is the protocol's (after ``goaway``); 1001 is the standard "going away".
GOING_AWAY_CODES = frozenset({CLOSE_GOING_AWAY, 1001})
#: The code of a ``ServerUnavailableError`` for an utterance that never reached a server (its
#: connection was leaving): like ``server_draining``, safe to send again anywhere.
NOT_SENT = "not_sent"
#: Error codes that make the link leave its connection and dial again: the server behind it
#: takes nothing new (draining), or has no engine for now (dead, restarting).
LEAVE_CODES = frozenset({ErrorCode.SERVER_DRAINING, ErrorCode.ENGINE_UNAVAILABLE})


def jittered(delay: float) -> float:
    """``delay`` spread uniformly over [delay / 2, delay * 3 / 2] (backoff with jitter)."""
    return delay * random.uniform(0.5, 1.5)


def next_delay(delay: float) -> float:
    """The backoff delay after ``delay``: doubled, at most ``BACKOFF_MAX_S``."""
    return min(delay * 2, BACKOFF_MAX_S)


@dataclass(frozen=True)
class End:
    """The last item of an utterance: ``error`` None when it ended normally or was aborted."""

    error: Exception | None = None


@dataclass(eq=False)
class _Conn:
    """One WebSocket of a link: its writer's queue, and whether the server said goaway."""

    ws: ClientConnection
    outbox: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    writer: asyncio.Task[None] | None = None
    leaving: bool = False


class Pending:
    """An utterance in flight on a link: its audio frames, words and end, in arrival order."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.finished = False
        self.conn: _Conn | None = None  # the connection its speak went out on
        self.queue: asyncio.Queue[AudioFrame | Words | End] = asyncio.Queue()

    def put(self, frame: AudioFrame | Words) -> None:
        """Queue an audio frame or word timings (ignored after the end)."""
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
        self.shown = redact(url)  # for logs and errors: no key from the query
        self.headers = headers
        self.open_timeout_s = open_timeout_s
        self.ready: Ready | None = None
        self.pending: dict[str, Pending] = {}
        self.fatal: RemoteError | None = None
        self.closed = False
        self.connects = 0
        self._conn: _Conn | None = None  # the connection new utterances go to
        self._leaving: set[_Conn] = set()  # told to go; finishing their utterances
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        """True while the WebSocket is open and the server said ``ready``."""
        return self._conn is not None

    async def ensure(self) -> None:
        """Connect unless connected (one attempt).

        Raises:
            RemoteError: refused for good (bad key, protocol version).
            ServerUnavailableError: unreachable, starting or draining: try later or elsewhere.
        """
        if self.fatal is not None:
            raise self.fatal
        async with self._lock:
            if self._conn is None and not self.closed:
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
            raise ServerUnavailableError(f"cannot connect to {self.shown}: {e}") from e
        try:
            first = await asyncio.wait_for(ws.recv(), self.open_timeout_s)
            message = parse_server_message(first) if isinstance(first, str) else None
        except (ConnectionClosed, TimeoutError, ProtocolError) as e:
            await ws.close()
            raise ServerUnavailableError(f"{self.shown} did not say ready: {e}") from e
        if isinstance(message, Error):
            await ws.close()
            error = error_for(message.code, f"{self.shown}: {message.message}")
            if message.code == ErrorCode.UNAUTHORIZED:
                self.fatal = RemoteError(
                    f"{self.shown} refused the API key: {message.message}", code=message.code
                )
                raise self.fatal
            raise error
        if not isinstance(message, Ready) or message.protocol != PROTOCOL_VERSION:
            await ws.close()
            self.fatal = RemoteError(
                f"{self.shown} does not speak protocol version {PROTOCOL_VERSION} "
                f"(first message: {first!r:.120}); update pipecat-veena on one side",
                code=ErrorCode.BAD_MESSAGE,
            )
            raise self.fatal
        self._conn = conn = _Conn(ws)
        self.ready = message
        self.connects += 1
        self._spawn(self._read(conn))
        conn.writer = self._spawn(self._write(conn))
        logger.debug(f"connected to {self.shown} ({message.model}, {message.sample_rate} Hz)")

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

        A connection lost meanwhile ends the utterance's inbox with ``ServerUnavailableError``
        (code ``NOT_SENT`` when it never went out).
        """
        conn, pending = self._conn, self.pending.get(speak.id)
        if conn is None:
            if pending is not None:
                error = f"not connected to {self.shown} (its connection was closed or leaving)"
                pending.finish(ServerUnavailableError(error, code=NOT_SENT))
            return
        if pending is not None:
            pending.conn = conn
        with contextlib.suppress(ConnectionClosed):  # the reader fails the inbox
            await conn.ws.send(to_json(speak))

    def cancel(self, uid: str) -> None:
        """Ask the server to stop ``uid`` (no wait) and end its local iterator quietly."""
        pending = self.pending.pop(uid, None)
        if pending is not None and not pending.finished:
            pending.finish()
            if pending.conn is not None:  # on the connection it runs on, leaving or not
                pending.conn.outbox.put_nowait(to_json(Cancel(uid)))

    def forget(self, uid: str) -> None:
        """Drop a finished utterance's inbox."""
        self.pending.pop(uid, None)

    async def _write(self, conn: _Conn) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await conn.ws.send(await conn.outbox.get())

    async def _read(self, conn: _Conn) -> None:
        ws = conn.ws
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    frame = decode_audio_frame(message)
                    pending = self.pending.get(frame.id)
                    if pending is not None:
                        pending.put(frame)
                    continue
                self._on_message(conn, parse_server_message(message))
        except ConnectionClosed:
            pass
        except ProtocolError as e:
            logger.error(f"{self.shown} sent a message outside the protocol: {e}")
            await ws.close()
        finally:
            self._dropped(conn)

    def _on_message(self, conn: _Conn, message: ServerMessage | None) -> None:
        if isinstance(message, GoAway) or (
            isinstance(message, Error) and message.code in LEAVE_CODES
        ):
            self._leave(conn, message.code)  # (an error too: a server before goaway says only that)
        if isinstance(message, Words):
            pending = self.pending.get(message.id)
            if pending is not None:
                pending.put(message)
        elif isinstance(message, Done):
            pending = self.pending.pop(message.id, None)
            if pending is not None:
                pending.finish()
        elif isinstance(message, Error) and message.id is not None and message.ended:
            pending = self.pending.pop(message.id, None)
            if pending is not None:
                pending.finish(error_for(message.code, message.message))
        if conn.leaving and isinstance(message, Done | Error):
            self._close_if_idle(conn)
        elif isinstance(message, Error):
            logger.bind(request_id=message.id).warning(
                f"{self.shown}: {message.code}: {message.message}"
            )
        elif message is None:
            logger.debug(f"{self.shown} sent a message type this client does not know; ignored")

    def _leave(self, conn: _Conn, code: str) -> None:
        """The server behind ``conn`` takes nothing new: the next utterances go to a new one."""
        if conn.leaving:
            return
        conn.leaving = True
        if self._conn is conn:
            self._conn = None
            self._leaving.add(conn)
            why = "has no engine for now" if code == ErrorCode.ENGINE_UNAVAILABLE else "drains"
            logger.info(f"{self.shown}: the server {why}; connecting again for what follows")
            if not self.closed:
                self._spawn(self._redial())
        if code == ErrorCode.ENGINE_UNAVAILABLE:  # (a draining server closes it itself)
            self._close_if_idle(conn)

    def _close_if_idle(self, conn: _Conn) -> None:
        """Close a connection the link left once no utterance runs on it any more."""
        if conn.leaving and not any(p.conn is conn for p in self.pending.values()):
            self._spawn(conn.ws.close())

    def _dropped(self, conn: _Conn) -> None:
        ws = conn.ws
        if conn.writer is not None:
            conn.writer.cancel()
        code = ws.close_code
        reason = f"{code} {ws.close_reason or ''}".strip() if code is not None else "no close"
        if conn.leaving or code in GOING_AWAY_CODES:
            error = ServerUnavailableError(
                f"the server at {self.shown} went away ({reason})", code=ErrorCode.SERVER_DRAINING
            )
        else:
            error = ServerUnavailableError(
                f"the connection to {self.shown} was lost ({reason})", code="connection_lost"
            )
        for uid, pending in list(self.pending.items()):
            if pending.conn is conn:
                pending.finish(error)
                del self.pending[uid]
        self._leaving.discard(conn)
        if self._conn is not conn:
            return
        self._conn = None
        if self.closed or code == 1000:  # shut down here, or closed as idle: dial on demand
            return
        logger.warning(f"lost the connection to {self.shown} ({reason}); reconnecting")
        self._spawn(self._redial())

    async def _redial(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self.closed and self._conn is None and self.fatal is None:
            try:
                await self.ensure()
            except RemoteError as e:
                wait = jittered(delay)
                logger.debug(f"{self.shown}: {e}; next try in {wait:.2f} s")
                await asyncio.sleep(wait)
                delay = next_delay(delay)

    async def close(self) -> None:
        """Close the connections, fail what is open and stop redialing."""
        self.closed = True
        for pending in self.pending.values():
            pending.finish(ServerUnavailableError("the remote engine was shut down"))
        self.pending.clear()
        conns = [c for c in (self._conn, *self._leaving) if c is not None]
        await asyncio.gather(*(c.ws.close() for c in conns))
        await cancel_and_wait(*self._tasks)
