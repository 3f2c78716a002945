"""docs/protocol.md's promise through the real parts (vLLM CPU engine, demo Spark checkpoint,
torch BiCodec): with a pinned voice the same text, voice and seed give the same audio, bit for
bit whatever the timing, the same tokens and chunks under load."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
from recording import RecordingGenerator

from pipecat_veena.audio import snr_db
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.generation.base import MAX_SEED, MAX_TOP_K

pytestmark = pytest.mark.vllm

TEXT = "The same text, voice and seed give the same audio, every single time."


@pytest_asyncio.fixture(scope="module")
async def engine(spark_tiny_checkpoint, spark_generator):
    # The warm-up pins the default voice (female). A large minimum buffer makes the hurry logic
    # (timing-driven smaller chunks) fire whenever it may: a seeded request must not feel it.
    # float32: the figures checked here are the float32 codec's (the CPU probe could pick
    # bfloat16, whose co-batched rounding is coarser: docs/protocol.md).
    engine = VeenaEngine(
        EngineConfig(checkpoint=spark_tiny_checkpoint, min_buffer_s=2.0, codec_dtype="float32"),
        generator=RecordingGenerator(spark_generator),
    )
    await engine.start()
    yield engine
    await engine.shutdown()


async def _speak(
    engine: VeenaEngine, text: str, *, delay_s: float = 0.0, **kwargs
) -> tuple[np.ndarray, list[int]]:
    """The utterance's samples and its chunk sizes (where its seams are)."""
    chunks = []
    async for chunk in engine.stream(text, **kwargs):
        chunks.append(chunk.pcm)
        if delay_s:  # a slow reader: vLLM's deltas pile up into bigger ones meanwhile
            await asyncio.sleep(delay_s)
    return np.frombuffer(b"".join(chunks), "<i2"), [len(c) // 2 for c in chunks]


def _differ(a: np.ndarray, b: np.ndarray) -> str:
    if len(a) != len(b):
        return f"lengths {len(a)} != {len(b)}"
    first = int(np.flatnonzero(a != b)[0])
    snr = snr_db(a.astype(float), b.astype(float))
    return f"first difference at sample {first}, SNR {snr:.1f} dB"


async def test_same_seed_same_audio_whatever_the_timing(engine):
    """A slow reader changes how vLLM groups tokens into deltas and when chunks are due; the
    seeded utterance's chunks, so its seams, so its audio stay the same, bit for bit."""
    recorder: RecordingGenerator = engine._generator
    recorder.outputs.clear()
    fast, fast_sizes = await _speak(engine, TEXT, voice="female", seed=11, request_id="fast")
    slow, slow_sizes = await _speak(
        engine, TEXT, voice="female", seed=11, delay_s=0.15, request_id="slow"
    )
    assert len(fast) > 0
    tokens = {name: [t for r, ids in recorder.outputs.items() if r.startswith(name) for t in ids]
              for name in ("fast", "slow")}  # fmt: skip
    if tokens["fast"] != tokens["slow"]:  # vLLM itself (docs/protocol.md: not promised)
        pytest.xfail("vLLM generated different tokens for the same seed (prefix cache?)")
    assert slow_sizes == fast_sizes
    assert np.array_equal(fast, slow), _differ(fast, slow)


async def test_same_seed_same_chunks_under_load(engine):
    """With other streams in flight the seeded utterance gets the same tokens and the same
    chunks; its windows then share codec batches with other streams' windows, whose float
    rounding differs from a decode alone in the last bit at most (docs/protocol.md)."""
    alone, sizes = await _speak(engine, TEXT, voice="female", seed=11)

    async def other(i: int) -> None:
        await _speak(engine, f"Caller {i} asks about order {4000 + i} again.", voice="male")

    (loaded, loaded_sizes), *_ = await asyncio.gather(
        _speak(engine, TEXT, voice="female", seed=11, delay_s=0.05), *(other(i) for i in range(3))
    )
    assert loaded_sizes == sizes
    assert snr_db(alone.astype(float), loaded.astype(float)) > 80, _differ(alone, loaded)
    assert int(np.abs(alone.astype(int) - loaded).max()) <= 2


async def test_a_voices_first_request_pins_it_and_the_later_ones_repeat(engine):
    """What docs/protocol.md says of voices not yet pinned: the first request samples and pins
    the voice, so it differs; every later request with the same seed repeats exactly."""
    voice = engine.check_voice("male:high")
    assert voice not in engine.stats()["pinned_voices"]
    first, _ = await _speak(engine, TEXT, voice=voice, seed=3)
    assert voice in engine.stats()["pinned_voices"]
    second, _ = await _speak(engine, TEXT, voice=voice, seed=3)
    third, _ = await _speak(engine, TEXT, voice=voice, seed=3, delay_s=0.1)
    assert np.array_equal(second, third), _differ(second, third)
    assert len(first) != len(second) or not np.array_equal(first, second)


async def test_the_edges_of_the_accepted_ranges_work_in_vllm(engine):
    """The largest seed and top_k the check accepts reach vLLM and generate (no 500 later): a
    two-part text, so the second part's seed is MAX_SEED + 1."""
    text = "A first sentence that is long enough to be its own part of the request. " * 3 + (
        "And a second one, which the engine sends to vLLM as another part with the next seed."
    )
    _, sizes = await _speak(
        engine, text, voice="female", seed=MAX_SEED, top_k=MAX_TOP_K, max_tokens=40
    )
    assert sizes
