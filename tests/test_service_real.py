"""VeenaTTSService on the real engine (vLLM CPU on the demo checkpoint, torch BiCodec) through
real Pipecat pipelines: frame order, rates, interruptions under load, concurrency, settings,
errors, and the WAV example and ``say`` command as users run them."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.metrics.metrics import (
    ProcessingMetricsData,
    TTFAMetricsData,
    TTFBMetricsData,
    TTSUsageMetricsData,
)
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test
from recording import RecordingGenerator

from pipecat_veena.audio import read_wav
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import GenerationError
from pipecat_veena.normalize import normalize
from pipecat_veena.service import VeenaTTSService

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parent.parent


@pytest_asyncio.fixture(scope="module")
async def engine(spark_tiny_checkpoint, spark_generator):
    recorder = RecordingGenerator(spark_generator)
    engine = VeenaEngine(EngineConfig(checkpoint=spark_tiny_checkpoint), generator=recorder)
    await engine.start()
    yield engine
    await engine.shutdown()


def _audio(frames) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame)]


def _semantics(engine: VeenaEngine, context_id: str) -> int:
    ids = engine._format.ids
    outputs = engine._generator.outputs
    return sum(
        1
        for rid, out in outputs.items()
        if rid.startswith(f"{context_id}-")
        for t in out
        if 0 <= t - ids.semantic_base < ids.num_semantic_codes
    )


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
async def test_speak_frame_order_rates_and_length(engine, rate):
    down, up = await run_test(
        VeenaTTSService(engine, seed=5),
        frames_to_send=[TTSSpeakFrame("नमस्ते! Your order has shipped.")],
        pipeline_params=PipelineParams(audio_out_sample_rate=rate),
    )
    types = [type(f) for f in down]
    assert types.index(TTSStartedFrame) < types.index(TTSAudioRawFrame)
    assert types.index(TTSAudioRawFrame) < types.index(TTSTextFrame) < types.index(TTSStoppedFrame)
    audio = _audio(down)
    assert {f.sample_rate for f in audio} == {rate}
    (context_id,) = {f.context_id for f in audio}
    samples = sum(len(f.audio) for f in audio) // 2
    expected = _semantics(engine, context_id) * 320 * rate / 16000
    assert samples == pytest.approx(expected, abs=2)
    assert not [f for f in up if isinstance(f, ErrorFrame)]


async def test_llm_turn_is_one_context_with_all_its_audio(engine):
    down, _ = await run_test(
        VeenaTTSService(engine),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello there. "),
            LLMTextFrame("Aapka appointment "),
            LLMTextFrame("kal hai। "),
            LLMTextFrame("Thank you!"),
            LLMFullResponseEndFrame(),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=24000),
    )
    audio = _audio(down)
    (context_id,) = {f.context_id for f in audio}
    samples = sum(len(f.audio) for f in audio) // 2
    assert samples == pytest.approx(_semantics(engine, context_id) * 320 * 1.5, abs=6)
    assert [type(f) for f in down].count(TTSStartedFrame) == 1


class _TracingTTS(VeenaTTSService):
    """Records, at each InterruptionFrame it handles, every context created before it, so a
    test can tell late audio from a context interrupted before its first audio (such a context
    has no TTSStartedFrame or audio downstream to remember it by)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.created: list[str] = []
        self.before_interruption: list[set[str]] = []

    async def on_turn_context_created(self, context_id: str) -> None:
        await super().on_turn_context_created(context_id)
        self.created.append(context_id)

    async def process_frame(self, frame, direction) -> None:
        if isinstance(frame, InterruptionFrame):
            self.before_interruption.append(set(self.created))
        await super().process_frame(frame, direction)


async def test_fifty_interruptions_across_concurrent_pipelines(engine):
    """Interruptions at random moments, many before any audio: no audio of an interrupted
    context ever follows its interruption, nothing keeps generating, the last answer plays."""
    rng = random.Random(7)
    long_text = "This is a long answer that keeps going so that it can be interrupted. " * 2

    async def pipeline(index: int):
        frames = []
        for turn in range(10):
            # every third interruption comes right away, before the first audio
            pause = rng.uniform(0.0, 0.03) if turn % 3 == 0 else rng.uniform(0.05, 0.6)
            frames += [TTSSpeakFrame(long_text), SleepFrame(pause), InterruptionFrame()]
        frames += [SleepFrame(0.2), TTSSpeakFrame("And now the last answer.")]
        tts = _TracingTTS(engine, seed=index)
        down, up = await run_test(
            tts,
            frames_to_send=frames,
            pipeline_params=PipelineParams(audio_out_sample_rate=16000),
        )
        return tts, down, up

    results = await asyncio.gather(*(pipeline(i) for i in range(5)))
    assert engine.stats()["unfinished_requests"] == 0
    assert engine.stats()["active_streams"] == 0
    silent_interrupted = 0
    for tts, down, up in results:
        assert len(tts.before_interruption) == 10
        interruptions = iter(tts.before_interruption)
        interrupted: set[str] = set()
        spoke: set[str] = set()
        for frame in down:
            if isinstance(frame, InterruptionFrame):
                before = next(interruptions)
                silent_interrupted += len(before - interrupted - spoke)
                interrupted |= before
            elif isinstance(frame, TTSAudioRawFrame):
                assert frame.context_id not in interrupted, "audio after its interruption"
                spoke.add(frame.context_id)
        last = down[max(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame)) :]
        tail_audio = _audio(last)
        assert tail_audio, "the utterance after the interruptions did not play"
        tail_context = tts.created[-1]  # the last answer's
        # An InterruptionFrame is a system frame: it may overtake a TTSSpeakFrame sent a few ms
        # before it, whose context then opens after the interruption and plays (never one that
        # existed when the interruption was handled).
        early = {f.context_id for f in tail_audio} - {tail_context}
        assert not early & tts.before_interruption[-1], "audio after its interruption"
        tail = sum(len(f.audio) for f in tail_audio if f.context_id == tail_context) // 2
        assert tail == _semantics(engine, tail_context) * 320
        assert not [f for f in up if isinstance(f, ErrorFrame)]
    assert silent_interrupted >= 5, "too few contexts were interrupted before their audio"


async def test_metrics_on_the_real_engine(engine):
    """TTFB, TTFA (the first audible sample of the real codec's audio), processing and usage."""
    down, _ = await run_test(
        VeenaTTSService(engine, seed=3),
        frames_to_send=[TTSSpeakFrame("Metrics, please.")],
        pipeline_params=PipelineParams(
            audio_out_sample_rate=16000, enable_metrics=True, enable_usage_metrics=True
        ),
    )
    data = [d for f in down if isinstance(f, MetricsFrame) for d in f.data]
    by_kind = {type(d): d for d in data if getattr(d, "value", 1)}
    for kind in (TTFBMetricsData, TTFAMetricsData, ProcessingMetricsData, TTSUsageMetricsData):
        assert kind in by_kind, f"no {kind.__name__}"
    ttfa = by_kind[TTFAMetricsData]
    assert ttfa.ttfa >= ttfa.ttfb > 0
    assert ttfa.ttfb == pytest.approx(by_kind[TTFBMetricsData].value)
    assert by_kind[TTSUsageMetricsData].value == len("Metrics, please.")


async def test_sixteen_concurrent_pipelines_get_their_own_audio(engine):
    texts = [f"Pipeline {i} confirms booking {2000 + i}." for i in range(16)]

    async def one(i: int):
        down, _ = await run_test(
            VeenaTTSService(engine, seed=100 + i),
            frames_to_send=[TTSSpeakFrame(texts[i])],
            pipeline_params=PipelineParams(audio_out_sample_rate=16000),
        )
        audio = _audio(down)
        (context_id,) = {f.context_id for f in audio}
        return context_id, sum(len(f.audio) for f in audio) // 2

    results = await asyncio.gather(*(one(i) for i in range(16)))
    outputs = engine._generator.outputs
    prompts = engine._generator.prompts
    for i, (context_id, samples) in enumerate(results):
        assert samples == _semantics(engine, context_id) * 320 > 0
        rid = next(r for r in prompts if r.startswith(f"{context_id}-"))
        text_ids = engine._format.encoder.user_text(normalize(texts[i]))  # digits as words
        prompt = prompts[rid]
        assert any(prompt[k : k + len(text_ids)] == text_ids for k in range(len(prompt)))
        assert outputs[rid]
    assert engine.stats()["unfinished_requests"] == 0


async def test_settings_unknown_voice_and_empty_text(engine):
    tts = VeenaTTSService(engine)
    down, up = await run_test(
        tts,
        frames_to_send=[
            TTSSpeakFrame("   "),
            TTSUpdateSettingsFrame(delta=VeenaTTSService.Settings(voice="nobody")),
            TTSUpdateSettingsFrame(delta=VeenaTTSService.Settings(voice="male", speed="high")),
            TTSSpeakFrame("Speaking as the fast male voice."),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "unknown voice 'nobody'" in errors[0]
    assert [type(f) for f in down].count(TTSStartedFrame) == 1
    assert _audio(down)
    assert "male:moderate:high" in engine.stats()["pinned_voices"]


class _FailingGenerator(RecordingGenerator):
    """The real generator, with a fault injected once ``fail_after`` tokens of the first request
    have been generated (counted in tokens: vLLM merges deltas when the reader lags)."""

    def __init__(self, inner, fail_after: int) -> None:
        super().__init__(inner)
        self.fail_after = fail_after
        self.failed = False

    async def generate(self, prompt_ids, options, request_id):
        count = 0
        async with aclosing(super().generate(prompt_ids, options, request_id)) as deltas:
            async for delta in deltas:
                count += len(delta.token_ids)
                if not self.failed and count > self.fail_after:
                    self.failed = True
                    raise GenerationError("injected: the LLM request failed mid-utterance")
                yield delta


async def test_engine_error_mid_utterance_then_next_utterance_plays(
    spark_tiny_checkpoint, spark_generator
):
    # first audio after about 55 tokens (32 globals, markers, 20 semantics): the fault comes
    # soon after, long before the end of the 200 or so semantics the text asks for
    failing = _FailingGenerator(spark_generator, fail_after=75)
    engine = VeenaEngine(
        EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False), generator=failing
    )
    await engine.start()
    try:
        tts = VeenaTTSService(engine, seed=11)
        down, up = await run_test(
            tts,
            frames_to_send=[
                TTSSpeakFrame("The first answer fails half way, long after its audio started."),
                SleepFrame(0.5),
                TTSSpeakFrame("The second answer plays."),
            ],
            pipeline_params=PipelineParams(audio_out_sample_rate=16000),
        )
        assert failing.failed, "the first utterance ended before the fault"
        errors = [f for f in up if isinstance(f, ErrorFrame)]
        assert len(errors) == 1 and "failed mid-utterance" in errors[0].error
        contexts = [f.context_id for f in _audio(down)]
        assert len(set(contexts)) == 2  # audio from both utterances
        assert engine.stats()["unfinished_requests"] == 0
    finally:
        await engine.shutdown()


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_say_command_writes_a_wav_of_the_asked_rate(tmp_path, spark_tiny_checkpoint):
    out = tmp_path / "hello.wav"
    result = _run(
        [
            sys.executable, "-m", "pipecat_veena.cli", "say", "नमस्ते! Welcome to the demo.",
            "-o", str(out), "--model", str(spark_tiny_checkpoint), "--sample-rate", "8000",
        ]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    samples, rate = read_wav(out)
    assert rate == 8000 and len(samples) > 0 and np.abs(samples).max() > 0
    assert "first audio after" in result.stdout and "real-time factor" in result.stdout
    # vLLM's start-up warnings (no Triton, raw prompts, tokenizer-less EOS) are not for users
    for noise in ("Triton", "raw prompts", "EOS token", "WARNING", "Traceback"):
        assert noise not in result.stderr, result.stderr[-2000:]


def test_say_command_errors_are_one_line(tmp_path, spark_tiny_checkpoint):
    """A missing checkpoint or an unknown voice: one line naming the problem, exit status 2,
    before any engine starts."""
    for extra, expected in (
        (["--model", str(tmp_path / "nowhere")], "does not exist"),
        (["--model", str(spark_tiny_checkpoint), "--voice", "robot"], "unknown voice 'robot'"),
    ):
        result = _run([sys.executable, "-m", "pipecat_veena.cli", "say", "hi", *extra])
        assert result.returncode == 2, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and expected in lines[0], result.stderr[-2000:]


def test_wav_bot_example_runs_on_the_demo_checkpoint(tmp_path, spark_tiny_checkpoint):
    result = _run(
        [
            sys.executable, str(ROOT / "examples" / "wav_bot.py"),
            "--model", str(spark_tiny_checkpoint), "--out-dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    wavs = sorted(tmp_path.glob("call*.wav"))
    assert len(wavs) == 3
    for wav in wavs:
        samples, rate = read_wav(wav)
        assert rate == 16000 and len(samples) > 0
