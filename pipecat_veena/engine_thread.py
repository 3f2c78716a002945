"""EngineThread: a VeenaEngine on a thread and event loop of its own, callable from any loop.

vLLM binds an engine to the event loop it started in. Hosts that create their event loops
after loading models (LiveKit workers run a synchronous prewarm function, then give each job a
new loop) start the engine here once per process and stream from it in every loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from loguru import logger

from pipecat_veena.engine import AudioChunk, EngineConfig, VeenaEngine
from pipecat_veena.errors import EngineNotRunningError
from pipecat_veena.generation.vllm_local import check_spawn_safe, install_exit_hooks
from pipecat_veena.tasks import cancel_and_wait


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


class EngineThread:
    """A VeenaEngine served by a thread with its own event loop, usable from any event loop.

    vLLM binds an engine to the loop it started in, but a LiveKit worker runs its prewarm
    function before any event loop exists and gives each job a new loop. Launch the engine
    here once per process; every job's ``VeenaTTS`` then streams from it. Closing a stream
    returns only once its engine request is aborted.

    Args:
        engine: the engine to host (not started yet, or started in this host's loop).
    """

    def __init__(self, engine: VeenaEngine) -> None:
        self.engine = engine
        self._producers: set[asyncio.Task[None]] = set()  # touched in the engine's loop only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="veena-engine")
        self._thread.daemon = True
        self._thread.start()

    def __str__(self) -> str:
        return f"EngineThread({self.engine})"

    @classmethod
    def launch(
        cls, engine: VeenaEngine | EngineConfig, *, timeout: float | None = None
    ) -> EngineThread:
        """Start ``engine`` (or one built from a config) on a new thread; blocks until loaded.

        Call it from the main thread (LiveKit's prewarm runs there): the SIGTERM handler that
        ends vLLM's engine process with this one can only be installed from the main thread.
        """
        check_spawn_safe()
        if not install_exit_hooks():
            logger.warning(
                "EngineThread.launch() ran outside the main thread: no SIGTERM handler could be "
                "installed, so a SIGTERM would leave vLLM's engine process running; launch it "
                "from the main thread or call EngineThread.close() on shutdown"
            )
        host = cls(engine if isinstance(engine, VeenaEngine) else VeenaEngine(engine))
        try:
            host.run(host.engine.start(), timeout=timeout)
        except BaseException:
            host.close()
            raise
        return host

    def run(self, coro: Coroutine[Any, Any, Any], *, timeout: float | None = None) -> Any:
        """Run ``coro`` in the engine's loop and wait for it (blocking: not from that loop)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("EngineThread.run() would deadlock inside the engine's own loop")
        self._check_alive(coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self._check_alive(coro)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _check_alive(self, coro: Coroutine[Any, Any, Any] | None = None) -> None:
        if not self._thread.is_alive():
            if coro is not None:
                coro.close()
            raise EngineNotRunningError(f"{self} was shut down; launch a new one")

    # -- the engine's surface ------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        """The hosted engine's load-time settings."""
        return self.engine.config

    @property
    def model_name(self) -> str:
        """The hosted engine's checkpoint name."""
        return self.engine.model_name

    @property
    def is_running(self) -> bool:
        """True while the hosted engine serves."""
        return self._thread.is_alive() and self.engine.is_running

    @property
    def sample_rate(self) -> int:
        """Rate of the emitted audio (the codec's)."""
        return self.engine.sample_rate

    @property
    def voices(self) -> list[str]:
        """Voice names of the loaded checkpoint."""
        return self.engine.voices

    @property
    def times_words(self) -> bool:
        """Whether the hosted engine's chunks carry word timings (they pass through as they are)."""
        return self.engine.times_words

    @property
    def emotion_tags(self) -> tuple[str, ...]:
        """Inline tags the hosted model understands."""
        return self.engine.emotion_tags

    def check_voice(self, voice: str | None) -> str:
        """Canonical name of ``voice`` (raises UnknownVoiceError)."""
        return self.engine.check_voice(voice)

    def check_options(self, **options: Any) -> None:
        """Raise ValueError when request options cannot work."""
        self.engine.check_options(**options)

    def stats(self) -> dict[str, Any]:
        """The engine's live counters, read in its own loop."""
        return self.run(_result_of(self.engine.stats))

    async def start(self) -> None:
        """Start the hosted engine (idempotent)."""
        await self._call(self.engine.start())

    async def abort(self, request_id: str) -> int:
        """Abort the hosted engine's streams started with ``request_id``."""
        return await self._call(self.engine.abort(request_id))

    async def stream(
        self, text: str, voice: str | None = None, *, request_id: str | None = None, **sampling
    ) -> AsyncIterator[AudioChunk]:
        """``VeenaEngine.stream`` from the caller's loop; closing it aborts the request."""
        self._check_alive()
        caller = asyncio.get_running_loop()
        inbox: asyncio.Queue[AudioChunk | _End] = asyncio.Queue()
        finished = asyncio.Event()
        producer: list[asyncio.Task[None]] = []

        def post(item: AudioChunk | _End) -> None:
            caller.call_soon_threadsafe(inbox.put_nowait, item)

        async def produce() -> None:  # runs in the engine's loop
            end = _End()
            try:
                gen = self.engine.stream(text, voice, request_id=request_id, **sampling)
                async with aclosing(gen) as chunks:
                    async for chunk in chunks:
                        post(chunk)
            except asyncio.CancelledError:
                # the reader left (nobody waits) or the host is shutting down (the reader
                # must not wait for ever)
                end = _End(EngineNotRunningError(f"{self} shut down during this stream"))
                raise
            except Exception as e:
                end = _End(e)
            finally:
                with contextlib.suppress(RuntimeError):  # the caller's loop is gone
                    post(end)

        def spawn() -> None:  # runs in the engine's loop, before any cancel (FIFO)
            task = self._loop.create_task(produce())
            task.add_done_callback(lambda _: _set_threadsafe(caller, finished))
            task.add_done_callback(self._producers.discard)
            self._producers.add(task)
            producer.append(task)

        self._loop.call_soon_threadsafe(spawn)
        try:
            while not isinstance(item := await inbox.get(), _End):
                yield item
            if item.error is not None:
                raise item.error
        finally:
            with contextlib.suppress(RuntimeError):  # the host is closed: nothing left to stop
                self._loop.call_soon_threadsafe(lambda: producer[0].cancel())
                await finished.wait()

    async def shutdown(self) -> None:
        """Shut the engine down and stop the thread (idempotent)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Blocking ``shutdown`` (for exit hooks and scripts): open streams end first."""
        if self._thread.is_alive():
            self.run(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _stop(self) -> None:
        await cancel_and_wait(*self._producers)
        await self.engine.shutdown()


async def _result_of(fn: Any) -> Any:
    return fn()


def _set_threadsafe(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
        loop.call_soon_threadsafe(event.set)
