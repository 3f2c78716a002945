"""The streaming WebSocket (``/v1/audio/stream``): a call's utterances over one connection.

Each connection has a receive loop (client messages), a send loop (everything the client gets
passes through one outbox bounded in bytes) and a task per utterance in flight. A client that
stops reading makes the outbox fill, generation wait, and after ``slow_client_timeout_s`` the
connection is dropped and its LLM requests aborted: a slow client holds a bounded amount of
memory. When the server drains, each connection gets a ``goaway`` and closes (code 1012) as
soon as its utterances in flight have ended. The messages are defined in
``pipecat_veena.remote.protocol``.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import WebSocket
from loguru import logger

from pipecat_veena.remote.protocol import (
    CLOSE_GOING_AWAY,
    Append,
    Cancel,
    End,
    Error,
    ErrorCode,
    Flush,
    GoAway,
    ProtocolError,
    Ready,
    Speak,
    parse_client_message,
    to_json,
)
from pipecat_veena.server.limits import authenticate, client_address, voice_owner
from pipecat_veena.server.markup import check_markup
from pipecat_veena.server.outbox import Outbox
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.ws_utterance import WsUtterance
from pipecat_veena.tasks import cancel_and_wait, wait_ended

#: Close codes: policy (bad key), try again later (starting, draining), normal (idle).
CLOSE_POLICY, CLOSE_TRY_LATER, CLOSE_NORMAL = 1008, 1013, 1000


class Connection:
    """One client connection: its receive loop, send loop and utterances.

    Args:
        websocket: the accepted WebSocket.
        server: the app's shared state.
        key: the caller's API key name.
    """

    #: The utterance class (a subclass speaks another protocol's messages).
    utterance_type: type[WsUtterance] = WsUtterance

    def __init__(self, websocket: WebSocket, server: SpeechServer, key: str) -> None:
        self.ws = websocket
        self.server = server
        self.key = key
        self.client = client_address(websocket)
        self.settings = server.settings
        self.outbox = Outbox(server.settings.send_buffer_bytes)
        self.utterances: dict[str, WsUtterance] = {}
        self.last_activity = time.monotonic()
        self.leaving = False

    async def run(self) -> None:
        """Serve the connection until the client leaves, idles out or stops reading."""
        metrics = self.server.metrics
        metrics.connections.inc()
        sender = asyncio.create_task(self._send_loop())
        receiver = asyncio.create_task(self._receive_loop())
        reason = "gone"
        try:
            hello = self._hello()
            if hello is not None:
                await self.outbox.put(hello)
            self.server.watch_drain(self.go_away)
            done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            reason = (receiver if receiver in done else sender).result()
        finally:
            self.server.unwatch_drain(self.go_away)
            receiver.cancel()
            utterances = list(self.utterances.values())
            for utterance in utterances:
                utterance.stop("gone")
            try:  # the sender last: utterances ending may still queue messages
                await wait_ended(receiver, *(u.task for u in utterances))
            finally:
                metrics.connections.dec()
                await cancel_and_wait(sender)
        if reason == "idle":
            idle = Error(
                ErrorCode.IDLE_TIMEOUT,
                f"no utterance and no message for {self.settings.idle_timeout_s:g} s; "
                "reconnect when there is something to say",
            )
            await self._close_with(idle, CLOSE_NORMAL)
        elif reason == "drain":
            await self._close_with(None, CLOSE_GOING_AWAY)
        elif reason == "slow":
            metrics.error("ws", ErrorCode.SLOW_CLIENT)
            logger.warning(
                f"speech server: a client ({self.key}) did not read for "
                f"{self.settings.slow_client_timeout_s:g} s; dropped it and aborted its requests"
            )

    def _hello(self) -> str | None:
        """The connection's first message (``ready``); a subclass's protocol may have none."""
        return to_json(self._ready())

    def _error_text(self, error: Error) -> str:
        """An ``error`` as this connection's client reads it (a subclass's wire shape)."""
        return to_json(error)

    def _ready(self) -> Ready:
        engine = self.server.engine
        return Ready(
            model=engine.model_name,
            sample_rate=engine.sample_rate,
            voices=self.server.voices_for(voice_owner(self.settings, self.ws))[0],
            default_voice=engine.voices[0],
            voice_levels=self.server.voice_levels,
            limits=self.settings.limits(),
            emotion_tags=list(engine.emotion_tags),
            openai_aliases=dict(self.server.voice_map),
            enrols_voices=callable(getattr(engine, "enroll_voice", None)),
            words=bool(getattr(engine, "times_words", False)),
        )

    def go_away(self) -> None:
        """The server drains: tell the client to go (``goaway``).

        The send loop closes the connection once no utterance is in flight on it and its last
        message is out.
        """
        if not self.leaving:
            self.leaving = True
            message = (
                "the server is shutting down: send no new speak on this connection; connect "
                f"again for new utterances (this one closes with code {CLOSE_GOING_AWAY} once "
                "its utterances in flight end)"
            )
            self.outbox.push_control(to_json(GoAway(ErrorCode.SERVER_DRAINING, message)))

    async def _close_with(self, error: Error | None, code: int) -> None:
        timeout = self.settings.slow_client_timeout_s
        if error is not None:
            self.server.metrics.error("ws", error.code)
        try:
            if error is not None:
                await asyncio.wait_for(self.ws.send_text(self._error_text(error)), timeout)
            await asyncio.wait_for(self.ws.close(code), timeout)
        except Exception:  # the client is gone or stuck: uvicorn closes the socket
            pass

    async def _send_loop(self) -> str:
        timeout = self.settings.slow_client_timeout_s
        while True:
            item = await self.outbox.get()
            try:
                async with asyncio.timeout(timeout):  # (no extra task, unlike wait_for)
                    if isinstance(item, bytes):
                        await self.ws.send_bytes(item)
                    else:
                        await self.ws.send_text(item)
            except TimeoutError:
                return "slow"
            except Exception:
                return "gone"
            if self.leaving and not self.utterances and self.outbox.empty:
                return "drain"  # (no utterance starts while the server drains)

    async def _receive_loop(self) -> str:
        idle = self.settings.idle_timeout_s
        while True:
            wait = (
                idle if self.utterances else max(0.0, self.last_activity + idle - time.monotonic())
            )
            try:
                async with asyncio.timeout(wait):
                    message = await self.ws.receive()
            except TimeoutError:
                if not self.utterances and time.monotonic() - self.last_activity >= idle:
                    return "idle"
                continue
            self.last_activity = time.monotonic()
            if message["type"] == "websocket.disconnect":
                return "gone"
            text = message.get("text")
            try:
                if text is None:
                    raise ProtocolError(
                        ErrorCode.BINARY_NOT_EXPECTED,
                        "binary frames carry audio from the server only; send JSON text messages",
                    )
                reply = self._handle(text)
                if reply is not None:  # (a subclass's answer to the message itself)
                    await self.outbox.put(reply)
            except ProtocolError as e:
                self.server.metrics.error("ws", e.code)
                await self.outbox.put(self._error_text(Error(e.code, e.message, e.ref, e.ended)))

    def _handle(self, text: str) -> str | None:
        msg = parse_client_message(text, self.settings.max_message_bytes)
        if isinstance(msg, Speak):
            self._speak(msg)
            return
        utterance = self.utterances.get(msg.id)
        if utterance is None:
            if isinstance(msg, Cancel):
                return  # already over: cancelling is idempotent
            raise ProtocolError(
                ErrorCode.UNKNOWN_ID,
                f"{msg.type}: no utterance {msg.id!r} is open on this connection (it ended, or "
                "its speak was refused)",
                msg.id,
            )
        if isinstance(msg, Append):
            utterance.append(msg.text)
        elif isinstance(msg, Flush):
            utterance.flush()
        elif isinstance(msg, End):
            utterance.end()
        elif isinstance(msg, Cancel):
            utterance.stop("cancel")

    def _speak(self, msg: Speak) -> None:
        if msg.id in self.utterances:
            raise ProtocolError(
                ErrorCode.DUPLICATE_ID,
                f"utterance {msg.id!r} is still open; wait for its done or use another id",
                msg.id,
            )
        server = self.server
        try:
            problem = server.availability()
            if problem is not None:
                raise problem
            server.check_text(msg.text, msg.id)
            voice = server.resolve_voice(msg.voice, voice_owner(self.settings, self.ws))
            server.check_options(msg.options, msg.id)
            if msg.options.get("ssml") and not msg.final:
                raise ProtocolError(
                    ErrorCode.BAD_MESSAGE,
                    "options.ssml needs the whole document in one speak (final: true)",
                    msg.id,
                )
            check_markup(msg.text, msg.options, msg.id)
            if not msg.final:
                self._check_open_cap()
            self.utterances[msg.id] = self.utterance_type(self, msg, voice)
        except ProtocolError as e:
            server.metrics.requests.labels("ws", "rejected").inc()
            e.ref, e.ended = msg.id, True
            raise

    def _check_open_cap(self) -> None:
        cap = self.settings.max_open_utterances
        if sum(not u.closed for u in self.utterances.values()) >= cap:
            raise ProtocolError(
                ErrorCode.TOO_MANY_OPEN_UTTERANCES,
                f"this connection already has {cap} utterances taking text (final: false), "
                "the server's cap (max_open_utterances); end one first",
            )


async def stream_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route: authenticate, say ``ready``, then serve the connection."""
    server: SpeechServer = websocket.app.state.veena
    key = None
    try:
        key = authenticate(
            server.settings,
            websocket.headers.get("authorization"),
            websocket.query_params.get("api_key"),
        )
        problem = server.availability()
    except ProtocolError as e:
        problem = e
    await websocket.accept()
    if problem is not None:
        code = CLOSE_POLICY if problem.code == ErrorCode.UNAUTHORIZED else CLOSE_TRY_LATER
        await Connection(websocket, server, key or "")._close_with(
            Error(problem.code, problem.message), code
        )
        return
    await Connection(websocket, server, key).run()
