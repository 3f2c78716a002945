"""Connection-level HTTP limits: uvicorn's h11 protocol with a head deadline and caps.

What a hostile client can do before the app sees a request is uvicorn's business, and uvicorn
leaves some of it open: a connection that never sends anything is never closed, a request head
may trickle in forever (slowloris), and its httptools parser takes any header size and count.
``LimitedH11Protocol`` is uvicorn's own h11 protocol with four additions, each from the server's
settings:

- ``max_connections``: a connection over the cap gets a 503 (``too_many_connections``) and is
  closed (WebSocket connections count too). The first ``PROBE_ROOM`` connections over it may
  still ask for a probe (``GET /health``, ``/ready``, ``/metrics``: answered, then closed), so
  that a flood of idle connections does not make a liveness probe kill a healthy pod; they get
  ``PROBE_HEAD_S`` to send it, any other request the 503. Past that room, the 503 comes at once;
- ``header_timeout_s``: from the moment a connection opens, or a response ends, the next
  request head must arrive whole within it; else the connection is closed (with a 408
  ``request_timeout`` when part of a head had arrived). The same deadline closes a connection
  whose client is still sending a body that the server already answered (a 413 or a 408 from
  the route): until then the rest is read and dropped, so the client gets to read the answer
  (closing a socket with unread data resets it, and the client may lose the answer);
- ``max_header_bytes`` (h11's own incomplete-event cap) and ``max_headers``, plus one header
  line at most ``MAX_HEADER_LINE`` bytes (what the WebSocket handshake parser takes): 431
  (``headers_too_large``), also on WebSocket handshakes.

Body limits (Content-Length, streamed size, read deadline) live in the route that reads the
body (``openai_routes.read_body``), so they hold under any ASGI server (Ray Serve's proxy too).
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import Any

import h11
from loguru import logger
from uvicorn.protocols.http.h11_impl import H11Protocol

from pipecat_veena.remote.protocol import ErrorCode, ProtocolError
from pipecat_veena.server.openai_routes import error_response
from pipecat_veena.server.settings import ServerSettings

#: Longest single header line: the WebSocket handshake parser (websockets) refuses longer ones
#: by hanging up without an answer, so the HTTP layer answers 431 first.
MAX_HEADER_LINE = 8192
#: Seconds between two warnings about refused connections (an attack must not flood the log).
_WARN_EVERY_S = 10.0
#: Connections over ``max_connections`` that may still ask for a probe path, each closed after
#: its answer (a kubelet opens a new connection for each probe).
PROBE_ROOM = 8
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})
#: How long a connection over the cap gets to send its probe's request head.
PROBE_HEAD_S = 1.0


class _Connection(h11.Connection):
    """h11's server connection, refusing request heads with too many or too long headers."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=settings.max_header_bytes)
        self.max_headers = settings.max_headers
        self.max_head_bytes = settings.max_header_bytes
        self.refusal: ProtocolError | None = None

    def next_event(self) -> Any:
        too_big = f"the request line and headers are over this server's cap of " \
            f"{self.max_head_bytes} bytes"  # fmt: skip
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            if e.error_status_hint == 431:  # h11: an incomplete head over the cap
                self.refusal = ProtocolError(ErrorCode.HEADERS_TOO_LARGE, too_big)
            raise
        if isinstance(event, h11.Request):
            problem = None
            size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if size > self.max_head_bytes:  # a head that arrived whole in one read
                problem = too_big
            elif len(event.headers) > self.max_headers:
                problem = (
                    f"the request has {len(event.headers)} header fields, over this server's "
                    f"cap of {self.max_headers}"
                )
            elif any(len(n) + len(v) + 2 > MAX_HEADER_LINE for n, v in event.headers):
                problem = f"a header line is over {MAX_HEADER_LINE} bytes"
            if problem is not None:
                self.refusal = ProtocolError(ErrorCode.HEADERS_TOO_LARGE, problem)
                raise h11.RemoteProtocolError(problem, error_status_hint=431)
        return event


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap, a head deadline and header caps.

    Use ``protocol_for(settings)``: it binds the settings.
    """

    settings: ServerSettings
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(self.settings)
        self._head_timer: asyncio.TimerHandle | None = None
        self._answered = False
        self._refusal: ProtocolError | None = None  # over the cap: probes only

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse the connection over ``max_connections``; else start the head deadline."""
        super().connection_made(transport)
        cap = self.settings.max_connections
        over = len(self.connections) - cap
        if over > 0:
            self._warn(f"speech server: {len(self.connections) - 1} connections open, the cap is "
                       f"{cap} (max_connections): refused one")  # fmt: skip
            refusal = ProtocolError(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"the server is at its cap of {cap} open connections; retry shortly or use "
                "another server",
            )
            if over > PROBE_ROOM:
                self._answer(refusal, linger=False)  # nothing was asked yet: free it at once
                return
            self._refusal = refusal
            self.app = _probes_only(self.app, refusal)
            self._arm_head_timer(min(self.settings.header_timeout_s, PROBE_HEAD_S))
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the head deadline with the connection."""
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does; a request head that arrived whole stops the head deadline."""
        if self.transport.is_closing() or self._answered:
            return  # answered and half-closed: what still comes is dropped
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a new request's head was parsed
            self._disarm_head_timer()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        """Hand over to the WebSocket protocol, which has its own timeouts."""
        self._disarm_head_timer()
        if self._refusal is not None:  # over the cap
            self._answer(self._refusal)
            return
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        """Start the next head's deadline (uvicorn's keep-alive timeout runs alongside)."""
        super().on_response_complete()
        if self._refusal is not None:  # a probe over the cap was answered: free its room
            self.transport.close()
        elif not self.transport.is_closing():
            self._arm_head_timer()

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 refused: 431 for oversized heads (named), else uvicorn's 400."""
        refusal, self.conn.refusal = self.conn.refusal, None
        if refusal is None:
            super().send_400_response(msg)
            return
        self._warn(f"speech server: refused a request from {self.client}: {refusal.message}")
        self._answer(refusal)

    def _arm_head_timer(self, seconds: float | None = None) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(
            self.settings.header_timeout_s if seconds is None else seconds, self._head_timed_out
        )

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._answered:
            self.transport.close()
            return
        if self._refusal is not None:  # over the cap, and no probe came
            self._answer(self._refusal, linger=False)
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._answer(
                ProtocolError(
                    ErrorCode.REQUEST_TIMEOUT,
                    f"the request line and headers did not arrive within "
                    f"{self.settings.header_timeout_s:g} s (header_timeout_s)",
                )
            )
        elif self.conn.their_state is h11.IDLE or self.conn.our_state is h11.DONE:
            # nothing sent since the connection opened (or the last response), or the client is
            # still sending a body the server already answered: hang up
            self.transport.close()

    def _answer(self, error: ProtocolError, *, linger: bool = True) -> None:
        """Write an OpenAI-shaped error response and close the connection.

        With ``linger`` the write side is closed at once and the connection itself when the
        client closes its side or at the head deadline, what comes meanwhile dropped: a close
        with unread data would reset the connection and could destroy the answer in flight.
        """
        response = error_response(error)
        phrase = HTTPStatus(response.status_code).phrase
        head = [f"HTTP/1.1 {response.status_code} {phrase}".encode()]
        head += [name + b": " + value for name, value in response.raw_headers]
        if not any(name == b"connection" for name, _ in response.raw_headers):
            head.append(b"connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + response.body)
        if linger and self.transport.can_write_eof():
            self._answered = True
            self.transport.write_eof()
            self._arm_head_timer()
        else:
            self.transport.close()

    @classmethod
    def _warn(cls, message: str) -> None:
        now = time.monotonic()
        if now - cls._last_warning >= _WARN_EVERY_S:
            cls._last_warning = now
            logger.warning(message)


def _probes_only(app: Any, refusal: ProtocolError) -> Any:
    """``app`` for the probe paths only; every other request gets ``refusal`` (a 503)."""

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] in PROBE_PATHS
            and scope["method"]
            in (
                "GET",
                "HEAD",
            )
        ):
            await app(scope, receive, send)
            return
        await error_response(refusal)(scope, receive, send)

    return guarded


def protocol_for(settings: ServerSettings) -> type[LimitedH11Protocol]:
    """The protocol class for uvicorn's ``http=`` option, bound to ``settings``."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"settings": settings})
