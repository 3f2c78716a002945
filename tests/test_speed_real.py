"""Speed through the real parts: the vLLM CPU engine on the demo checkpoint, the real server on
a real socket (OpenAI route, WebSocket), a real Pipecat pipeline (barge-in context at 1.5x).

The toy model's speech is what it is; these tests check what the speed stage does to it: the
seeded utterance at speed s is the utterance at 1.0 stretched by s (so 1/s as long), sample for
sample, its word times divided by s, and 1.0 changes nothing.
"""

from __future__ import annotations

import random
import subprocess
import sys
import wave

import httpx
import numpy as np
import pytest
import pytest_asyncio
from server_fakes import RawClient, serving

from benchmarks.interruption import ENGLISH, MIXED, interrupted_turn, judge, kept_words
from pipecat_veena.engine import EngineConfig, VeenaEngine, stretch
from pipecat_veena.remote import RemoteVeenaEngine

pytestmark = pytest.mark.vllm

TEXT = "Hello there, your OTP is 4821. Please pay by Monday, thank you."


@pytest_asyncio.fixture(scope="module")
async def engine(spark_tiny_checkpoint, spark_generator):
    engine = VeenaEngine(EngineConfig(checkpoint=spark_tiny_checkpoint), generator=spark_generator)
    await engine.start()
    yield engine
    await engine.shutdown()


async def _speak(engine, rates_of=None, **options):
    # provisional word times start from the voice's remembered speaking rate, which each
    # sentence updates: every call starts from the same (empty) memory to be comparable
    (rates_of or engine)._parts.speaking_rates.clear()
    chunks = [c async for c in engine.stream(TEXT, seed=5, **options)]
    audio = np.concatenate([np.frombuffer(c.pcm, "<i2") for c in chunks])
    return chunks, audio, [w for c in chunks for w in c.words]


async def test_engine_speed_stretches_the_seeded_utterance_and_its_word_times(engine):
    base_chunks, base, base_words = await _speak(engine)
    one_chunks, one, _ = await _speak(engine, speed=1.0)
    assert [c.pcm for c in one_chunks] == [c.pcm for c in base_chunks]  # 1.0: bit-identical
    rate = engine.sample_rate
    for speed in (1.5, 0.75):
        chunks, audio, words = await _speak(engine, speed=speed)
        assert len(audio) == round(len(base) / speed)
        assert np.array_equal(audio, stretch(base, rate, speed))  # seams: none
        assert [w.word for w in words] == [w.word for w in base_words] and words
        for before, after in zip(base_words, words, strict=True):
            assert after.start == pytest.approx(before.start / speed, abs=2e-4)
            assert after.end == pytest.approx(before.end / speed, abs=2e-4)
            assert after.offset == before.offset
        seconds = 0.0
        for c in chunks:  # words still come with or after their audio
            seconds += c.duration
            assert all(w.end <= seconds + 1e-3 for w in c.words)


async def test_engine_refuses_a_speed_outside_the_range_before_any_work(engine):
    for bad in (2.5, 0.4):
        with pytest.raises(ValueError, match=r"0\.5 to 2\.0"):
            await anext(engine.stream(TEXT, speed=bad))


async def test_server_openai_route_and_websocket_take_speed(engine):
    rate = engine.sample_rate
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "sample_rate": rate, "seed": 5}  # fmt: skip
    async with serving(engine) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            base = await http.post("/v1/audio/speech", json=body)
            assert base.status_code == 200
            samples = np.frombuffer(base.content, "<i2")
            for speed in (0.5, 2.0):
                r = await http.post("/v1/audio/speech", json=body | {"speed": speed})
                assert r.status_code == 200, r.text
                assert np.array_equal(
                    np.frombuffer(r.content, "<i2"), stretch(samples, rate, speed)
                )
            for bad in (2.5, 0.25, "fast", True):
                r = await http.post("/v1/audio/speech", json=body | {"speed": bad})
                assert r.status_code == 400, (bad, r.text)
                assert "0.5 to 2.0" in r.text
        async with RawClient.connect(server.ws_url) as client:
            options = {"seed": 5, "speed": 1.5}
            await client.send({"type": "speak", "id": "s", "text": TEXT, "options": options})
            frames, end = await client.until_end("s")
            assert end.type == "done", end
            audio = np.concatenate([np.frombuffer(f.pcm, "<i2") for f in frames])
            assert np.array_equal(audio, stretch(samples, rate, 1.5))
            options = {"speed": 3}
            await client.send({"type": "speak", "id": "t", "text": TEXT, "options": options})
            _, end = await client.until_end("t")
            assert end.type == "error" and end.code == "bad_options", end
            assert "0.5 to 2.0" in end.message


async def test_remote_engine_speaks_at_speed_through_the_real_server(engine):
    """RemoteVeenaEngine.stream(speed=...) over the real server: the stretched audio and the
    scaled word times of the in-process engine; a speed outside the range refused locally."""
    _, base, base_words = await _speak(engine)
    async with serving(engine) as server:
        async with RemoteVeenaEngine(server.url) as remote:
            with pytest.raises(ValueError, match=r"0\.5 to 2\.0"):
                remote.check_options(speed=2.5)
            chunks, audio, words = await _speak(remote, rates_of=engine, speed=1.5)
    assert np.array_equal(audio, stretch(base, engine.sample_rate, 1.5))
    assert [w.word for w in words] == [w.word for w in base_words]
    for before, after in zip(base_words, words, strict=True):
        assert after.start == pytest.approx(before.start / 1.5, abs=2e-3)


def test_cli_say_refuses_a_speed_outside_the_range_before_loading():
    result = subprocess.run(
        [sys.executable, "-m", "pipecat_veena.cli", "say", "Hello.", "--speed", "2.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "--speed" in result.stderr
    assert "0.5 to 2.0" in result.stderr


def test_cli_say_speed_writes_the_stretched_utterance(tmp_path, spark_tiny_checkpoint):
    """pipecat-veena say --speed 1.5 (a real engine, a real Pipecat pipeline into a WAV):
    the seeded utterance 1/1.5 as long as at the model's pace."""
    lengths = {}
    for speed in ("1.0", "1.5"):
        out = tmp_path / f"{speed}.wav"
        cmd = [sys.executable, "-m", "pipecat_veena.cli", "say", "Hello there, thank you.",
               "--model", str(spark_tiny_checkpoint), "--seed", "3", "--speed", speed,
               "-o", str(out)]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        with wave.open(str(out)) as wav:
            lengths[speed] = wav.getnframes()
    assert abs(lengths["1.5"] - lengths["1.0"] / 1.5) <= 2


async def test_livekit_veena_tts_at_speed(engine):
    """LiveKit's VeenaTTS(speed=1.5): the collected frame is the seeded utterance stretched."""
    from pipecat_veena.livekit import VeenaTTS

    text = "Hello there, this is Veena speaking."
    frames = {}
    for speed in (None, 1.5):
        tts = VeenaTTS(engine, seed=5, speed=speed)
        frames[speed] = np.frombuffer((await tts.synthesize(text).collect()).data, np.int16)
        await tts.aclose()
    assert np.array_equal(frames[1.5], stretch(frames[None], engine.sample_rate, 1.5))


async def test_pipecat_barge_in_context_is_exact_at_speed_one_and_a_half(engine):
    """VeenaTTSService(speed=1.5) in a real pipeline that plays in real time: the whole turn
    plays in 1/1.5 of its time, and at random interruptions the context holds the words that
    had played (the interruption benchmark's judge)."""
    said, spoken, played = await interrupted_turn(engine, MIXED, None)
    fast_said, fast, fast_played = await interrupted_turn(engine, MIXED, None, speed=1.5)
    assert fast_said == kept_words(MIXED, fast)
    assert fast.seconds == pytest.approx(spoken.seconds / 1.5, abs=0.02 * len(fast.sentences))
    assert fast_played == pytest.approx(fast.seconds, abs=0.05)
    rng, failures = random.Random(15), []
    for at in [rng.uniform(0.1, 3.0) for _ in range(4)]:
        said, spoken, played = await interrupted_turn(engine, ENGLISH, at, speed=1.5)
        problem = judge(said, ENGLISH, spoken, played, strict=False)
        if problem:
            failures.append(f"interrupt at {at:.2f} s ({played:.2f} s played): {problem}")
    assert not failures, "\n".join(failures)
