"""Voice enrolment through the real parts: espeak-ng speech, the demo Spark checkpoint's speaker
encoder and BiCodec, and the vLLM CPU engine speaking with the enrolled name."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from recording import RecordingGenerator
from speech import SENTENCE, espeak_wav
from tokenizers import Tokenizer

from pipecat_veena.audio import read_wav
from pipecat_veena.codecs.bicodec.random_semantic import (
    add_random_semantic_encoder,
    write_random_wav2vec2,
)
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR

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


async def test_transcript_mode_on_the_real_engine(
    spark_tiny_checkpoint: Path, spark_generator, tmp_path: Path
) -> None:
    """A copy of the demo checkpoint given semantic-encoder tensors and a random wav2vec2: the
    enrolled voice's prompt holds the transcript and the clip's semantic tokens, and vLLM
    continues them with speech. The shared demo checkpoint is not touched."""
    root = Path(shutil.copytree(spark_tiny_checkpoint, tmp_path / "spark-tiny"))
    add_random_semantic_encoder(root / "BiCodec", seed=3)
    write_random_wav2vec2(root / WAV2VEC2_DIR, hidden_size=64, seed=4)
    recorder = RecordingGenerator(spark_generator)
    config = EngineConfig(checkpoint=root, pin_voices=False, max_model_len=2048)
    engine = VeenaEngine(config, generator=recorder)
    await engine.start()
    try:
        wav = espeak_wav(tmp_path / "asha.wav", SENTENCE * 2, voice="en+f3", wpm=160, pitch=60)
        pcm, rate = read_wav(wav)
        start = time.perf_counter()
        voice = await engine.enroll_voice("asha", pcm, rate, transcript=SENTENCE * 2)
        print(f"transcript-mode enrolment (loads included): {time.perf_counter() - start:.2f} s")
        assert voice.transcript == " ".join((SENTENCE * 2).split())
        assert abs(len(voice.semantic) - 50 * len(pcm) / rate) <= 2

        ids = engine._format.ids
        recorder.prompts.clear()  # the warm-up's
        recorder.outputs.clear()
        chunks = [c async for c in engine.stream("Hello there, how are you?", voice="asha", seed=3)]
        audio = np.frombuffer(b"".join(c.pcm for c in chunks), "<i2")
        (rid,) = recorder.prompts
        prompt = recorder.prompts[rid]
        reference = [ids.marker("start_semantic_token"), *ids.semantic_ids(voice.semantic)]
        assert prompt[-len(reference) :] == reference  # the clip's semantics end the prompt
        decoded = Tokenizer.from_file(str(root / "LLM" / "tokenizer.json")).decode(
            prompt, skip_special_tokens=False
        )
        assert f"<|start_content|>{voice.transcript}Hello there" in decoded  # as Spark-TTS joins
        generated = recorder.outputs[rid]
        semantics = sum(1 for t in generated if 0 <= t - ids.semantic_base < ids.num_semantic_codes)
        assert semantics > 0 and len(audio) == 320 * semantics
        assert {c.sample_rate for c in chunks} == {16000}
        assert engine.export_voices()["enrolled"]["asha"]["semantic"] == list(voice.semantic)
    finally:
        await engine.shutdown()
