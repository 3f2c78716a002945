"""RemoteVeenaEngine: the SpeechEngine of a ``pipecat-veena serve`` server, over one WebSocket.

Bot processes that share one engine per GPU use it exactly like the in-process engine::

    engine = RemoteVeenaEngine("ws://tts-1:8000", api_key=os.environ["VEENA_API_KEY"])
    await engine.start()                      # connects; reads the voices and sample rate
    tts = VeenaTTSService(engine, voice="female")

One connection per server multiplexes every utterance of the process. Closing a stream (a
Pipecat interruption) sends ``cancel``, which aborts the server's LLM request. An utterance that
fails before its first audio (server restarting, full, a failed generation) is retried once, on
the next URL when several are given; after its first audio it fails with a clear error and is
never replayed. A draining server (``goaway``, ``server_draining``, close code 1012) is left at
once: a new connection is dialed (through one URL, a load balancer routes it to another server)
and an utterance it had not started goes there, for up to ``connect_timeout_s``. After a server
restart the connection is redialed with jittered backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from loguru import logger

from pipecat_veena import tracing
from pipecat_veena.engine import Voice, VoiceBook, check_speed, check_voice_name
from pipecat_veena.errors import (
    EngineNotRunningError,
    EnrolmentError,
    GenerationError,
    RemoteError,
    ServerUnavailableError,
    UnknownVoiceError,
)
from pipecat_veena.generation import SamplingOptions
from pipecat_veena.interface import AudioChunk
from pipecat_veena.remote.link import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    NOT_SENT,
    End,
    Link,
    jittered,
    next_delay,
)
from pipecat_veena.remote.protocol import (
    STREAM_PATH,
    ErrorCode,
    Ready,
    Speak,
    Words,
    check_option_types,
)

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._:\-]")
#: Longest prefix of a caller's request id kept in utterance ids (ids are at most 64 chars).
_ID_PREFIX = 40
#: Failures that mean "this server takes nothing new" (draining, or its engine is down), not
#: "this request failed": the utterance had not started, so it goes to a new connection (through
#: the same URL: another server, or this one once its engine is back) without using its retry.
_HANDOVER = frozenset({ErrorCode.SERVER_DRAINING, ErrorCode.ENGINE_UNAVAILABLE, NOT_SENT})


def stream_url(url: str) -> str:
    """The WebSocket URL of a server given as ``ws(s)://`` or ``http(s)://``, path optional."""
    parts = urlsplit(url if "://" in url else f"ws://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"a speech server URL starts with ws(s):// or http(s)://, got {url}")
    path = parts.path if parts.path not in ("", "/") else STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class RemoteVeenaEngine:
    """A SpeechEngine served by one or more ``pipecat-veena serve`` servers.

    Args:
        url: the server (``ws://host:8000`` or ``http://host:8000``), or several: later ones
            take over when the first is unreachable and take retries.
        api_key: the server's bearer key (None: an open server).
        connect_timeout_s: how long ``start()`` and each utterance keep trying to reach a
            server (with backoff) before failing; also how long an utterance refused by
            draining servers keeps looking for one that takes it.
        response_timeout_s: the most an utterance waits for the server's next message.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        response_timeout_s: float = 30.0,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("RemoteVeenaEngine needs at least one server URL")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._links = [Link(stream_url(u), headers, connect_timeout_s) for u in urls]
        self.connect_timeout_s = connect_timeout_s
        self.response_timeout_s = response_timeout_s
        self._preferred = 0
        self._info: Ready | None = None
        self._book: VoiceBook | None = None
        self._started = False
        self._closed = False
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._requests = 0
        self._retries = 0

    def __str__(self) -> str:
        return f"RemoteVeenaEngine({self._links[0].shown})"

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect to a server and read its model, voices and rate; idempotent.

        Raises:
            ServerUnavailableError: no server reachable within ``connect_timeout_s``.
            RemoteError: a server refused the key or speaks another protocol version.
        """
        async with self._start_lock:
            if self._closed:
                raise EngineNotRunningError(f"{self} was shut down; create a new one")
            if not self._started:
                await self._link_for(0)
                self._started = True

    async def shutdown(self) -> None:
        """Close the connections (open streams fail); idempotent."""
        self._closed = True
        await asyncio.gather(*(link.close() for link in self._links))

    async def __aenter__(self) -> RemoteVeenaEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- introspection ---------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between ``start()`` and ``shutdown()`` unless a server refused us for good."""
        return self._started and not self._closed and all(k.fatal is None for k in self._links)

    @property
    def model_name(self) -> str:
        """The served checkpoint's name (the server's address before ``start()``)."""
        return self._info.model if self._info else urlsplit(self._links[0].url).netloc

    @property
    def sample_rate(self) -> int:
        """Rate of the audio the server sends (its codec's)."""
        return self._require_info().sample_rate

    @property
    def voices(self) -> list[str]:
        """The server's voice names, default first."""
        return list(self._require_info().voices)

    @property
    def times_words(self) -> bool:
        """True when the server times words (its ``ready`` says so); False before ``start()``.

        Then the chunks carry the server's word timings (``AudioChunk.words``): a chunk with
        only words (empty ``pcm``) follows the audio that completes them.
        """
        return self._info is not None and self._info.words

    @property
    def emotion_tags(self) -> tuple[str, ...]:
        """Inline tags the server's model understands (e.g. ``<laugh>``)."""
        return tuple(self._require_info().emotion_tags)

    def check_voice(self, voice: str | None) -> str:
        """Canonical name of ``voice`` by the server's voices or its OpenAI voice names.

        An OpenAI name (``alloy``...) gives the voice the server maps it to. On a server that
        enrols voices (``ready.enrols_voices``), a well-formed name that the server did not
        list when this client connected may be a voice enrolled since: it is accepted, and the
        server answers ``unknown_voice`` (UnknownVoiceError) if it has no such voice.
        Raises UnknownVoiceError.
        """
        info = self._require_info()
        try:
            return self._book.resolve(voice).name
        except UnknownVoiceError:
            mapped = info.openai_aliases.get(str(voice).strip().lower())
            if mapped is not None:
                return mapped
            if info.enrols_voices and voice is not None:
                try:
                    return check_voice_name(voice)
                except EnrolmentError:
                    pass
            raise

    def check_options(self, **options: Any) -> None:
        """Raise ValueError naming the problem when request options cannot work."""
        options = check_option_types(options)
        options.pop("normalize", None)
        language = options.pop("language", None)
        if language is not None:
            from pipecat_veena.normalize import LANGUAGES  # (its import takes a moment)

            if language not in LANGUAGES:
                raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
        max_tokens = options.pop("max_tokens", None)
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        speed = options.pop("speed", None)
        if speed is not None:
            check_speed(speed)
        options.pop("ssml", None)  # (the server reads the document)
        lexicon = options.pop("lexicon", None)
        if lexicon is not None:
            from pipecat_veena.normalize.lexicon import request_lexicon

            request_lexicon(lexicon)
        SamplingOptions(**options)

    def stats(self) -> dict[str, Any]:
        """Local counters: utterances open on servers, retries, connections made."""
        open_ = sum(len(link.pending) for link in self._links)
        return {
            "active_streams": open_,
            "unfinished_requests": open_,
            "requests": self._requests,
            "retries": self._retries,
            "connects": sum(link.connects for link in self._links),
            "connected": [link.shown for link in self._links if link.connected],
        }

    def _require_info(self) -> Ready:
        if self._info is None:
            raise EngineNotRunningError(f"{self}: call start() first")
        return self._info

    def _adopt(self, link: Link) -> Link:
        info = link.ready
        if info is not None and info != self._info:
            self._info = info
            voices = {name: Voice(name=name) for name in info.voices}
            self._book = VoiceBook(voices, info.default_voice, controllable=info.voice_levels)
        return link

    async def _link_for(self, attempt: int) -> Link:
        """A connected link: the preferred one, or for a retry the next URL's (with backoff)."""
        n = len(self._links)
        start = (self._preferred + attempt) % n
        order = [self._links[(start + i) % n] for i in range(n)]
        deadline = time.monotonic() + self.connect_timeout_s
        delay, errors = BACKOFF_FIRST_S, {}
        while True:
            for link in order:
                try:
                    await link.ensure()
                    self._preferred = self._links.index(link) if attempt == 0 else self._preferred
                    return self._adopt(link)
                except RemoteError as e:
                    if not e.retryable:
                        raise
                    errors[link.shown] = e
            if time.monotonic() + delay > deadline:
                detail = "; ".join(str(e) for e in errors.values())
                raise ServerUnavailableError(
                    f"no speech server reachable within {self.connect_timeout_s:g} s ({detail}); "
                    "is `pipecat-veena serve` running there, and the URL right?"
                )
            await asyncio.sleep(jittered(delay))
            delay = next_delay(delay)

    # -- streaming -------------------------------------------------------------------------
    async def stream(
        self, text: str, voice: str | None = None, *, request_id: str | None = None, **options: Any
    ) -> AsyncIterator[AudioChunk]:
        """Speak ``text`` on a server: int16 chunks at ``sample_rate`` as they arrive.

        Closing or cancelling the iterator cancels the utterance on the server at once.

        Raises:
            UnknownVoiceError, ValueError: bad voice or options (checked by the server too).
            ServerUnavailableError: no server could take it (after one retry, or draining
                servers only for ``connect_timeout_s``).
            RemoteError, GenerationError, NoAudioError: the server failed the utterance.
        """
        if not self.is_running:
            raise EngineNotRunningError(f"{self} is not running: await engine.start() first")
        self.check_options(**options)
        options = {k: v for k, v in options.items() if v is not None}
        prefix = _UNSAFE_ID.sub("_", request_id or "tts")[:_ID_PREFIX]
        self._requests += 1
        handover_until = time.monotonic() + self.connect_timeout_s
        trace = tracing.traceparent()  # the server's spans continue the caller's trace
        attempt = handovers = failures = 0
        while True:
            uid = f"{prefix}-{next(self._ids)}"
            log = logger.bind(request_id=uid)  # the server's and engine's lines carry it too
            link = await self._link_for(attempt)
            pending = link.add(uid)
            audio = False
            tokens = 0
            words = True if link.ready is not None and link.ready.words else None
            try:
                speak = Speak(
                    id=uid, text=text, voice=voice, options=options, traceparent=trace, words=words
                )
                await link.speak(speak)
                log.debug(f"{self}: {uid} sent to {link.shown}")
                while not isinstance(item := await self._next(pending, uid), End):
                    audio = True
                    if isinstance(item, Words):  # behind the audio that completes them
                        yield AudioChunk(b"", self.sample_rate, tokens, words=item.timings())
                        continue
                    tokens = item.tokens
                    yield AudioChunk(item.pcm, self.sample_rate, item.tokens)
                if item.error is None:
                    return
                raise item.error
            except (RemoteError, GenerationError) as e:
                retryable = isinstance(e, GenerationError) or e.retryable
                handover = getattr(e, "code", None) in _HANDOVER
                if handover and time.monotonic() > handover_until:
                    handover = False  # draining servers only, for too long: a plain failure
                if audio or not retryable or (failures and not handover):
                    if audio and isinstance(e, ServerUnavailableError):
                        raise RemoteError(
                            f"{uid}: the speech server failed after the first audio was sent, "
                            f"so the utterance is cut short: {e}",
                            code=e.code,
                        ) from e
                    raise
                self._retries += 1
                attempt += 1
                if handover:  # not started anywhere: a new connection, another server
                    handovers += 1
                    log.info(f"{self}: {uid} handed over, the server is draining ({e})")
                    if handovers > 1:  # refused again: give the balancer time to notice
                        delay = min(BACKOFF_FIRST_S * handovers, BACKOFF_MAX_S)
                        await asyncio.sleep(jittered(delay))
                else:
                    failures += 1
                    where = "on the next server" if len(self._links) > 1 else "once"
                    log.warning(f"{self}: {uid} failed before any audio ({e}); retrying {where}")
            finally:
                if not pending.finished:
                    link.cancel(uid)
                link.forget(uid)

    async def _next(self, pending: Any, uid: str) -> Any:
        try:
            async with asyncio.timeout(self.response_timeout_s):
                return await pending.queue.get()
        except TimeoutError:
            raise ServerUnavailableError(
                f"{uid}: no answer from the speech server for {self.response_timeout_s:g} s"
            ) from None

    async def abort(self, request_id: str) -> int:
        """Cancel the open utterances started with ``request_id``; returns how many."""
        prefix = _UNSAFE_ID.sub("_", request_id)[:_ID_PREFIX] + "-"
        hits = 0
        for link in self._links:
            for uid, pending in list(link.pending.items()):
                if uid.startswith(prefix) and not pending.finished:
                    link.cancel(uid)
                    hits += 1
        return hits
