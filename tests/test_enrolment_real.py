"""Voice enrolment through the real parts: espeak-ng speech, the demo Spark checkpoint's speaker
encoder and BiCodec, and the vLLM CPU engine speaking with the enrolled name."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from recording import RecordingGenerator
from speech import SENTENCE, espeak_wav

from pipecat_veena.audio import read_wav
from pipecat_veena.engine import EngineConfig, VeenaEngine

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module")
async def spark(spark_tiny_checkpoint, spark_generator):
    recorder = RecordingGenerator(spark_generator)
    engine = VeenaEngine(
        EngineConfig(checkpoint=spark_tiny_checkpoint, pin_voices=False), generator=recorder
    )
    await engine.start()
    yield engine, recorder
    await engine.shutdown()


async def test_enrol_an_espeak_clip_and_speak_with_its_name(spark, tmp_path: Path) -> None:
    engine, recorder = spark
    wav = espeak_wav(tmp_path / "asha.wav", SENTENCE * 2, voice="en+f3", wpm=160, pitch=60)
    pcm, rate = read_wav(wav)  # int16 at 22050 Hz, about 10 s
    assert rate == 22050 and 8 < len(pcm) / rate < 14

    voice = await engine.enroll_voice("Asha", pcm, rate)
    start = time.perf_counter()
    again = await engine.enroll_voice("asha", pcm, rate)  # encoder loaded: the enrolment alone
    seconds = time.perf_counter() - start
    print(f"enrolment of a {len(pcm) / rate:.1f} s clip: {1000 * seconds:.0f} ms")
    assert again.globals == voice.globals and len(voice.globals) == 32
    assert "asha" in engine.voices

    ids = engine._format.ids
    recorder.prompts.clear()
    recorder.outputs.clear()
    chunks = [c async for c in engine.stream("Hello there, how are you?", voice="asha", seed=3)]
    audio = np.frombuffer(b"".join(c.pcm for c in chunks), "<i2")
    assert len(audio) > 0 and {c.sample_rate for c in chunks} == {16000}
    (rid,) = recorder.prompts
    prompt = recorder.prompts[rid]
    codes = list(ids.global_ids(voice.globals))
    at = prompt.index(codes[0])
    assert prompt[at : at + 32] == codes  # the enrolled voice is in the prompt
    generated = recorder.outputs[rid]
    assert not any(
        0 <= t - ids.global_base < ids.num_global_codes for t in generated
    )  # no globals generated
    semantics = sum(1 for t in generated if 0 <= t - ids.semantic_base < ids.num_semantic_codes)
    assert len(audio) == 320 * semantics

    other = await engine.enroll_voice("ravi", pcm[: rate * 5], rate)  # another clip, other codes
    assert other.globals != voice.globals
