"""What one speech server app shares: engine, settings, metrics, stream slots, drain state."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from pipecat_veena.errors import UnknownVoiceError
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.remote.protocol import SAMPLE_RATES, ErrorCode, ProtocolError
from pipecat_veena.resample import prepare_banks
from pipecat_veena.server.limits import StreamSlots
from pipecat_veena.server.metrics import ServerMetrics
from pipecat_veena.server.settings import OPENAI_FEMALE, OPENAI_VOICES, ServerSettings
from pipecat_veena.tasks import cancel_and_wait
from pipecat_veena.text import is_speakable


class Cancellable(Protocol):
    """What the server needs of a running utterance (``speech.SpeechRun``): a way to stop it."""

    cancel: Callable[[str], None]


#: What clients and probes are told about a failed start (the log and the CLI say why: the
#: exception's text has paths and backend internals).
START_FAILED = "the engine failed to start; the server's log says why"
#: A voice name with levels that every level-controllable (Spark) checkpoint accepts.
_LEVELS_PROBE = "female:moderate:moderate"
#: After a drain's streams ended, how long WebSocket connections get to send their last
#: messages and close themselves (code 1012) before the server closes what is left.
_CONNECTIONS_CLOSE_S = 5.0
#: How long cancelled streams get to end (a drain past its deadline, the app's close).
_CANCEL_GRACE_S = 5.0


def drain_bound_s(settings: ServerSettings) -> float:
    """The longest a drain takes: the deadline, then cancelling, then the connections' close.

    A host that stops the server (Kubernetes' grace period, Ray Serve's
    ``graceful_shutdown_timeout_s``) must allow this plus the engine's shutdown.
    """
    return settings.drain_timeout_s + _CANCEL_GRACE_S + _CONNECTIONS_CLOSE_S


class SpeechServer:
    """The state of one app: start, readiness, drain, and checks shared by both APIs.

    Args:
        engine: the engine to serve (started by ``launch()`` if it is not running).
        settings: limits, timeouts, keys.
        owns_engine: shut the engine down with the app (False when others share it).
        demo: the engine runs a demo checkpoint (random weights: sound, not words).
    """

    def __init__(
        self,
        engine: SpeechEngine,
        settings: ServerSettings,
        *,
        owns_engine: bool = True,
        demo: bool = False,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.owns_engine = owns_engine
        self.demo = demo
        self.metrics = ServerMetrics(engine, settings.max_streams)
        self.slots = StreamSlots(settings)
        self.ready = False
        self.draining = False
        self.failed: str | None = None
        self.voice_map: dict[str, str] = {}
        self.builtin_voices: set[str] = set()
        self.voice_levels = False
        self.tag = uuid.uuid4().hex[:6]
        self._ids = itertools.count(1)
        self._runs: set[Cancellable] = set()
        self._drain_watchers: set[Callable[[], None]] = set()
        self._no_watchers = asyncio.Event()
        self._no_watchers.set()
        self._start_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the engine in the background (``/health`` answers meanwhile, ``/ready`` not)."""
        if not self.settings.api_keys:
            logger.warning(
                "speech server: no API keys configured, anyone who can reach it may use it "
                "(pipecat-veena serve --api-key-file FILE)"
            )
        self._start_task = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        try:
            await self.engine.start()
            self._setup_voices()
            # every served rate's resampler bank, off the loop: no stream builds one on it
            await asyncio.to_thread(prepare_banks, self.engine.sample_rate, SAMPLE_RATES)
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            logger.error(f"speech server: the engine failed to start: {self.failed}")
            raise
        self.ready = True
        self.metrics.ready.set(1)
        logger.info(
            f"speech server: ready ({self.engine.model_name}, {self.engine.sample_rate} Hz, "
            f"voices {', '.join(self.engine.voices)})"
        )

    async def wait_started(self) -> None:
        """Return once the engine is ready; raises what made its start fail."""
        if self._start_task is None:
            raise RuntimeError("the app has not started (run it under an ASGI server)")
        await asyncio.shield(self._start_task)

    def _setup_voices(self) -> None:
        """The OpenAI names' map, and the names nobody may enrol.

        Never fails: a map naming a voice the engine lacks (an enrolled voice removed since) is
        a warning, and that alias answers ``unknown_voice`` saying why until the voice exists.
        """
        engine = self.engine
        try:
            engine.check_voice(_LEVELS_PROBE)
            self.voice_levels = True
        except (UnknownVoiceError, ValueError):
            self.voice_levels = False
        mapping = self.settings.voice_map
        if mapping is None:
            names = set(engine.voices)
            if {"female", "male"} <= names:
                mapping = {v: "female" if v in OPENAI_FEMALE else "male" for v in OPENAI_VOICES}
            else:
                mapping = {v: engine.voices[0] for v in OPENAI_VOICES}
        self.voice_map = {
            **{v: engine.voices[0] for v in OPENAI_VOICES},
            **{k.strip().lower(): v for k, v in mapping.items()},
        }
        enrolled = set(getattr(engine, "enrolled_voices", ()))
        self.builtin_voices = set(engine.voices) - enrolled
        for alias, target in sorted(self.voice_map.items()):
            try:
                self.voice_map[alias] = engine.check_voice(target)
            except (UnknownVoiceError, ValueError) as e:
                logger.warning(
                    f"speech server: voice map {alias}={target}: the engine has no voice "
                    f"{target!r} ({e}); {alias!r} answers unknown_voice until it has one"
                )
        reserve = getattr(engine, "reserve_voice_names", None)
        if reserve is not None:
            reserve(self.voice_map)

    async def close(self) -> None:
        """Cancel what is in flight and stop the engine if this app owns it."""
        self.ready = False
        self.metrics.ready.set(0)
        if self._start_task is not None:
            await cancel_and_wait(self._start_task)
        await self._cancel_all(ErrorCode.SERVER_DRAINING, grace_s=_CANCEL_GRACE_S)
        if self.owns_engine:
            await self.engine.shutdown()

    # -- drain -----------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Take no new streams from now on (``/ready`` answers 503); tell connections to go."""
        if self.draining:
            return
        logger.info(
            f"speech server: draining ({self.slots.active} streams in flight, "
            f"{len(self._drain_watchers)} WebSocket connections told to go)"
        )
        self.draining = True
        self.metrics.ready.set(0)
        for watcher in list(self._drain_watchers):
            watcher()

    def watch_drain(self, go_away: Callable[[], None]) -> None:
        """Call ``go_away`` when the drain begins (at once if it has); a connection's hook."""
        self._drain_watchers.add(go_away)
        self._no_watchers.clear()
        if self.draining:
            go_away()

    def unwatch_drain(self, go_away: Callable[[], None]) -> None:
        """Forget a closed connection's hook."""
        self._drain_watchers.discard(go_away)
        if not self._drain_watchers:
            self._no_watchers.set()

    async def drain(self, deadline_s: float | None = None) -> int:
        """Refuse new streams, let in-flight ones finish within ``deadline_s``, cancel the rest.

        Returns:
            How many streams had to be cancelled.
        """
        self.begin_drain()
        if deadline_s is None:
            deadline_s = self.settings.drain_timeout_s
        left = 0
        try:
            await asyncio.wait_for(self.slots.wait_idle(), deadline_s)
        except TimeoutError:
            left = len(self._runs)
            logger.warning(f"speech server: drain deadline passed; cancelling {left} streams")
            await self._cancel_all(ErrorCode.SERVER_DRAINING, grace_s=_CANCEL_GRACE_S)
        try:  # each connection closes itself once its last message is out
            await asyncio.wait_for(self._no_watchers.wait(), _CONNECTIONS_CLOSE_S)
        except TimeoutError:
            logger.warning(
                f"speech server: {len(self._drain_watchers)} WebSocket connections did not "
                f"close within {_CONNECTIONS_CLOSE_S:g} s of the drain; closing them"
            )
        return left

    async def _cancel_all(self, code: str, *, grace_s: float) -> None:
        for run in list(self._runs):
            run.cancel(code)
        try:
            await asyncio.wait_for(self.slots.wait_idle(), grace_s)
        except TimeoutError:
            logger.error(f"speech server: {self.slots.active} streams did not end when cancelled")

    # -- health ----------------------------------------------------------------------------
    def liveness(self) -> str | None:
        """Why this server is dead (None: alive): its engine failed to start, or stopped.

        An engine restarting its LLM backend (``VeenaEngine.state`` "restarting") is alive: a
        liveness probe must not kill a pod that is recovering (``/ready`` says 503 meanwhile).
        """
        if self.failed is not None:
            return START_FAILED
        if self.ready and not self.engine.is_running and not self.restarting:
            return "the engine stopped"
        return None

    @property
    def restarting(self) -> bool:
        """True while the engine restarts its dead LLM backend (an in-process ``VeenaEngine``)."""
        return getattr(self.engine, "state", None) == "restarting"

    async def wait_dead(self, poll_s: float = 0.5) -> str:
        """Return why, once this server is dead (``liveness``); ``serve`` then exits 1."""
        while (problem := self.liveness()) is None:  # noqa: ASYNC110 (any engine: polled)
            await asyncio.sleep(poll_s)
        return problem

    # -- per request -----------------------------------------------------------------------
    def availability(self) -> ProtocolError | None:
        """Why no new stream can start now (None: it can)."""
        if self.draining:
            return ProtocolError(
                ErrorCode.SERVER_DRAINING,
                "the server is shutting down and takes no new streams; use another server",
            )
        if self.failed is not None:
            return ProtocolError(ErrorCode.ENGINE_UNAVAILABLE, START_FAILED)
        if not self.ready:
            return ProtocolError(
                ErrorCode.SERVER_STARTING, "the engine is still loading; retry once /ready is 200"
            )
        if not self.engine.is_running:
            if self.restarting:
                return ProtocolError(
                    ErrorCode.ENGINE_UNAVAILABLE,
                    "the engine is restarting after its LLM backend died; retry in a few "
                    "seconds or on another server",
                )
            return ProtocolError(
                ErrorCode.ENGINE_UNAVAILABLE, "the engine stopped; the server needs a restart"
            )
        return None

    def resolve_voice(self, name: str | None, owner: str | None = None) -> str:
        """The engine voice for ``name``: a checkpoint voice, or an OpenAI name via the map.

        Args:
            name: the voice a request names (None: the default).
            owner: the caller (``limits.voice_owner``): another owner's enrolled voice is
                unknown to them. None: no owner check.

        Raises:
            ProtocolError: ``unknown_voice``, listing both kinds of names the caller may use.
        """
        engine = self.engine
        key = name.strip().lower() if isinstance(name, str) else None
        if key in self.voice_map and key not in self.builtin_voices:
            target = self.voice_map[key]
            try:
                return engine.check_voice(target)  # the operator's map: every caller's
            except UnknownVoiceError:
                raise ProtocolError(
                    ErrorCode.UNKNOWN_VOICE,
                    f"voice {key!r} maps to {target!r} on this server (its voice map), and "
                    f"{target!r} is no voice here now: send another voice, or ask the operator "
                    "to fix the map (pipecat-veena serve --voice-map)",
                ) from None
        try:
            if owner is not None and hasattr(engine, "voice_access"):  # an engine with owners
                return engine.check_voice(name, owner)
            return engine.check_voice(name)
        except UnknownVoiceError as e:
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"{e}; OpenAI voice names work too: {', '.join(OPENAI_VOICES)}",
            ) from None

    def voices_for(self, owner: str | None) -> tuple[list[str], dict[str, tuple[bool, bool]]]:
        """The voices a caller may use (default first), and its usable enrolled voices.

        Returns:
            (voice names, enrolled name -> (the caller may remove it, every caller may use it)).
            Another key's enrolled voice is in neither.
        """
        engine = self.engine
        access = getattr(engine, "voice_access", None)
        if access is None:  # an engine without owners: every enrolled voice is everyone's
            enrolled = {n: (False, True) for n in getattr(engine, "enrolled_voices", [])}
            return list(engine.voices), enrolled
        enrolled = access(owner)
        names = [n for n in engine.voices if n in enrolled or n in self.builtin_voices]
        return names, enrolled

    def check_text(self, text: str, ref: str | None = None) -> None:
        """Raise ``text_too_long`` for text over the cap."""
        limit = self.settings.max_text_chars
        if len(text) > limit:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"the text has {len(text)} characters, over this server's cap of {limit}; split "
                "it into several requests",
                ref,
            )

    def check_options(self, options: dict[str, Any], ref: str | None = None) -> None:
        """Raise ``bad_options`` when the engine cannot use ``options``."""
        try:
            self.engine.check_options(**options)
        except (ValueError, TypeError) as e:
            raise ProtocolError(ErrorCode.BAD_OPTIONS, f"bad sampling options: {e}", ref) from None

    @staticmethod
    def speakable(text: str) -> bool:
        """True when ``text`` has something to say (letters or digits outside markup)."""
        return is_speakable(text)

    def new_request_id(self, api: str) -> str:
        """A request id unique to this server (the engine's requests start with it)."""
        return f"{api}-{self.tag}-{next(self._ids)}"

    def register(self, run: Cancellable) -> None:
        """Track an accepted utterance (so a drain can cancel it)."""
        self._runs.add(run)

    def unregister(self, run: Cancellable) -> None:
        """Forget a finished utterance."""
        self._runs.discard(run)
