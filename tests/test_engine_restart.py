"""The engine's supervisor on fakes: restart with backoff, bounded attempts, the states, and what
the server's probes say in each (the real vLLM engine killed: tests/test_engine_restart_real.py)."""

from __future__ import annotations

import asyncio

import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import EngineDeadError
from pipecat_veena.remote.protocol import ErrorCode
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.streaming import StreamConfig

IDS = spark_ids()
VOICE = list(range(40, 72))


def _generator(delay: float = 0.0) -> ScriptedGenerator:
    return ScriptedGenerator(well_formed(IDS, voice_globals=VOICE, semantics=400), delay=delay)


class _Builds:
    """Stands in for ``VeenaEngine._new_generator``: the first ``failures`` builds fail."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> ScriptedGenerator:
        self.calls += 1
        generator = _generator()
        if self.calls <= self.failures:

            async def broken() -> None:
                raise FileNotFoundError("LLM/config.json: no such file")

            generator.start = broken  # type: ignore[method-assign]
        return generator


async def _engine(tmp_path, builds: _Builds, **config) -> VeenaEngine:
    engine = VeenaEngine(
        EngineConfig(
            checkpoint=make_checkpoint(tmp_path),
            warmup=False,
            stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
            restart_backoff_s=0.01,
            **config,
        ),
        generator=_generator(delay=0.002),
        codec=FakeBiCodec(),
    )
    engine._owns_generator = True  # as when the engine builds its own vLLM
    engine._new_generator = builds  # type: ignore[method-assign]
    await engine.start()
    return engine


def _kill(engine: VeenaEngine) -> None:
    engine._generator._running = False  # what vLLM's engine process dying looks like


async def _audio(engine: VeenaEngine) -> int:
    return sum([len(c.pcm) async for c in engine.stream("Hello there.", seed=1)])


async def test_a_dead_backend_fails_what_is_in_flight_and_comes_back(tmp_path):
    builds = _Builds()
    engine = await _engine(tmp_path, builds)
    try:
        stream = engine.stream("A long sentence that is still being spoken. " * 3, seed=1)
        await anext(stream)
        _kill(engine)
        assert engine.state == "restarting"  # at once, before the watcher looked
        with pytest.raises(EngineDeadError) as caught:
            async for _ in stream:
                pass
        assert caught.value.retryable
        assert await asyncio.wait_for(engine.wait_running(), 10)
        assert engine.state == "running" and engine.restarts == 1 and builds.calls == 1
        assert await _audio(engine) > 0
    finally:
        await engine.shutdown()
    assert engine.state == "stopped"


async def test_restarts_back_off_then_give_up_and_a_new_start_works(tmp_path):
    builds = _Builds(failures=99)
    engine = await _engine(tmp_path, builds, restart_attempts=3)
    try:
        _kill(engine)
        assert not await asyncio.wait_for(engine.wait_running(), 10)
        assert engine.state == "failed" and builds.calls == 3
        with pytest.raises(EngineDeadError, match="could not be restarted") as refused:
            await _audio(engine)
        assert not refused.value.retryable
        builds.failures = 0
        await engine.start()  # starts afresh
        assert engine.state == "running" and await _audio(engine) > 0
    finally:
        await engine.shutdown()


async def test_a_backend_shut_down_on_purpose_is_not_restarted(tmp_path):
    """SIGTERM's handler (and the exit hook) shut vLLM down under a running engine: that is the
    process ending, not a death. A restart then would leave a new engine process orphaned
    (found by test_generation_lifecycle's thread-sigterm owner)."""
    builds = _Builds()
    engine = await _engine(tmp_path, builds)
    try:
        generator = engine._generator
        generator.shut_down = True  # what VllmGenerator.shutdown_sync marks
        _kill(engine)
        assert engine.state == "stopped"
        await asyncio.sleep(0.6)  # the watcher looks every 0.25 s
        assert engine.state == "stopped" and builds.calls == 0 and engine.restarts == 0
    finally:
        await engine.shutdown()


async def test_no_restart_attempts_fails_at_once(tmp_path):
    builds = _Builds()
    engine = await _engine(tmp_path, builds, restart_attempts=0)
    try:
        _kill(engine)
        assert not await asyncio.wait_for(engine.wait_running(), 10)
        assert engine.state == "failed" and builds.calls == 0
    finally:
        await engine.shutdown()


def test_restart_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="restart_attempts"):
        EngineConfig(checkpoint=tmp_path, restart_attempts=-1)
    with pytest.raises(ValueError, match="restart_backoff_s"):
        EngineConfig(checkpoint=tmp_path, restart_backoff_s=float("nan"))


class _StateEngine:
    """Just what the server's probes read of an engine."""

    def __init__(self, state: str) -> None:
        self.state = state

    @property
    def is_running(self) -> bool:
        return self.state == "running"


@pytest.mark.parametrize(
    ("state", "alive", "available"),
    [
        ("running", True, None),
        ("restarting", True, ErrorCode.ENGINE_UNAVAILABLE),
        ("failed", False, ErrorCode.ENGINE_UNAVAILABLE),
    ],
)
async def test_probes_through_a_restart(state, alive, available):
    server = SpeechServer(_StateEngine(state), ServerSettings())
    server.ready = True
    assert (server.liveness() is None) is alive
    problem = server.availability()
    assert (problem and problem.code) == available
    if state == "restarting":
        assert "restarting" in problem.message


def test_ray_replicas_leave_the_restart_to_serve(spark_tiny_checkpoint):
    """A Ray Serve replica's engine does not restart in place by default: its health check
    fails at once and Serve replaces the replica (tests/test_deploy_ray.py), as before."""
    from pipecat_veena.deploy.replica_args import ReplicaArgs

    model = str(spark_tiny_checkpoint)
    assert ReplicaArgs(model=model).engine_config().restart_attempts == 0
    chosen = ReplicaArgs(model=model, engine={"restart_attempts": 2}).engine_config()
    assert chosen.restart_attempts == 2
