"""Serving the app with uvicorn in the current event loop (tests, benchmarks, ``serve``).

``pipecat-veena serve`` adds a graceful drain on SIGTERM and a voices-file reload on SIGHUP. The
HTTP protocol is uvicorn's h11 with the server's connection and header limits
(``http_limits``).

The engine lives on this loop (vLLM binds an engine to its loop), so the server runs here too,
as a task, instead of in ``uvicorn.run``'s own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from loguru import logger

from pipecat_veena.remote.protocol import STREAM_PATH
from pipecat_veena.server.http_limits import protocol_for
from pipecat_veena.server.http_stream import quiet_aborts
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.ws_protocol import bounded_ws_protocol
from pipecat_veena.tasks import cancel_and_wait

#: uvicorn's hard cap on one WebSocket message, as a multiple of the app's own cap (messages in
#: between get a clear ``message_too_large`` error; beyond it uvicorn closes with 1009).
_WS_MAX_SIZE_FACTOR = 16
#: After the app's own drain, how long uvicorn may take to close the remaining connections.
_UVICORN_GRACE_S = 5


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: whoever runs it decides what a signal means."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ServerHandle:
    """A speech server app served by uvicorn in this event loop.

    Args:
        app: the app from ``create_app``.
        host: the address to listen on.
        port: the port (0: a free one, see ``port`` once started).
        log_level: uvicorn's log level.
        configure_logging: let uvicorn set up Python logging (the CLI does; tests do not).
    """

    def __init__(
        self,
        app: FastAPI,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        configure_logging: bool = False,
    ) -> None:
        self.app = app
        self.host = host
        self._requested_port = port
        self._log_level = log_level
        self._configure_logging = configure_logging
        self._server: _Uvicorn | None = None
        self.task: asyncio.Task[None] | None = None
        self.port = port

    @property
    def state(self) -> SpeechServer:
        """The app's shared state."""
        return self.app.state.veena

    @property
    def url(self) -> str:
        """Base HTTP URL (``http://host:port``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """The streaming WebSocket's URL."""
        return f"ws://{self.host}:{self.port}{STREAM_PATH}"

    async def start(self) -> ServerHandle:
        """Bind, start serving and return once uvicorn accepts connections."""
        settings = self.state.settings
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and without
        # it a small message (a done) followed by audio waits ~40 ms for a delayed ACK (Nagle)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self._requested_port))
        self.port = sock.getsockname()[1]
        extra: dict[str, Any] = {} if self._configure_logging else {"log_config": None}
        quiet_aborts()
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            http=protocol_for(settings),  # h11 with the connection and header limits
            log_level=self._log_level,
            ws_max_size=settings.max_message_bytes * _WS_MAX_SIZE_FACTOR,
            ws_per_message_deflate=False,  # PCM does not compress; deflate only costs latency
            ws=bounded_ws_protocol(
                write_limit=settings.send_buffer_bytes,
                close_grace_s=settings.slow_client_timeout_s,
            ),
            timeout_graceful_shutdown=_UVICORN_GRACE_S,
            **extra,
        )
        self._server = _Uvicorn(config)
        self.task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self.task.done():
                sock.close()
                self.task.result()  # raises what stopped it
                raise RuntimeError("uvicorn stopped before it started serving")
            await asyncio.sleep(0.01)
        return self

    async def stop(self, *, drain: bool = False, deadline_s: float | None = None) -> None:
        """Stop serving; with ``drain``, let in-flight streams finish first (``deadline_s``).

        The app's lifespan then ends (shutting the engine down when the app owns it).
        """
        if self._server is None or self.task is None:
            return
        if drain:
            await self.state.drain(deadline_s)
        self._server.should_exit = True
        await asyncio.gather(self.task, return_exceptions=True)
        if self._server.force_exit and self._server.started:
            # a forced uvicorn skips the app's shutdown, whose task then dies at exit with an
            # ERROR traceback: end it here (streams cancelled, engine shut down)
            await self._server.lifespan.shutdown()

    def force_exit(self) -> None:
        """Make a running ``stop`` give up waiting for connections."""
        if self._server is not None:
            self._server.force_exit = True
            self._server.should_exit = True

    async def __aenter__(self) -> ServerHandle:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_until_signalled(handle: ServerHandle, *, on_ready: Any = None) -> int:
    """Serve until SIGTERM or SIGINT, then drain; returns the process exit status.

    SIGHUP reads the engine's voices file again at once (it is also reloaded when it changes).

    The first signal drains (``/ready`` 503, new streams refused, in-flight ones get
    ``drain_timeout_s`` to finish, then are cancelled), then the engine shuts down. A second
    signal cancels what is left at once (each utterance still gets its ended error, then its
    connection closes). Exit status 1 when the engine failed to start, or died and could not
    be restarted (``/health`` 503: ``EngineConfig.restart_attempts`` ran out).
    """
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[int] = asyncio.Queue()

    def listen() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signals.put_nowait, sig)
        loop.add_signal_handler(signal.SIGHUP, _reload_voices, handle)

    listen()
    await handle.start()
    state = handle.state
    started = asyncio.ensure_future(state.wait_started())
    first_signal = asyncio.ensure_future(signals.get())
    await asyncio.wait({started, first_signal, handle.task}, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if started.done() and started.exception() is None:
        # vLLM puts its own SIGTERM handler in front at start (it stops the engine at once);
        # take the signals back so that a SIGTERM drains first.
        listen()
        if on_ready is not None:
            on_ready()
        dead = asyncio.ensure_future(state.wait_dead())
        await asyncio.wait({first_signal, handle.task, dead}, return_when=asyncio.FIRST_COMPLETED)
        if dead.done() and not first_signal.done():
            logger.error(f"speech server: {dead.result()}; exiting with status 1")
            status = 1
        await cancel_and_wait(dead)
    elif started.done():
        status = 1
    if first_signal.done():
        logger.info(f"speech server: signal {first_signal.result()}: draining")
    second_signal = asyncio.ensure_future(signals.get())
    stopping = asyncio.ensure_future(handle.stop(drain=status == 0))
    await asyncio.wait({stopping, second_signal}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        logger.warning("speech server: second signal: cancelling what is left")
        # cancel first: each utterance's ended error is queued, and each connection sends it
        # and closes (bounded); uvicorn's forced exit would otherwise cut connections with
        # those errors still unsent
        await state.drain(deadline_s=0.001)
        handle.force_exit()
        await stopping
    await cancel_and_wait(started, first_signal, second_signal)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    return status


def _reload_voices(handle: ServerHandle) -> None:
    """SIGHUP: read the engine's voices file again now (enrolled voices, pinned prints).

    The reading runs on a worker thread (a large file takes a while to parse), never on the
    event loop.
    """
    refresh = getattr(handle.state.engine, "refresh_voices", None)
    if refresh is None:
        logger.info("speech server: SIGHUP: this engine has no voices file to reload")
        return

    async def reload() -> None:
        try:
            reloaded = await asyncio.to_thread(refresh, now=True)
        except Exception as e:  # not started yet: the start reads the file anyway
            logger.warning(f"speech server: SIGHUP: voices file not reloaded: {e}")
            return
        logger.info(f"speech server: SIGHUP: voices file {'reloaded' if reloaded else 'unchanged'}")

    task = asyncio.get_running_loop().create_task(reload())
    _RELOADS.add(task)  # a reference until it is done (the loop keeps only a weak one)
    task.add_done_callback(_RELOADS.discard)


_RELOADS: set[asyncio.Task[None]] = set()
