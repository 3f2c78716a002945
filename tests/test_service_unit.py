"""VeenaTTSService through real Pipecat pipelines (run_test) over an engine with fake parts.

The engine's generator and codec are the fakes of engine_fakes.py so that every frame and error
path can be scripted; test_service_real.py runs the same service on the real engine.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.service import VeenaTTSService
from pipecat_veena.streaming import StreamConfig

IDS = spark_ids()
VOICE = list(range(40, 72))


async def _engine(tmp_path, script=None, *, delay: float = 0.0) -> VeenaEngine:
    generator = ScriptedGenerator(script or well_formed(IDS, voice_globals=VOICE, semantics=50))
    generator.delay = delay
    cfg = EngineConfig(
        checkpoint=make_checkpoint(tmp_path),
        warmup=False,
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
    )
    engine = VeenaEngine(cfg, generator=generator, codec=FakeBiCodec())
    await engine.start()
    return engine


def _types(frames) -> list[type]:
    return [type(f) for f in frames]


def _audio(frames) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame)]


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
async def test_speak_frame_order_rate_and_length(tmp_path, rate):
    engine = await _engine(tmp_path)
    tts = VeenaTTSService(engine)
    down, up = await run_test(
        tts,
        frames_to_send=[TTSSpeakFrame("Hello world.")],
        pipeline_params=PipelineParams(audio_out_sample_rate=rate),
    )
    types = _types(down)
    started, stopped = types.index(TTSStartedFrame), types.index(TTSStoppedFrame)
    audio = _audio(down)
    first_audio = types.index(TTSAudioRawFrame)
    assert started < first_audio < types.index(TTSTextFrame) < stopped
    assert {f.sample_rate for f in audio} == {rate}
    samples = sum(len(f.audio) for f in audio) // 2
    assert samples == pytest.approx(50 * 320 * rate / 16000, abs=rate * 0.005)
    assert len({f.context_id for f in audio}) == 1
    sizes = [len(f.audio) for f in audio]
    assert sizes[0] < max(sizes)  # small first frames, larger later ones
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    await engine.shutdown()


async def test_llm_turn_is_one_context(tmp_path):
    engine = await _engine(tmp_path)
    down, _ = await run_test(
        VeenaTTSService(engine),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello there. "),
            LLMTextFrame("How are you today? "),
            LLMTextFrame("नमस्ते।"),
            LLMFullResponseEndFrame(),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    audio = _audio(down)
    assert len({f.context_id for f in audio}) == 1
    assert sum(len(f.audio) for f in audio) == 3 * 50 * 320 * 2
    assert _types(down).count(TTSStartedFrame) == 1
    assert _types(down).count(TTSTextFrame) == 3
    await engine.shutdown()


async def test_unspeakable_text_never_reaches_the_engine(tmp_path):
    engine = await _engine(tmp_path)
    down, up = await run_test(
        VeenaTTSService(engine),
        frames_to_send=[TTSSpeakFrame("**"), TTSSpeakFrame("<laugh>"), TTSSpeakFrame("Hi.")],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    assert engine._generator.prompts and len(engine._generator.prompts) == 1
    assert _types(down).count(TTSStartedFrame) == 1
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    await engine.shutdown()


async def test_settings_update_changes_voice_and_rejects_unknown(tmp_path):
    engine = await _engine(tmp_path)
    tts = VeenaTTSService(engine, voice="female")
    down, up = await run_test(
        tts,
        frames_to_send=[
            TTSUpdateSettingsFrame(delta=VeenaTTSService.Settings(voice="robot")),
            TTSSpeakFrame("Hi."),
            TTSUpdateSettingsFrame(
                delta=VeenaTTSService.Settings(voice="male", pitch="high", temperature=0.3)
            ),
            TTSSpeakFrame("Hi again."),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "unknown voice 'robot'" in errors[0]
    assert "female, male" in errors[0]
    assert len(_audio(down)) > 0
    assert tts.settings.voice == "male" and tts.settings.pitch == "high"
    opts = engine._generator.options
    assert opts[0].temperature == 0.8 and opts[1].temperature == 0.3
    assert engine.stats()["pinned_voices"] == ["female", "male:high:moderate"]
    await engine.shutdown()


async def test_engine_error_is_an_error_frame_and_the_next_utterance_plays(tmp_path):
    calls = []
    good = well_formed(IDS, voice_globals=VOICE, semantics=20)

    def flaky(prompt, options):
        calls.append(1)
        if len(calls) == 1:
            return [IDS.marker("start_global_token"), IDS.semantic_base]
        return good(prompt, options)

    engine = await _engine(tmp_path, flaky)
    down, up = await run_test(
        VeenaTTSService(engine),
        frames_to_send=[TTSSpeakFrame("Broken."), SleepFrame(0.1), TTSSpeakFrame("Fine.")],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert any("semantic token before the voice" in e.error for e in errors)
    assert not any(e.fatal for e in errors)
    assert sum(len(f.audio) for f in _audio(down)) == 20 * 320 * 2
    await engine.shutdown()


async def test_dead_engine_is_reported_once_as_permanent(tmp_path):
    engine = await _engine(tmp_path)
    await engine._generator.shutdown()  # the backend dies under the service
    tts = VeenaTTSService(engine)
    _, up = await run_test(
        tts,
        frames_to_send=[TTSSpeakFrame("One."), SleepFrame(0.1), TTSSpeakFrame("Two.")],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    errors = [f for f in up if isinstance(f, ErrorFrame) and "not running" in f.error]
    assert len(errors) == 1
    assert not tts.is_usable
    await engine.shutdown()


async def test_interruption_stops_generation_and_drops_stale_audio(tmp_path):
    script = well_formed(IDS, voice_globals=VOICE, semantics=2000)
    engine = await _engine(tmp_path, script, delay=0.002)
    down, _ = await run_test(
        VeenaTTSService(engine),
        frames_to_send=[
            TTSSpeakFrame("A very long answer that goes on."),
            SleepFrame(0.3),
            InterruptionFrame(),
            SleepFrame(0.2),
            TTSSpeakFrame("After."),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    types = _types(down)
    cut = types.index(InterruptionFrame)
    before = {f.context_id for f in _audio(down[:cut])}
    after = {f.context_id for f in _audio(down[cut:])}
    assert before and after and not before & after
    assert engine._generator.num_unfinished() == 0
    assert engine._generator.aborted
    await engine.shutdown()


async def test_unknown_voice_at_construction_lists_the_valid_ones(tmp_path):
    engine = await _engine(tmp_path)
    from pipecat_veena.errors import UnknownVoiceError

    with pytest.raises(UnknownVoiceError, match="female, male"):
        VeenaTTSService(engine, voice="robot")
    with pytest.raises(ValueError, match="pitch must be one of"):
        VeenaTTSService(engine, pitch="loud")
    await engine.shutdown()


async def test_many_concurrent_pipelines_get_their_own_audio(tmp_path):
    engine = await _engine(tmp_path, delay=0.001)

    async def one(i: int):
        down, _ = await run_test(
            VeenaTTSService(engine, voice="female" if i % 2 else "male"),
            frames_to_send=[TTSSpeakFrame(f"Call number {i}.")],
            pipeline_params=PipelineParams(audio_out_sample_rate=16000),
        )
        return b"".join(f.audio for f in _audio(down))

    results = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(len(r) == 50 * 320 * 2 for r in results)
    assert engine.stats()["active_streams"] == 0
    assert np.array_equal(np.frombuffer(results[1], "<i2"), np.frombuffer(results[3], "<i2"))
    await engine.shutdown()
