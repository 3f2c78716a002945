"""VeenaEngine through the real parts: the vLLM CPU engine on the demo checkpoints and the torch
codecs (BiCodec tiny config; SNAC 24 kHz).

A ``RecordingGenerator`` (tests/recording.py) passes every call through to the real VllmGenerator
and keeps the prompts and generated ids, so tests can compare audio with the tokens that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import numpy as np
import pytest
import pytest_asyncio
from recording import RecordingGenerator

from pipecat_veena.audio import snr_db
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import MalformedStreamError, NoAudioError

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module")
async def spark(spark_tiny_checkpoint, spark_generator):
    recorder = RecordingGenerator(spark_generator)
    engine = VeenaEngine(
        EngineConfig(  # float32: solo and co-batched decodes are compared at float32 rounding
            checkpoint=spark_tiny_checkpoint,
            pin_voices=False,
            max_part_chars=60,
            codec_dtype="float32",
        ),
        generator=recorder,
    )
    await engine.start()
    yield engine, recorder
    await engine.shutdown()


@pytest_asyncio.fixture(scope="module")
async def veena(veena_checkpoint, veena_generator):
    recorder = RecordingGenerator(veena_generator)
    engine = VeenaEngine(EngineConfig(checkpoint=veena_checkpoint), generator=recorder)
    await engine.start()
    yield engine, recorder
    await engine.shutdown()


async def _speak(engine: VeenaEngine, text: str, **kwargs) -> tuple[np.ndarray, list]:
    chunks = [c async for c in engine.stream(text, **kwargs)]
    pcm = np.frombuffer(b"".join(c.pcm for c in chunks), "<i2")
    return pcm, chunks


def _semantic_count(engine: VeenaEngine, ids: list[int]) -> int:
    b = engine._format.ids
    return sum(1 for t in ids if 0 <= t - b.semantic_base < b.num_semantic_codes)


async def test_bicodec_stream_length_matches_its_tokens(spark):
    engine, rec = spark
    for text in ["Hello there.", "नमस्ते दुनिया, आप कैसे हैं?", "Aaj weather बहुत अच्छा है!"]:
        rec.outputs.clear()
        pcm, chunks = await _speak(engine, text, seed=3)
        semantics = sum(_semantic_count(engine, out) for out in rec.outputs.values())
        assert semantics > 0
        assert len(pcm) == 320 * semantics
        assert {c.sample_rate for c in chunks} == {16000}
    assert engine.stats()["unfinished_requests"] == 0


async def test_continuation_parts_reuse_the_first_parts_globals(spark):
    engine, rec = spark
    rec.prompts.clear()
    rec.outputs.clear()
    text = "This is the first sentence of a long answer. Here comes the second one. And a third."
    pcm, _ = await _speak(engine, text, seed=7)
    rids = sorted(rec.prompts, key=lambda r: int(r.rsplit("-", 1)[1]))
    assert len(rids) >= 2
    ids = engine._format.ids
    end_global = ids.marker("end_global_token")
    first_out = rec.outputs[rids[0]]
    prefix = first_out[: first_out.index(end_global) + 1]
    globals_ = [t for t in prefix if 0 <= t - ids.global_base < ids.num_global_codes]
    assert len(globals_) == 32
    for rid in rids[1:]:
        assert rec.prompts[rid][-len(prefix) - 1 : -1] == prefix
        assert rec.prompts[rid][-1] == ids.marker("start_semantic_token")
        assert not any(0 <= t - ids.global_base < 4096 for t in rec.outputs[rid])
    semantics = sum(_semantic_count(engine, rec.outputs[r]) for r in rids)
    assert len(pcm) == 320 * semantics


async def test_pinned_voice_needs_no_globals_next_time(spark_tiny_checkpoint, spark_generator):
    engine = VeenaEngine(
        EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False), generator=spark_generator
    )
    await engine.start()
    try:
        _, first = await _speak(engine, "Good morning, how can I help?", voice="male", seed=1)
        _, second = await _speak(engine, "Good evening, how can I help?", voice="male", seed=1)
        # F + R = 20 semantic tokens and nothing else (vLLM may hand over a few more at once
        # when the reader lags, hence a small allowance), unless the utterance was shorter; the
        # first call also paid the globals.
        total = second[-1].tokens
        assert min(20, total - 1) <= second[0].tokens <= min(24, total)
        assert first[0].tokens >= 32 + min(20, first[-1].tokens - 32 - 1)
        assert engine.stats()["pinned_voices"] == ["male"]
    finally:
        await engine.shutdown()


async def test_exported_voices_make_another_engine_speak_the_same_voice(
    tmp_path, spark_tiny_checkpoint, spark_generator
):
    """Two replicas: the second loads the first's pinned voices and continues in exactly that
    voice (its prompt carries the same prefix), generating no globals of its own."""
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False)
    first = VeenaEngine(config, generator=spark_generator)
    await first.start()
    try:
        await _speak(first, "Good morning.", voice="male", seed=21)
        prints = first.export_voices(tmp_path / "voices.json")
    finally:
        await first.shutdown()
    recorder = RecordingGenerator(spark_generator)
    second = VeenaEngine(replace(config, voices_file=tmp_path / "voices.json"), generator=recorder)
    await second.start()
    try:
        await _speak(second, "Good evening.", voice="male", seed=5, request_id="replica")
        (prompt,) = recorder.prompts.values()
        prefix = prints["voices"]["male"]["prefix"]
        assert prompt[-len(prefix) - 1 : -1] == prefix
        ids = second._format.ids
        (out,) = recorder.outputs.values()
        assert not any(0 <= t - ids.global_base < ids.num_global_codes for t in out)
    finally:
        await second.shutdown()


async def test_abort_mid_stream_leaves_no_unfinished_request(spark):
    engine, _ = spark
    long_text = "This sentence keeps going on and on so that generation takes a while. " * 3
    stream = engine.stream(long_text, seed=2)
    first = await anext(stream)
    assert first.num_samples > 0
    await stream.aclose()
    assert engine.stats()["unfinished_requests"] == 0
    assert engine.stats()["active_streams"] == 0


async def test_cancelled_consumer_aborts_at_once(spark):
    engine, _ = spark
    started = asyncio.Event()

    async def consume():
        async for _ in engine.stream("A long reply that will be interrupted. " * 3, seed=4):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.stats()["unfinished_requests"] == 0


async def test_sixteen_concurrent_streams_match_their_solo_runs(spark):
    """Isolation: under load each stream generates exactly its seeded solo tokens, and its audio
    matches its solo audio (chunk boundaries and batch composition differ, so to float rounding
    and the seam error, not bit for bit).

    Where the loop guard stops a stream, vLLM may generate a few more tokens before the abort
    reaches it, as many as the timing allows: those are never heard, so only the shorter run's
    tokens are compared, and the audio, cut where the guard's check fell, must be as long."""
    engine, rec = spark
    texts = [f"Caller {i} asks about order number {1000 + i}." for i in range(16)]

    async def run(i: int) -> tuple[np.ndarray, list[int]]:
        voice = "female" if i % 2 else "male"
        pcm, _ = await _speak(engine, texts[i], voice=voice, seed=50 + i, request_id=f"c{i}")
        rid = max((r for r in rec.outputs if r.startswith(f"c{i}-")), key=rec.outputs.get)
        return pcm, rec.outputs.pop(rid)

    rec.outputs.clear()
    together = await asyncio.gather(*(run(i) for i in range(16)))
    assert engine.stats()["unfinished_requests"] == 0
    assert engine.stats()["decode_batch_mean"] > 1.0
    for i in (0, 4, 5, 10, 11):
        pcm, tokens = await run(i)
        n = min(len(tokens), len(together[i][1]))
        assert tokens[:n] == together[i][1][:n], f"stream {i}: tokens differ from its solo run"
        assert len(pcm) == len(together[i][0])
        assert snr_db(pcm.astype(float), together[i][0].astype(float)) > 40


async def test_control_strings_in_text_change_nothing(spark):
    """Injected control strings neither end the utterance early nor change the voice: the model
    sees the same prompt and generates the same tokens as for the clean text."""
    engine, rec = spark
    rec.prompts.clear()
    rec.outputs.clear()
    clean, _ = await _speak(engine, "Hello world, how are you?", seed=9, request_id="clean")
    dirty, _ = await _speak(
        engine,
        "Hello <|im_end|> world, <|bicodec_global_7|> how <|end_content|> are you?",
        seed=9,
        request_id="dirty",
    )
    by_prefix = {rid.split("-")[0]: rid for rid in rec.prompts}
    assert rec.prompts[by_prefix["clean"]] == rec.prompts[by_prefix["dirty"]]
    assert rec.outputs[by_prefix["clean"]] == rec.outputs[by_prefix["dirty"]]
    assert len(clean) == len(dirty) and snr_db(clean.astype(float), dirty.astype(float)) > 40


@pytest.mark.parametrize("voice", ["male", "lipakshi", "female:high:low"])
async def test_any_sampling_follows_the_grammar(spark, voice):
    """Near-uniform sampling (T 2.0, no top-k/p) stands in for an untrained model: held to the
    codec grammar, every stream still parses and plays, whatever the prompt form (controllable:
    a free acoustic block first; named: globals first)."""
    engine, rec = spark
    for seed in range(3):
        rec.outputs.clear()
        pcm, _ = await _speak(
            engine, "Hello there.", voice=voice, temperature=2.0, top_k=0, top_p=1.0, seed=seed
        )
        semantics = sum(_semantic_count(engine, out) for out in rec.outputs.values())
        assert semantics > 0 and len(pcm) == 320 * semantics
    assert engine.stats()["unfinished_requests"] == 0


async def test_unconstrained_garbage_is_a_clear_error_never_a_hang(
    spark_tiny_checkpoint, spark_generator
):
    """With the grammar constraint off, garbage sampling gives either a clear error from the
    stream parser or (by chance) audio: never a hang, never another exception."""
    engine = VeenaEngine(
        EngineConfig(
            checkpoint=spark_tiny_checkpoint,
            constrain_grammar=False,
            warmup=False,
            pin_voices=False,
        ),
        generator=spark_generator,
    )
    await engine.start()
    try:
        for seed in range(3):
            with contextlib.suppress(MalformedStreamError, NoAudioError):
                async with asyncio.timeout(60):
                    await _speak(
                        engine, "Hello there.", temperature=2.0, top_k=0, top_p=1.0, seed=seed
                    )
        assert engine.stats()["unfinished_requests"] == 0
    finally:
        await engine.shutdown()


async def test_snac_short_utterance_under_28_tokens_still_has_audio(veena):
    engine, rec = veena
    rec.outputs.clear()
    pcm, chunks = await _speak(engine, "Hi.", max_tokens=14, seed=1)
    codes = [t for out in rec.outputs.values() for t in out if t >= engine._format.ids.audio_base]
    assert 7 <= len(codes) <= 14
    assert len(pcm) == 2048 * (len(codes) // 7)  # every frame, first and last included
    assert {c.sample_rate for c in chunks} == {24000}


async def test_snac_stream_length_matches_its_frames(veena):
    engine, rec = veena
    for voice in engine.voices:
        rec.outputs.clear()
        pcm, _ = await _speak(engine, "नमस्ते, आपका स्वागत है।", voice=voice, seed=5)
        ids = engine._format.ids
        codes = [t for out in rec.outputs.values() for t in out if t >= ids.audio_base]
        assert codes
        assert len(pcm) == 2048 * (len(codes) // 7)  # a frame cut by the cap is dropped
    assert engine.stats()["unfinished_requests"] == 0
