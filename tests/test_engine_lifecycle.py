"""Engine lifecycle with fake parts: one start for many callers, failed starts release what they
started, shutdown under streams, restart, the thread-hosted engine's shutdown under a reader,
and the unguarded-script check. The real-vLLM forms are in test_generation_lifecycle.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine_thread import EngineThread
from pipecat_veena.errors import EngineNotRunningError, MalformedStreamError
from pipecat_veena.streaming import StreamConfig

IDS = spark_ids()
VOICE = list(range(40, 72))
ROOT = Path(__file__).resolve().parent.parent


class _CountingGenerator(ScriptedGenerator):
    """A scripted generator that counts its starts and shutdowns."""

    def __init__(self, script, **kwargs) -> None:
        super().__init__(script, **kwargs)
        self.starts = 0
        self.shutdowns = 0

    async def start(self) -> None:
        self.starts += 1
        await asyncio.sleep(0.05)  # long enough for a second caller to arrive meanwhile
        await super().start()

    async def shutdown(self) -> None:
        self.shutdowns += 1
        await super().shutdown()


class _CountingCodec(FakeBiCodec):
    """Counts how often the engine would load it (constructions)."""

    loads = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).loads += 1


def _config(tmp_path, **kwargs) -> EngineConfig:
    return EngineConfig(
        checkpoint=make_checkpoint(tmp_path),
        warmup=kwargs.pop("warmup", False),
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
        **kwargs,
    )


async def test_concurrent_starts_start_once(tmp_path, monkeypatch):
    _CountingCodec.loads = 0
    monkeypatch.setattr(
        "pipecat_veena.engine.core.load_codec", lambda layout, cfg: _CountingCodec()
    )
    generator = _CountingGenerator(well_formed(IDS, voice_globals=VOICE, semantics=8))
    engine = VeenaEngine(_config(tmp_path), generator=generator)
    await asyncio.gather(*(engine.start() for _ in range(5)))
    assert engine.is_running
    assert generator.starts == 1 and _CountingCodec.loads == 1
    batcher = engine._batcher
    await engine.start()  # running: nothing happens
    assert engine._batcher is batcher
    await engine.shutdown()


async def test_a_cancelled_caller_does_not_cancel_the_start_for_others(tmp_path):
    generator = _CountingGenerator(well_formed(IDS, voice_globals=VOICE, semantics=8))
    engine = VeenaEngine(_config(tmp_path), generator=generator, codec=FakeBiCodec())
    first = asyncio.ensure_future(engine.start())
    second = asyncio.ensure_future(engine.start())
    await asyncio.sleep(0.01)
    first.cancel()
    await second
    assert engine.is_running and generator.starts == 1
    await engine.shutdown()


async def test_failed_warmup_releases_everything(tmp_path):
    """The warm-up fails (the model produces no audio): start() raises, and nothing it started
    is left running: is_running is False and the generator was shut down."""

    class _Owned(_CountingGenerator):
        pass

    generator = _Owned(lambda prompt, options: [IDS.eos])  # no speech at all
    engine = VeenaEngine(_config(tmp_path, warmup=True), generator=generator, codec=FakeBiCodec())
    engine._owns_generator = True  # as if the engine had built it from the checkpoint
    with pytest.raises(MalformedStreamError, match="voice prefix"):
        await engine.start()
    assert not engine.is_running
    assert generator.shutdowns == 1 and not generator.is_running
    assert engine._batcher is None


async def test_shutdown_under_streams_is_a_clear_error_and_restart_works(tmp_path):
    script = well_formed(IDS, voice_globals=VOICE, semantics=5000)
    generator = ScriptedGenerator(script, delay=0.002)
    engine = VeenaEngine(_config(tmp_path), generator=generator, codec=FakeBiCodec())
    await engine.start()
    got_audio = asyncio.Event()

    async def listen():
        async for _ in engine.stream("A long answer that is still being spoken."):
            got_audio.set()

    listeners = [asyncio.ensure_future(listen()) for _ in range(3)]
    await got_audio.wait()
    await engine.shutdown()
    results = await asyncio.gather(*listeners, return_exceptions=True)
    for result in results:
        assert isinstance(result, EngineNotRunningError), result
        assert "shut down while this utterance was in flight" in str(result)
    assert generator.num_unfinished() == 0
    with pytest.raises(EngineNotRunningError, match="start"):
        await anext(engine.stream("Hello."))
    await engine.start()  # a restart serves again
    pcm = b"".join([c.pcm async for c in engine.stream("Hello.", seed=1)])
    assert pcm
    await engine.shutdown()


async def test_engine_thread_shutdown_ends_a_reader_in_another_loop(tmp_path):
    """A stream read from this loop while the hosting thread shuts down ends with a clear
    error instead of waiting for ever."""
    script = well_formed(IDS, voice_globals=VOICE, semantics=5000)
    engine = VeenaEngine(
        _config(tmp_path), generator=ScriptedGenerator(script, delay=0.005), codec=FakeBiCodec()
    )
    host = EngineThread.launch(engine)
    stream = host.stream("A long answer.")
    await anext(stream)

    async def read_rest():
        async for _ in stream:
            pass

    reader = asyncio.ensure_future(read_rest())
    await asyncio.sleep(0.05)
    await host.shutdown()
    with pytest.raises(EngineNotRunningError, match="shut down"):
        async with asyncio.timeout(10):
            await reader


def test_unguarded_script_gets_a_clear_error_before_any_engine_starts(tmp_path):
    script = tmp_path / "bot.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio
            from pipecat_veena.generation.vllm_local import VllmGenerator

            asyncio.run(VllmGenerator("/nonexistent-but-irrelevant").start())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode != 0
    assert "EngineStartError" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr and f"{script}:5" in done.stderr
    assert "Engine core initialization failed" not in done.stderr


def test_guarded_script_passes_the_check(tmp_path):
    script = tmp_path / "bot.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio
            from pipecat_veena.generation.vllm_local import check_spawn_safe

            async def main():
                check_spawn_safe()
                print("ok")

            if __name__ == "__main__":
                asyncio.run(main())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
