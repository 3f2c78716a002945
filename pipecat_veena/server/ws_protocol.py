"""uvicorn's WebSocket protocol (websockets, sans-I/O) with three holes closed.

1. A handshake websockets refuses (a header line over 8 KiB, over 128 headers, a request line
   over 8 KiB: ``LimitedH11Protocol`` refuses most of these first, at the server's own
   ``max_headers`` and ``max_header_bytes``) was never answered: websockets writes its refusal
   to its output buffer, which uvicorn never reads, so the client hung. It now gets that
   ``431`` (``414``; ``400`` for a request it cannot parse) and a close, at once.
2. Pongs to a client's pings are written whatever the socket's buffer holds, so a client that
   sends pings and reads nothing grew the server's memory without bound. Past
   ``write_limit`` bytes waiting for the client, the connection is cut.
3. When the app is done with a connection (it dropped a slow client, say), uvicorn closes the
   transport, and asyncio keeps a socket open until its buffer is written: forever, for a
   client that reads nothing, with its kernel buffers (megabytes). Whatever is still unsent
   ``close_grace_s`` after the app returned is dropped with the connection.

``ServerHandle`` serves with it (``pipecat-veena serve``).
"""

from __future__ import annotations

import functools
from http import HTTPStatus
from typing import Any

from loguru import logger
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    """``WebSocketsSansIOProtocol`` that answers bad handshakes and bounds what waits unsent.

    Args:
        write_limit: bytes that may wait in the transport for a client before it is cut
            (only pongs can get there: the app's own sends wait while the buffer is full).
        close_grace_s: how long the rest of a closed connection's output may take to leave.
        **kwargs: uvicorn's protocol arguments.
    """

    def __init__(self, *, write_limit: int, close_grace_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.write_limit = write_limit
        self.close_grace_s = close_grace_s

    def data_received(self, data: bytes) -> None:
        """Feed websockets; answer a handshake it refused, cut a client that never reads."""
        super().data_received(data)
        if self.transport.is_closing():
            return
        failed = self.conn.handshake_exc
        if not self.handshake_initiated and failed is not None:
            self._refuse_handshake(failed)
        elif self.transport.get_write_buffer_size() > self.write_limit:
            logger.warning(
                f"speech server: a WebSocket client ({self._peer()}) sends but does not read "
                f"(over {self.write_limit} bytes waiting for it); dropped it"
            )
            self.transport.abort()

    def _refuse_handshake(self, error: Exception) -> None:
        # websockets already wrote its answer to a line too long (414) or headers too large
        # (431); a request it could not parse at all gets a 400 here
        output = b"".join(self.conn.data_to_send())
        if not output:
            detail = f"{error}: {error.__cause__}" if error.__cause__ else str(error)
            response = self.conn.reject(
                HTTPStatus.BAD_REQUEST, f"Failed to open a WebSocket connection: {detail}.\n"
            )
            self.conn.send_response(response)
            output = b"".join(self.conn.data_to_send())
        self.transport.write(output)
        self.transport.close()

    async def run_asgi(self) -> None:
        """Run the app; once it returned, give unsent output ``close_grace_s`` to leave."""
        await super().run_asgi()
        if not self.disconnected:
            self.loop.call_later(self.close_grace_s, self._drop_if_stuck)

    def _drop_if_stuck(self) -> None:
        if not self.disconnected:
            self.transport.abort()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "?"


def bounded_ws_protocol(*, write_limit: int, close_grace_s: float) -> Any:
    """The protocol factory to give ``uvicorn.Config(ws=...)``."""
    return functools.partial(
        BoundedWebSocketProtocol, write_limit=write_limit, close_grace_s=close_grace_s
    )
