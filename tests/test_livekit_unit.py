"""VeenaTTS (LiveKit plugin) logic over a fake engine: retries, errors, cancellation, options.

``FakeEngine`` injects faults at chosen points (before or after first audio, no audio, slow
first audio). ``EngineThread`` is tested over a real VeenaEngine with a scripted generator and
numpy codec (engine_fakes.py). The same capabilities run on the real vLLM engine and BiCodec in
test_livekit_real.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APITimeoutError

from pipecat_veena.engine import AudioChunk, EngineConfig, VeenaEngine
from pipecat_veena.engine_thread import EngineThread
from pipecat_veena.errors import (
    EngineDeadError,
    EngineNotRunningError,
    MalformedStreamError,
    NoAudioError,
    UnknownVoiceError,
)
from pipecat_veena.livekit import CHUNKED_RETRIES_AFTER_AUDIO, VeenaTTS
from pipecat_veena.streaming import StreamConfig

RATE = 16000
CHUNK = 1600  # samples per fake chunk (0.1 s)
FAST = APIConnectOptions(max_retry=2, retry_interval=0.0, timeout=5.0)
ROOT = Path(__file__).resolve().parent.parent


class FakeEngine:
    """A fake VeenaEngine for fault injection: speaks ``chunks`` pieces of a 220 Hz tone.

    The first ``failures`` requests raise ``error`` just before chunk ``fail_at`` (0: before any
    audio), or hang before chunk ``stall_at``. ``delay`` is the wait before each chunk. Open
    requests are tracked so tests can see that closing a stream closed the engine stream
    (``stats()`` counts them).
    """

    voices = ["female", "male"]
    model_name = "fake-veena"
    emotion_tags = ("<laugh>", "<sigh>")

    def __init__(
        self, *, chunks=5, fail_at=None, failures=1, error=None, delay=0.0, running=True,
        stall_at=None,
    ):  # fmt: skip
        self.config = SimpleNamespace(pin_voices=True)
        self.stall_at = stall_at
        self.chunks, self.fail_at, self.failures = chunks, fail_at, failures
        self.error = error or MalformedStreamError("injected fault")
        self.delay = delay
        self.is_running = running
        self.calls: list[tuple[str, str | None, dict]] = []
        self.open: set[str] = set()
        self.started = 0

    @property
    def sample_rate(self) -> int:
        if not self.is_running:
            raise EngineNotRunningError("fake: not started")
        return RATE

    async def start(self) -> None:
        self.started += 1
        self.is_running = True

    def check_voice(self, voice):
        base = (voice or "").split(":")[0] or None
        if base not in (None, *self.voices):
            raise UnknownVoiceError(f"unknown voice {voice!r}")
        return voice or self.voices[0]

    def check_options(self, **options):
        if options.get("temperature", 1.0) <= 0:
            raise ValueError("temperature must be > 0")

    def stats(self) -> dict:
        return {"unfinished_requests": len(self.open), "active_streams": len(self.open)}

    async def stream(self, text, voice=None, *, request_id=None, **sampling):
        n = len(self.calls)
        self.calls.append((text, voice, sampling))
        rid = f"{request_id}-{n}"
        self.open.add(rid)
        try:
            for i in range(self.chunks):
                if n < self.failures and i == self.fail_at:
                    raise self.error
                await asyncio.sleep(self.delay)
                if i == self.stall_at and n < self.failures:
                    await asyncio.sleep(3600)  # a hung engine
                t = np.arange(i * CHUNK, (i + 1) * CHUNK) / RATE
                pcm = (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()
                yield AudioChunk(pcm, RATE, tokens=10 * (i + 1), prompt_tokens=7)
        finally:
            self.open.discard(rid)


class Events:
    """Collects a TTS's ``error`` and ``metrics_collected`` events."""

    def __init__(self, tts):
        self.errors, self.metrics = [], []
        self.measured = asyncio.Event()
        tts.on("error", self.errors.append)
        tts.on("metrics_collected", self._metrics)

    def _metrics(self, metrics) -> None:
        self.metrics.append(metrics)
        self.measured.set()

    async def settle(self) -> None:
        """Wait for the metrics event (LiveKit's monitor task emits it after the audio)."""
        async with asyncio.timeout(5):
            await self.measured.wait()


async def _frames(stream):
    return [ev async for ev in stream]


def _samples(frames) -> int:
    return sum(ev.frame.samples_per_channel for ev in frames)


async def test_capabilities_rate_model_provider():
    tts = VeenaTTS(FakeEngine())
    assert tts.capabilities.streaming and tts.sample_rate == RATE and tts.num_channels == 1
    assert (tts.model, tts.provider) == ("fake-veena", "pipecat-veena")


async def test_synthesize_pushes_all_audio_with_metrics():
    engine = FakeEngine()
    tts = VeenaTTS(engine, seed=3)
    events = Events(tts)
    frame = await tts.synthesize("Hello there.", conn_options=FAST).collect()
    await events.settle()
    assert frame.sample_rate == RATE and frame.samples_per_channel == 5 * CHUNK
    assert engine.calls == [("Hello there.", "female", {"seed": 3})]
    (m,) = events.metrics
    assert m.ttfb > 0 and m.audio_duration == pytest.approx(0.5) and m.characters_count == 12
    assert m.output_tokens == 50 and m.input_tokens == 7
    assert not m.streamed and events.errors == []


async def test_requested_rate_is_resampled_to_the_same_duration():
    tts = VeenaTTS(FakeEngine(), sample_rate=24000)
    frame = await tts.synthesize("Hello there.").collect()
    assert frame.sample_rate == 24000
    assert abs(frame.samples_per_channel - 5 * CHUNK * 3 // 2) <= 2
    audio = np.frombuffer(frame.data, "<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(audio))
    assert np.fft.rfftfreq(len(audio), 1 / 24000)[spectrum.argmax()] == pytest.approx(220, abs=3)


@pytest.mark.parametrize("streamed", [False, True])
async def test_error_before_first_audio_is_retried_and_succeeds(streamed):
    engine = FakeEngine(fail_at=0, failures=1)
    tts = VeenaTTS(engine, seed=3)
    events = Events(tts)
    frames = await _speak(tts, "Hello there, how are you?", streamed)
    await events.settle()
    assert _samples(frames) == 5 * CHUNK
    assert [call[2]["seed"] for call in engine.calls] == [3, 4]  # a retry takes the next seed
    (error,) = events.errors
    assert error.recoverable and isinstance(error.error, APIError) and error.error.retryable
    assert isinstance(error.error.__cause__, MalformedStreamError)
    assert len(events.metrics) == 1
    assert engine.open == set()


async def test_stream_error_after_first_audio_is_not_retried():
    engine = FakeEngine(fail_at=2, failures=1)
    tts = VeenaTTS(engine)
    events = Events(tts)
    with pytest.raises(APIError, match="injected fault") as info:
        await _speak(tts, "Hello there, how are you?", streamed=True)
    assert not info.value.retryable and len(engine.calls) == 1
    (error,) = events.errors
    assert not error.recoverable and error.error is info.value
    assert engine.open == set()


async def test_synthesize_error_after_partial_audio_follows_livekits_retry_rule():
    """LiveKit 1.7+ retries synthesize() after partial audio under a new request id (the
    partial audio is stale): the plugin marks such errors retryable, and the retry speaks
    the whole text again."""
    assert CHUNKED_RETRIES_AFTER_AUDIO  # livekit-agents 1.8 is what the extra installs
    engine = FakeEngine(fail_at=2, failures=1)
    tts = VeenaTTS(engine)
    events = Events(tts)
    frames = await _frames(tts.synthesize("Hello there, how are you?", conn_options=FAST))
    assert len(engine.calls) == 2
    (error,) = events.errors
    assert error.recoverable and error.error.retryable
    final = [ev for ev in frames if ev.request_id == frames[-1].request_id]
    assert _samples(final) == 5 * CHUNK  # the retry's request carries the whole utterance
    assert engine.open == set()


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_stall_after_first_audio_is_a_timeout_not_endless_silence(streamed):
    engine = FakeEngine(stall_at=2, failures=1)
    tts = VeenaTTS(engine)
    events = Events(tts)
    options = APIConnectOptions(max_retry=1, retry_interval=0.0, timeout=0.3)
    async with asyncio.timeout(10):
        if streamed:
            with pytest.raises(APITimeoutError, match="the next chunk"):
                await _speak(tts, "Hello there.", streamed, options)
            assert len(engine.calls) == 1 and [e.recoverable for e in events.errors] == [False]
        else:  # retried: the second attempt does not stall
            frames = await _speak(tts, "Hello there.", streamed, options)
            assert len(engine.calls) == 2 and _samples(frames) >= 5 * CHUNK
            assert "the next chunk" in str(events.errors[0].error)
    assert engine.open == set()


@pytest.mark.parametrize(
    "error",
    [
        EngineDeadError("fake: backend died, no restart left", retryable=False),
        EngineNotRunningError("fake: stopped"),
    ],
)
async def test_engine_that_cannot_serve_is_not_retried(error):
    engine = FakeEngine(fail_at=0, failures=9, error=error)
    tts = VeenaTTS(engine)
    events = Events(tts)
    with pytest.raises(APIError, match=type(error).__name__):
        await tts.synthesize("Hello there.", conn_options=FAST).collect()
    assert len(engine.calls) == 1 and [e.recoverable for e in events.errors] == [False]


async def test_engine_restarting_its_backend_is_a_retryable_connection_error():
    """An engine whose LLM died and restarts raises a retryable EngineDeadError: LiveKit gets
    an APIConnectionError and retries (before it, the dead engine was permanent)."""
    error = EngineDeadError("fake: backend died; restarting")
    engine = FakeEngine(fail_at=0, failures=1, error=error)
    tts = VeenaTTS(engine)
    frames = [f async for f in tts.synthesize("Hello there.", conn_options=FAST)]
    assert len(engine.calls) == 2 and _samples(frames) > 0
    down = FakeEngine(fail_at=0, failures=9, error=error)  # still restarting after the retries
    with pytest.raises(APIConnectionError):
        await VeenaTTS(down).synthesize("Hello there.", conn_options=FAST).collect()
    assert len(down.calls) == 1 + FAST.max_retry


async def test_speakable_text_without_audio_is_an_error_after_retries():
    engine = FakeEngine(fail_at=0, failures=9, error=NoAudioError("no audio for 'Hello.'"))
    tts = VeenaTTS(engine)
    events = Events(tts)
    with pytest.raises(APIError, match="NoAudioError"):
        await tts.synthesize("Hello.", conn_options=FAST).collect()
    assert len(engine.calls) == 3  # the first try and max_retry=2 retries
    assert [e.recoverable for e in events.errors] == [True, True, False]


@pytest.mark.parametrize("text", ["", "   "])
async def test_empty_text_is_no_error(text):
    engine = FakeEngine()
    tts = VeenaTTS(engine)
    events = Events(tts)
    assert await _frames(tts.synthesize(text)) == []
    assert await _speak(tts, text, streamed=True) == []
    assert engine.calls == [] and events.errors == []


async def test_unspeakable_text_is_a_clear_final_error():
    engine = FakeEngine()
    tts = VeenaTTS(engine)
    events = Events(tts)
    with pytest.raises(APIError, match="nothing speakable") as info:
        await tts.synthesize("... !!", conn_options=FAST).collect()
    assert not info.value.retryable and engine.calls == []
    assert [e.recoverable for e in events.errors] == [False]


async def test_slow_first_audio_times_out_and_is_retried():
    engine = FakeEngine(delay=0.5)
    tts = VeenaTTS(engine)
    events = Events(tts)
    options = APIConnectOptions(max_retry=1, retry_interval=0.0, timeout=0.2)
    with pytest.raises(APITimeoutError):
        await tts.synthesize("Hello there.", conn_options=options).collect()
    assert [e.recoverable for e in events.errors] == [True, False]
    assert len(engine.calls) == 2 and engine.open == set()


async def test_stream_speaks_sentences_while_text_arrives():
    engine = FakeEngine(delay=0.01)
    tts = VeenaTTS(engine)
    events = Events(tts)
    pieces = ["The first sentence is here", ". And the second", " one follows", " now."]
    async with tts.stream() as stream:
        stream.push_text(pieces[0])
        stream.push_text(pieces[1])
        first = await anext(stream)  # audio before the text is complete
        assert engine.calls[0][0] == "The first sentence is here."
        for piece in pieces[2:]:
            stream.push_text(piece)
        stream.flush()
        frames = [first, *[ev async for ev in stream]]
    await events.settle()
    assert [c[0] for c in engine.calls] == [
        "The first sentence is here.",
        "And the second one follows now.",
    ]
    assert _samples(frames) == 2 * 5 * CHUNK
    assert [ev.is_final for ev in frames][-1] and not any(ev.is_final for ev in frames[:-1])
    assert len({ev.segment_id for ev in frames}) == 1 and frames[0].segment_id
    (m,) = events.metrics
    assert m.streamed and m.characters_count == len("".join(pieces)) and m.output_tokens == 100
    assert m.ttfb > 0 and m.audio_duration == pytest.approx(1.0)


@pytest.mark.parametrize("streamed", [False, True])
async def test_closing_mid_utterance_closes_the_engine_stream(streamed):
    engine = FakeEngine(chunks=1000, delay=0.01)
    tts = VeenaTTS(engine)
    if streamed:
        stream = tts.stream()
        stream.push_text("A long answer that goes on and on.")
        stream.end_input()
    else:
        stream = tts.synthesize("A long answer that goes on and on.")
    await anext(stream)
    assert engine.stats()["unfinished_requests"] == 1
    await stream.aclose()
    assert engine.stats()["unfinished_requests"] == 0


async def test_aclose_closes_open_streams_but_not_the_engine():
    engine = FakeEngine(chunks=1000, delay=0.01)
    tts = VeenaTTS(engine)
    streams = [tts.synthesize("One long answer."), tts.synthesize("Another long answer.")]
    await asyncio.gather(*(anext(s) for s in streams))
    assert len(engine.open) == 2
    await tts.aclose()
    assert engine.open == set() and engine.is_running


async def test_options_are_validated_and_passed_to_the_engine():
    engine = FakeEngine()
    with pytest.raises(UnknownVoiceError):
        VeenaTTS(engine, voice="nobody")
    with pytest.raises(ValueError, match="temperature"):
        VeenaTTS(engine, temperature=0.0)
    tts = VeenaTTS(engine, temperature=0.7)
    tts.update_options(voice="male", top_k=20)
    with pytest.raises(UnknownVoiceError):
        tts.update_options(voice="nobody")
    await tts.synthesize("Hello there.").collect()
    assert engine.calls[-1][1:] == ("male", {"temperature": 0.7, "top_k": 20})


async def test_stopped_engine_needs_a_rate_and_prewarm_starts_it():
    engine = FakeEngine(running=False)
    with pytest.raises(ValueError, match="pass sample_rate"):
        VeenaTTS(engine)
    tts = VeenaTTS(engine, sample_rate=RATE)
    tts.prewarm()
    tts.prewarm()
    frame = await tts.synthesize("Hello there.").collect()
    assert engine.started == 1 and frame.samples_per_channel == 5 * CHUNK


async def test_first_call_starts_a_stopped_engine_once():
    engine = FakeEngine(running=False)
    tts = VeenaTTS(engine, sample_rate=RATE)
    frames = await asyncio.gather(*(tts.synthesize(f"Call {i}.").collect() for i in range(3)))
    assert engine.started == 1 and all(f.samples_per_channel == 5 * CHUNK for f in frames)


async def test_pitch_speed_voices_markup():
    engine = FakeEngine()
    tts = VeenaTTS(engine, voice="male", pitch="high")
    assert tts.list_voices() == ["female", "male"]
    await tts.synthesize("Hello there.").collect()
    assert engine.calls[-1][1] == "male:high:moderate"
    with pytest.raises(ValueError, match="speed must be one of"):
        tts.update_options(speed="fastest")
    assert tts.options.speed is None
    markup = tts.markup
    assert "<laugh>, <sigh>" in markup.llm_instructions()
    assert markup.convert('So funny <sound value="laugh"/> right [sigh]') == (
        "So funny <laugh> right <sigh>"
    )
    assert markup.convert('<sound value="cough"/>ok') == "ok"  # undeclared: dropped
    assert markup.info.nonverbals == {"sound": ["laugh", "sigh"]}


def test_unpinned_voices_are_warned_about(caplog_loguru):
    engine = FakeEngine()
    VeenaTTS(engine)
    assert caplog_loguru.text == ""
    engine.config.pin_voices = False
    VeenaTTS(engine)
    assert "pin_voices=False" in caplog_loguru.text


async def _speak(tts, text, streamed, options=FAST):
    if not streamed:
        return await _frames(tts.synthesize(text, conn_options=options))
    stream = tts.stream(conn_options=options)
    async with stream:
        stream.push_text(text)
        stream.end_input()
        return await _frames(stream)


# -- EngineThread: a real VeenaEngine (scripted generator, numpy codec) on its own loop ---------
def _threaded_engine(tmp_path, *, semantics=40, delay=0.0) -> EngineThread:
    ids = spark_ids()
    generator = ScriptedGenerator(
        well_formed(ids, voice_globals=list(range(40, 72)), semantics=semantics), delay=delay
    )
    config = EngineConfig(
        checkpoint=make_checkpoint(tmp_path),
        warmup=False,
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=8),
    )
    return EngineThread.launch(VeenaEngine(config, generator=generator, codec=FakeBiCodec()))


async def test_engine_thread_serves_this_loop(tmp_path):
    host = _threaded_engine(tmp_path)
    try:
        assert host.is_running and host.sample_rate == 16000 and host.voices
        pcm = b"".join([c.pcm async for c in host.stream("Hello world.")])
        assert len(pcm) == 40 * FakeBiCodec.samples_per_frame * 2
        tts = VeenaTTS(host)
        frame = await tts.synthesize("Hello world.").collect()
        assert frame.samples_per_channel == 40 * FakeBiCodec.samples_per_frame
        with pytest.raises(UnknownVoiceError):
            await anext(host.stream("Hello.", voice="nobody"))
    finally:
        await host.shutdown()
    assert not host.is_running
    with pytest.raises(EngineNotRunningError, match="shut down"):
        await anext(host.stream("Hello."))


async def test_engine_thread_close_aborts_the_request(tmp_path):
    host = _threaded_engine(tmp_path, semantics=4000, delay=0.005)
    try:
        stream = host.stream("A long answer.")
        await anext(stream)
        assert host.stats()["active_streams"] == 1
        await stream.aclose()
        stats = host.stats()
        assert stats["active_streams"] == 0 and stats["unfinished_requests"] == 0
        assert host.engine._generator.aborted  # the LLM request was aborted, not drained
    finally:
        host.close()


# -- packaging -----------------------------------------------------------------------------------
def test_plugin_does_not_import_pipecat():
    code = (
        "import sys, pipecat_veena.livekit; "
        "bad = [m for m in sys.modules if m == 'pipecat' or m.startswith('pipecat.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_example_imports():
    spec = importlib.util.spec_from_file_location(
        "livekit_agent", ROOT / "examples/livekit_agent.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__doc__ and callable(module.prewarm) and callable(module.entrypoint)
    assert module.server is not None


async def test_speed_is_a_playback_rate_or_a_spark_level():
    """A number is the playback speed passed to the engine (checked against 0.5-2.0 without an
    engine); a level name stays a Spark voice level; 1.0 passes nothing (audio untouched)."""
    engine = FakeEngine()
    with pytest.raises(ValueError, match=r"0\.5 to 2\.0"):
        VeenaTTS(engine, speed=2.5)
    tts = VeenaTTS(engine, voice="male", speed=1.5)
    await tts.synthesize("Hello there.").collect()
    assert engine.calls[-1][1:] == ("male", {"speed": 1.5})
    with pytest.raises(ValueError, match=r"0\.5 to 2\.0"):
        tts.update_options(speed=0.2)
    assert tts.options.speed == 1.5
    tts.update_options(speed="high")
    await tts.synthesize("Hello there.").collect()
    assert engine.calls[-1][1:] == ("male:moderate:high", {})
    tts.update_options(speed=1.0)
    await tts.synthesize("Hello there.").collect()
    assert engine.calls[-1][1:] == ("male", {})
