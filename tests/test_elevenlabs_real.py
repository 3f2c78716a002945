"""ElevenLabs' stock clients, unchanged, against a real server on the real engine (vLLM CPU).

Pipecat's own ``ElevenLabsTTSService`` and LiveKit's ``livekit-plugins-elevenlabs``
``elevenlabs.TTS`` are pointed at ``multi-stream-input`` with nothing but the URL and the key
changed: every word of a Hindi + English answer with numbers reported as the caller wrote it,
at the time the engine gave it (each client's reading of the alignment, measured), the audio as
long as the tokens the engine generated say, barge-in leaving the played words in Pipecat's
context and no engine work, LiveKit's cancelled speculative syntheses leaving none, a bad key
and an unknown voice on each client's own error path, 8000 Hz. The hostile inputs of issue 38
go at the same server over a raw socket. One module-scoped server over one engine that shares
the session's vLLM engine; few, long scenarios.
"""

from __future__ import annotations

import asyncio
import json
import time

import psutil
import pytest
import pytest_asyncio
import websockets
from pipecat.frames.frames import InterruptionFrame, TTSTextFrame
from pipecat.pipeline.worker import PipelineParams
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
from recording import RecordingGenerator
from servers import engine_behind_server, idle_after, semantic_samples

from benchmarks.dropin import ANSWER, livekit_words, pipecat_words
from pipecat_veena.engine import EngineConfig
from pipecat_veena.server import ServerHandle, create_app
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.timing import split_words

pytestmark = pytest.mark.vllm

KEY = "elevenlabs-dropin-test-key"
WORDS = [ANSWER[a:b] for a, b in split_words(ANSWER)]
LONG = "This answer keeps going on and on, so that generation takes a good while. " * 3
#: A client's word start may be off by this much and still be the right word (generous: the
#: scheme is exact to the millisecond; docs/protocol.md).
WORD_BOUND_MS = 20


@pytest_asyncio.fixture(scope="module")
async def real(spark_tiny_checkpoint, spark_generator):
    """(engine, recorder, server): one real engine behind one keyed server on a free port."""
    recorder = RecordingGenerator(spark_generator)
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048)
    settings = ServerSettings(api_keys={KEY: "team"})
    async with engine_behind_server(config, recorder, settings) as (engine, handle):
        yield engine, recorder, handle


def _ws_base(server: ServerHandle) -> str:
    return f"ws://{server.host}:{server.port}"


def _raw_url(server: ServerHandle, query: str = "output_format=pcm_16000") -> str:
    return f"{_ws_base(server)}/v1/text-to-speech/female/multi-stream-input?{query}"


def _check_words(run, engine, recorder, before) -> int:
    """Every word as written, at the engine's time; the audio as long as the tokens say."""
    said = [w.strip() for w, _ in run.reported]
    assert said == WORDS and [w.word for w in run.truth] == WORDS
    errors = run.start_errors_ms
    print(f"word start error: max {max(map(abs, errors)):.2f} ms over {len(errors)} words")
    assert max(map(abs, errors)) <= WORD_BOUND_MS
    native = semantic_samples(engine, recorder.outputs, set(recorder.outputs) - before)
    return native


# -- Pipecat's ElevenLabsTTSService ---------------------------------------------------------
async def test_pipecat_speaks_every_word_as_written_at_its_time(real):
    """A Hindi + English answer with numbers: every word back as written and in order, each
    start (Pipecat's running-clock reading) at the engine's; audio as long as its tokens; then
    the same at 8000 Hz (half the samples)."""
    engine, recorder, server = real
    before = set(recorder.outputs)
    run = await pipecat_words(_ws_base(server), KEY, ANSWER)
    assert not run.errors
    native = _check_words(run, engine, recorder, before)
    assert " ".join(w.strip() for w, _ in run.reported) == " ".join(ANSWER.split())
    assert run.samples == native > 0
    await idle_after(engine, server)
    before = set(recorder.outputs)
    run = await pipecat_words(_ws_base(server), KEY, "Pay ₹1,499 by Monday.", rate=8000)
    native = semantic_samples(engine, recorder.outputs, set(recorder.outputs) - before)
    assert not run.errors and native > 0 and abs(run.samples - native // 2) <= 2
    await idle_after(engine, server)


async def test_pipecat_barge_in_keeps_the_played_words_and_stops_the_engine(real):
    """An LLM turn interrupted while it plays (a sound card playing in real time): Pipecat
    closes the context (close_context without a flush: a barge-in), the engine has no request
    left right after, and Pipecat's assistant aggregator keeps the words that played: a prefix
    of the answer as written."""
    from pipecat.frames.frames import (
        EndFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from benchmarks.interruption import SoundCard

    class FirstWord(FrameProcessor):
        """Passes every frame on; notes when the first word reached the aggregator."""

        def __init__(self) -> None:
            super().__init__()
            self.seen = asyncio.Event()

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSTextFrame):
                self.seen.set()
            await self.push_frame(frame, direction)

    engine, _, server = real
    answer = f"{ANSWER} {LONG.strip()}"
    words = [answer[a:b] for a, b in split_words(answer)]
    tts = ElevenLabsTTSService(
        api_key=KEY, url=_ws_base(server), settings=ElevenLabsTTSService.Settings(voice="female")
    )
    card, context, first_word = SoundCard(), LLMContext(), FirstWord()
    worker = PipelineWorker(
        Pipeline([tts, card, first_word, LLMAssistantAggregator(context)]),
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_out_sample_rate=16000),
    )
    started = asyncio.Event()
    idle_ms: list[float] = []

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame) -> None:
        started.set()

    async def speak() -> None:
        await asyncio.wait_for(started.wait(), timeout=30)
        await worker.queue_frame(LLMFullResponseStartFrame())
        for piece in answer.split(" "):  # tokens, as an LLM's; the turn's end never comes
            await worker.queue_frame(LLMTextFrame(piece + " "))
        await asyncio.wait_for(first_word.seen.wait(), timeout=120)
        await asyncio.sleep(0.5)
        assert engine.stats()["unfinished_requests"] > 0  # (still generating)
        await worker.queue_frame(InterruptionFrame())
        idle_ms.append(await idle_after(engine, server) * 1000)
        await asyncio.sleep(0.3)
        await worker.queue_frame(LLMFullResponseEndFrame())
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), speak())
    said = [m for m in context.get_messages() if m.get("role") == "assistant"][-1]["content"]
    kept = said.split()
    print(f"engine idle {idle_ms[0]:.0f} ms after the interruption; kept {len(kept)} words")
    assert 0 < len(kept) < len(words) and kept == words[: len(kept)], (said, card.played)
    assert idle_ms[0] < 1000  # (the figure is printed; a loose bound for a shared machine)


async def test_pipecat_bad_key_and_unknown_voice_take_its_error_path(real):
    engine, _, server = real
    run = await pipecat_words(_ws_base(server), "not-the-key", "Nobody hears this.")
    assert any("401" in e for e in run.errors), run.errors
    run = await pipecat_words(_ws_base(server), KEY, "Nobody hears this.", voice="no-such-voice")
    assert any("400" in e for e in run.errors), run.errors
    assert run.samples == 0
    await idle_after(engine, server)


# -- LiveKit's elevenlabs.TTS ---------------------------------------------------------------
async def test_livekit_streams_every_word_at_its_time(real):
    """LiveKit's stream with its default mp3_22050_32: every word as written at the engine's
    time (LiveKit reads the times as absolute); the audio about as long as the tokens say
    (mp3 frames pad it); then pcm_8000 for telephony, exactly half."""
    engine, recorder, server = real
    base = f"{server.url}/v1"
    before = set(recorder.outputs)
    run = await livekit_words(base, KEY, ANSWER)
    native = _check_words(run, engine, recorder, before)
    assert run.sample_rate == 22050
    assert abs(run.samples - native * 22050 / 16000) <= 2 * 1152 + 441  # (mp3 frames, 20 ms)
    assert "".join(w for w, _ in run.reported).strip() == " ".join(ANSWER.split())
    before = set(recorder.outputs)
    run = await livekit_words(base, KEY, "Pay ₹1,499 by Monday.", encoding="pcm_8000")
    native = semantic_samples(engine, recorder.outputs, set(recorder.outputs) - before)
    assert run.sample_rate == 8000 and abs(run.samples - native // 2) <= 2 + 80
    await idle_after(engine, server)


async def test_livekit_cancelled_speculative_syntheses_leave_no_engine_work(real):
    """Three speculative syntheses, text still coming (the LLM goes on), cancelled after the
    first audio: LiveKit closes each context without a flush, a barge-in here, so the engine is
    idle right after. Then a bad key and an unknown voice: APIStatusError 401 and 400."""
    import aiohttp
    from livekit.agents import APIConnectOptions, APIStatusError
    from livekit.plugins import elevenlabs

    engine, _, server = real
    options = APIConnectOptions(timeout=120)
    async with aiohttp.ClientSession() as session:
        tts = elevenlabs.TTS(
            api_key=KEY, base_url=f"{server.url}/v1", voice_id="female", http_session=session,
            encoding="pcm_16000",
        )  # fmt: skip
        streams = [tts.stream(conn_options=options) for _ in range(3)]
        for stream in streams:
            stream.push_text(LONG)  # (and no end_input: more text would come)
        await asyncio.wait_for(anext(aiter(streams[0])), 120)
        for _ in range(6000):  # all three are contexts on the server (a minute at most)
            if server.state.slots.active == 3:
                break
            await asyncio.sleep(0.01)
        assert server.state.slots.active == 3 and engine.stats()["unfinished_requests"] > 0
        start = time.monotonic()
        for stream in streams:
            await stream.aclose()
        idle_s = await idle_after(engine, server)
        print(f"engine idle {(time.monotonic() - start) * 1000:.0f} ms after LiveKit cancelled")
        assert idle_s < 1.0
        await tts.aclose()
        once = APIConnectOptions(max_retry=0, timeout=60)
        for key, voice, status in (("not-the-key", "female", 401), (KEY, "no-such-voice", 400)):
            tts = elevenlabs.TTS(
                api_key=key, base_url=f"{server.url}/v1", voice_id=voice, http_session=session
            )
            with pytest.raises(APIStatusError) as refused:
                async with tts.stream(conn_options=once) as stream:
                    stream.push_text("Nobody hears this.")
                    stream.end_input()
                    [ev async for ev in stream]
            assert refused.value.status_code == status
            await tts.aclose()
    await idle_after(engine, server)


# -- a raw socket ---------------------------------------------------------------------------
def _send(context_id: str, text: str | None = None, **extra) -> str:
    message = {"context_id": context_id, **extra}
    if text is not None:
        message["text"] = text
    return json.dumps(message)


async def _until(ws, pred, limit_s: float = 30.0) -> dict:
    async with asyncio.timeout(limit_s):
        while True:
            msg = json.loads(await ws.recv())
            if pred(msg):
                return msg


async def test_closing_the_socket_stops_every_context_at_once(real):
    engine, _, server = real
    headers = {"xi-api-key": KEY}
    async with websockets.connect(_raw_url(server), additional_headers=headers) as ws:
        for c in ("a", "b"):
            await ws.send(_send(c, LONG, flush=True))
        await _until(ws, lambda m: bool(m.get("audio")), 120)
        assert engine.stats()["unfinished_requests"] > 0
    closed = time.monotonic()
    await idle_after(engine, server)
    idle_ms = (time.monotonic() - closed) * 1000
    print(f"engine idle {idle_ms:.1f} ms after the socket closed")
    assert idle_ms < 1000


async def test_hostile_input_gets_documented_errors_and_holds_no_slot(real):
    """Malformed JSON, 10,000 contexts opened and never finished, a context reused after its
    close while it speaks, 1 MB of text (one message, and in pieces), a context left open: each
    a documented error within its deadline; no slot held after, memory measured."""
    engine, _, server = real
    me = psutil.Process()
    rss = me.memory_info().rss
    headers = {"xi-api-key": KEY}
    async with websockets.connect(_raw_url(server), additional_headers=headers) as ws:
        await ws.send("{not json")
        msg = await _until(ws, lambda m: True)
        assert (msg["error"], msg["contextId"]) == ("bad_json", None)
        start = time.monotonic()
        for i in range(10_000):
            await ws.send(_send(f"c{i}", "waiting for more"))
        cap = server.state.settings.max_open_utterances
        kept = {f"c{i}" for i in range(cap)}
        refused = 0
        async with asyncio.timeout(60):
            while refused < 10_000 - cap:
                msg = json.loads(await ws.recv())
                if msg["contextId"] in kept:
                    continue  # (their text may start speaking after 3 s)
                assert msg["error"] == "too_many_open_utterances" and msg["isFinal"] is True
                refused += 1
        flood_s = time.monotonic() - start
        assert server.state.slots.active == cap
        for i in range(cap):
            await ws.send(_send(f"c{i}", close_context=True))
        await idle_after(engine, server)
        await ws.send(_send("r", "One sentence that takes a moment to say. ", flush=True))
        await ws.send(_send("r", "", flush=True))
        await ws.send(_send("r", close_context=True))
        await ws.send(_send("r", "More text for a closed context."))
        msg = await _until(ws, lambda m: "error" in m)
        assert (msg["error"], msg["contextId"]) == ("duplicate_id", "r")
        await _until(ws, lambda m: m.get("isFinal") is True and m["contextId"] == "r", 120)
        await ws.send(_send("big", "x" * 1_000_000))
        msg = await _until(ws, lambda m: "error" in m)
        assert msg["error"] == "message_too_large"
        piece = "word " * 10_000
        for _ in range(20):
            await ws.send(_send("big", piece))
        msg = await _until(ws, lambda m: "error" in m and m["contextId"] == "big")
        assert msg["error"] == "text_too_long" and msg["isFinal"] is True
    await idle_after(engine, server)
    grown_mb = (me.memory_info().rss - rss) / 2**20
    print(f"10,000 contexts refused in {flood_s:.2f} s; RSS grew {grown_mb:.1f} MiB")
    assert server.state.slots.active == 0
    # a context left open: text_timeout, its slot back (a second app, 1 s open timeout)
    settings = ServerSettings(api_keys={KEY: "team"}, open_utterance_timeout_s=1.0)
    handle = await ServerHandle(create_app(engine, settings, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        async with websockets.connect(_raw_url(handle), additional_headers=headers) as ws:
            start = time.monotonic()
            await ws.send(_send("open", "no sentence end, and nothing after it"))
            msg = await _until(ws, lambda m: "error" in m, 30)
            waited = time.monotonic() - start
            assert (msg["error"], msg["contextId"]) == ("text_timeout", "open") and msg["isFinal"]
            assert handle.state.slots.active == 0 and 1.0 <= waited < 10.0
        print(f"a context left open ended after {waited:.2f} s (open_utterance_timeout_s 1)")
    finally:
        await handle.stop()
