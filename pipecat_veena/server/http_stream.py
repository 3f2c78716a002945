"""Streaming an utterance as an HTTP response body, with drain and slow-client handling.

``AudioPump`` runs the engine stream in a task of its own, feeding a small bounded queue, so
that a drain can cancel it at any moment and a client that stops reading makes generation
wait. ``AudioStreamResponse`` sends the body with a per-message deadline: a client that takes
longer than ``slow_client_timeout_s`` to accept a message is dropped and its request aborted.
A body that cannot finish (generation failed, drain, slow client) raises ``StreamAborted`` out
of the app, so the server drops the connection without the terminating chunk: every HTTP client
then sees an incomplete transfer instead of a short, complete-looking body.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from loguru import logger
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from pipecat_veena.remote.protocol import ErrorCode
from pipecat_veena.server.speech import SpeechRun
from pipecat_veena.tasks import cancel_and_wait

#: Chunks the pump may hold ahead of the client (engine chunks are 20 ms to a few 100 ms).
PUMP_CHUNKS = 16


class StreamAborted(Exception):
    """Raised out of the app to abort a response that cannot finish (an incomplete transfer).

    uvicorn then closes the connection without the terminating chunk; its ERROR log line for
    the exception is dropped (``QuietAborts``): the route logged why, at warning.
    """


class QuietAborts(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" records for a ``StreamAborted``."""

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamAborted)


def quiet_aborts() -> None:
    """Install ``QuietAborts`` on uvicorn's error logger (once)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietAborts) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(QuietAborts())


class PumpStopped(Exception):
    """The pump was stopped by the server (``code``: why, e.g. server_draining)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class AudioPump:
    """Runs ``run.segment(text)`` in its own task; ``next()`` hands out the PCM in order.

    Args:
        run: the accepted utterance (its ``cancel`` is pointed at ``stop``).
        text: what to say.
    """

    def __init__(self, run: SpeechRun, text: str) -> None:
        self.run = run
        run.cancel = self.stop
        self.stop_code: str | None = None
        self.error: Exception | None = None
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(PUMP_CHUNKS)
        self._task = asyncio.get_running_loop().create_task(self._produce(text))

    def stop(self, code: str) -> None:
        """Stop generating now (the engine request is aborted); ``next()`` then raises."""
        if self.stop_code is None and not self._task.done():
            self.run.server.metrics.cancels.labels("http", "drain").inc()
        self.stop_code = self.stop_code or code
        self._task.cancel()

    async def _produce(self, text: str) -> None:
        try:
            with logger.contextualize(**self.run.log_context):  # the engine's lines too
                async for pcm in self.run.segment(text):
                    await self._queue.put(pcm)
                tail = self.run.finish()
                if tail:
                    await self._queue.put(tail)
        except Exception as e:
            self.error = e

    async def next(self) -> bytes | None:
        """The next PCM chunk; None at the end.

        Raises:
            PumpStopped: the server stopped the pump (drain).
            Exception: what the engine raised.
        """
        while True:
            if not self._queue.empty():
                return self._queue.get_nowait()
            if self._task.done():
                if self._task.cancelled():
                    raise PumpStopped(self.stop_code or "cancelled")
                if self.error is not None:
                    raise self.error
                return None
            getter = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    async def close(self, outcome: str) -> None:
        """Stop the producer if it still runs and release the utterance's slot."""
        await cancel_and_wait(self._task)
        self.run.close(outcome)


class AudioStreamResponse(StreamingResponse):
    """A streaming response that drops clients too slow to take a message within a deadline.

    Args:
        content: the body (bytes pieces).
        pump: the utterance's pump, closed when the response ends however it ends.
        slow_client_timeout_s: the most one message may wait for the client.
        outcome: a one-item list the body sets to the utterance's outcome as it ends.
        **kwargs: status, headers and media type as for ``StreamingResponse``.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        pump: AudioPump,
        slow_client_timeout_s: float,
        outcome: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self.pump = pump
        self.slow_client_timeout_s = slow_client_timeout_s
        self.outcome = outcome

    async def stream_response(self, send: Send) -> None:
        """Send the head and body, each message within the slow-client deadline."""
        timeout = self.slow_client_timeout_s
        head = {"type": "http.response.start", "status": self.status_code}
        try:
            async with asyncio.timeout(timeout):
                await send({**head, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                async with asyncio.timeout(timeout):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            async with asyncio.timeout(timeout):
                await send({"type": "http.response.body", "body": b""})
        except TimeoutError:
            self.outcome[0] = "disconnected"
            self.pump.run.server.metrics.error("http", ErrorCode.SLOW_CLIENT)
            logger.bind(**self.pump.run.log_context).warning(
                f"speech server: a client did not read {self.pump.run.request_id} for "
                f"{timeout:g} s; dropped it and aborted the request"
            )
            raise StreamAborted("slow_client") from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the response; the utterance is released whatever happens."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self.pump.close(self.outcome[0])
