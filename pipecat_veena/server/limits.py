"""Who may speak and how much at once: bearer API keys and the stream caps (total, per key)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections import Counter

from starlette.requests import HTTPConnection

from pipecat_veena.remote.protocol import ErrorCode, ProtocolError
from pipecat_veena.server.settings import ServerSettings

#: The key name of every request when the server has no API keys.
ANONYMOUS = "anonymous"


def authenticate(settings: ServerSettings, authorization: str | None, query_key: str | None) -> str:
    """The name of the caller's API key (``anonymous`` when the server is open).

    Args:
        settings: the server's settings (its keys).
        authorization: the ``Authorization`` header (``Bearer <key>``), if any.
        query_key: the ``api_key`` query parameter (browsers cannot set WebSocket headers).

    Raises:
        ProtocolError: ``unauthorized``, saying what was missing or wrong.
    """
    if not settings.api_keys:
        return ANONYMOUS
    key = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ProtocolError(
                ErrorCode.UNAUTHORIZED,
                "the Authorization header must be 'Bearer <api key>'",
            )
        key = value.strip()
    elif query_key:
        key = query_key
    if key is None:
        raise ProtocolError(
            ErrorCode.UNAUTHORIZED,
            "this server needs an API key: send 'Authorization: Bearer <key>' (or ?api_key= on "
            "a WebSocket URL)",
        )
    for known, name in settings.api_keys.items():
        if hmac.compare_digest(known.encode(), key.encode()):
            return name
    raise ProtocolError(
        ErrorCode.UNAUTHORIZED, "the API key is not valid here; check the server's key file"
    )


def voice_owner(settings: ServerSettings, connection: HTTPConnection) -> str:
    """Who owns what this caller enrols: a fingerprint of its API key (never the key).

    An authenticated request's key (``Authorization: Bearer``, else ``X-API-Key``: Cartesia's
    routes, else the ``api_key`` query parameter); ``""`` (the operator: one owner, everyone)
    on a server without keys.
    """
    if not settings.api_keys:
        return ""
    authorization = connection.headers.get("authorization") or ""
    scheme, _, value = authorization.partition(" ")
    key = value.strip() if scheme.lower() == "bearer" else ""
    key = key or connection.headers.get("x-api-key") or connection.query_params.get("api_key")
    key = key or ""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:16]


def client_address(connection: HTTPConnection) -> str | None:
    """The caller's address (an HTTP request or a WebSocket), as uvicorn reports it."""
    return connection.client.host if connection.client else None


class StreamSlots:
    """Counts utterances in flight, in total and per key, and refuses those over the caps.

    A server without keys has one key for everyone (``anonymous``): there the per-key cap is
    replaced by a cap per client address, so that one client cannot take every slot.

    Args:
        settings: the caps (``max_streams``, ``max_streams_per_key``,
            ``max_streams_per_anonymous_client``).
    """

    def __init__(self, settings: ServerSettings) -> None:
        self._total = settings.max_streams
        self._per_key = settings.max_streams_per_key if settings.api_keys else None
        self._per_client = None if settings.api_keys else settings.max_streams_per_anonymous_client
        self._by_key: Counter[str] = Counter()
        self._by_client: Counter[str] = Counter()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        """Utterances in flight."""
        return self._active

    def acquire(self, key: str, client: str | None = None) -> None:
        """Take a slot for one utterance of ``key`` from address ``client`` (None: unknown).

        Raises:
            ProtocolError: ``too_many_streams``, naming the cap that was hit.
        """
        if self._active >= self._total:
            raise ProtocolError(
                ErrorCode.TOO_MANY_STREAMS,
                f"the server is at its cap of {self._total} concurrent streams; retry shortly "
                "or use another server",
            )
        if self._per_key is not None and self._by_key[key] >= self._per_key:
            raise ProtocolError(
                ErrorCode.TOO_MANY_STREAMS,
                f"API key '{key}' is at its cap of {self._per_key} concurrent streams; finish "
                "or cancel one first",
            )
        counted = self._per_client is not None and client is not None
        if counted and self._by_client[client] >= self._per_client:
            raise ProtocolError(
                ErrorCode.TOO_MANY_STREAMS,
                f"this server has no API keys and caps each client address at "
                f"{self._per_client} concurrent streams (--max-streams-per-anonymous-client); "
                "finish or cancel one first",
            )
        self._active += 1
        self._by_key[key] += 1
        if counted:
            self._by_client[client] += 1
        self._idle.clear()

    def release(self, key: str, client: str | None = None) -> None:
        """Give back a slot taken with ``acquire`` (the same ``key`` and ``client``)."""
        self._active -= 1
        _decrement(self._by_key, key)
        if self._per_client is not None and client is not None:
            _decrement(self._by_client, client)
        if self._active == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no utterance is in flight."""
        await self._idle.wait()


def _decrement(counts: Counter[str], name: str) -> None:
    counts[name] -= 1
    if counts[name] <= 0:
        del counts[name]
