"""RemoteVeenaEngine against speech servers over fake engines (tests/server_fakes.py), on
loopback: the SpeechEngine surface, cancellation, retry before first audio (on another URL),
clean failure after first audio, reconnect after a restart, and the Pipecat service on top.
test_server_real.py runs the same client against the real vLLM engine."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from loguru import logger
from pipecat.frames.frames import ErrorFrame, InterruptionFrame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test
from server_fakes import CHUNK_BYTES, RATE, FakeSpeechEngine, serving, until
from servers import round_robin_proxy

from pipecat_veena.errors import (
    EngineNotRunningError,
    GenerationError,
    RemoteError,
    ServerUnavailableError,
    UnknownVoiceError,
)
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.remote import RemoteVeenaEngine, stream_url
from pipecat_veena.remote.link import jittered
from pipecat_veena.remote.protocol import encode_audio_frame
from pipecat_veena.server import ServerHandle, ServerSettings, create_app
from pipecat_veena.server.settings import OPENAI_VOICES
from pipecat_veena.service import VeenaTTSService


async def _speak(engine, text: str = "Hello.", **kwargs) -> bytes:
    return b"".join([chunk.pcm async for chunk in engine.stream(text, **kwargs)])


def test_urls_are_normalised():
    assert stream_url("http://h:8000") == "ws://h:8000/v1/audio/stream"
    assert stream_url("https://h/") == "wss://h/v1/audio/stream"
    assert stream_url("ws://h:1/custom") == "ws://h:1/custom"
    assert stream_url("h:9") == "ws://h:9/v1/audio/stream"
    with pytest.raises(ValueError, match="ws"):
        stream_url("ftp://h")


async def test_a_key_in_the_url_never_reaches_a_message_or_the_log():
    """A key given in the URL's query is the client's secret: its errors, its printout and its
    log lines (at every level) name the server without it."""
    lines: list[str] = []
    handler = logger.add(lines.append, level="TRACE")
    try:
        engine = RemoteVeenaEngine("ws://127.0.0.1:9/?api_key=SECRET-123", connect_timeout_s=0.5)
        with pytest.raises(Exception) as failed:
            await engine.start()
        await engine.shutdown()
    finally:
        logger.remove(handler)
    shown = [str(failed.value), str(engine), *lines]
    assert not [line for line in shown if "SECRET-123" in line], shown
    assert "api_key=<redacted>" in str(engine)


async def test_the_speech_engine_surface():
    fake = FakeSpeechEngine(chunks=3)
    async with serving(fake) as server:
        engine = RemoteVeenaEngine(server.url)
        assert not engine.is_running
        with pytest.raises(EngineNotRunningError, match="start"):
            engine.sample_rate  # noqa: B018
        await engine.start()
        await engine.start()  # idempotent
        try:
            assert isinstance(engine, SpeechEngine)  # (3.11 reads the properties: after start)
            assert engine.is_running and engine.model_name == "fake-veena"
            assert engine.sample_rate == RATE and engine.voices == ["female", "male"]
            assert engine.check_voice(None) == "female" and engine.check_voice("Male") == "male"
            assert engine.check_voice("female:high") == "female:high"
            with pytest.raises(UnknownVoiceError, match="offers: female, male"):
                engine.check_voice("robot")
            with pytest.raises(ValueError, match="temperature"):
                engine.check_options(temperature=5.0)
            with pytest.raises(ValueError, match="unknown option"):
                engine.check_options(warp=1)
            chunks = [c async for c in engine.stream("Hi.", "male", seed=3, top_k=None)]
            assert [c.tokens for c in chunks] == [10, 20, 30]
            assert all(c.sample_rate == RATE for c in chunks)
            assert b"".join(c.pcm for c in chunks) == b"".join(
                [c.pcm async for c in fake.stream("Hi.")]
            )
            assert fake.calls[0] == ("Hi.", "male", {"seed": 3})
            assert engine.stats()["requests"] == 1 and engine.stats()["active_streams"] == 0
        finally:
            await engine.shutdown()
            await engine.shutdown()
        assert not engine.is_running
        with pytest.raises(EngineNotRunningError):
            await _speak(engine)


async def test_word_timings_ride_the_chunks_when_the_server_times_words():
    """A server that times words (``ready.words``) gets ``"words": true`` and its ``words``
    messages come back as chunks with ``words`` (empty PCM: after their audio); a server that
    does not gets no such field (servers from before it refuse unknown fields)."""
    text = "one two three"
    for times in (True, False):
        fake = FakeSpeechEngine(chunks=3, words=times)
        async with serving(fake) as server, RemoteVeenaEngine(server.url) as engine:
            assert engine.times_words is times
            chunks = [c async for c in engine.stream(text)]
        pcm = [c for c in chunks if c.pcm]
        assert len(pcm) == 3 and not [c for c in pcm if c.words]
        words = [w for c in chunks for w in c.words]
        assert [(w.word, w.offset) for w in words] == ([("one", 0), ("two", 4), ("three", 8)]
                                                       if times else [])  # fmt: skip
        heard = 0.0
        for chunk in chunks:  # each word after the audio that covers its end
            heard += chunk.duration
            assert all(w.end <= heard + 1e-9 for w in chunk.words)
    assert not RemoteVeenaEngine("ws://127.0.0.1:9").times_words  # unknown before start()


async def test_closing_or_aborting_a_stream_cancels_it_on_the_server():
    fake = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(fake) as server, RemoteVeenaEngine(server.url) as engine:
        stream = engine.stream("Long.", request_id="ctx-1")
        await anext(stream)
        await stream.aclose()
        await until(lambda: not fake.open)
        stream = engine.stream("Long.", request_id="ctx-2")
        await anext(stream)
        assert await engine.abort("ctx-2") == 1 and await engine.abort("ctx-2") == 0
        async for _ in stream:  # frames already in flight, then the end: no error
            pass
        await until(lambda: not fake.open)

        async def consume():
            async for _ in engine.stream("Long.", request_id="ctx-3"):
                pass

        task = asyncio.create_task(consume())
        await until(lambda: fake.open)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: not fake.open and server.state.slots.active == 0)


async def test_a_failure_before_first_audio_is_retried_once():
    fake = FakeSpeechEngine(chunks=3, fail_at=0, failures=1)
    async with serving(fake) as server, RemoteVeenaEngine(server.url) as engine:
        assert len(await _speak(engine)) == 3 * CHUNK_BYTES
        assert len(fake.calls) == 2 and engine.stats()["retries"] == 1
        fake.failures = 10 + len(fake.calls)  # every try fails: the second error is raised
        with pytest.raises(GenerationError, match="generation failed on the server"):
            await _speak(engine)


async def test_a_failure_after_first_audio_is_not_retried():
    fake = FakeSpeechEngine(chunks=4, fail_at=2, failures=1)
    async with serving(fake) as server, RemoteVeenaEngine(server.url) as engine:
        got = []
        with pytest.raises(GenerationError, match="generation failed on the server"):
            async for chunk in engine.stream("Hello."):
                got.append(chunk)
        assert len(got) == 2 and len(fake.calls) == 1


async def test_input_errors_are_not_retried():
    fake = FakeSpeechEngine()
    async with serving(fake, ServerSettings(max_text_chars=10)) as server:
        async with RemoteVeenaEngine(server.url) as engine:
            with pytest.raises(ValueError, match="cap of 10"):
                await _speak(engine, "This text is too long.")
            with pytest.raises(UnknownVoiceError):
                await _speak(engine, voice="robot")
            assert engine.stats()["retries"] == 0 and not fake.calls


async def test_retry_goes_to_the_next_server():
    first = FakeSpeechEngine(chunks=2, fail_at=0, failures=1)
    second = FakeSpeechEngine(chunks=2)
    async with serving(first) as a, serving(second) as b:
        async with RemoteVeenaEngine([a.url, b.url]) as engine:
            assert len(await _speak(engine)) == 2 * CHUNK_BYTES
            assert len(first.calls) == 1 and len(second.calls) == 1
            assert len(await _speak(engine)) == 2 * CHUNK_BYTES
            assert len(first.calls) == 2  # the first server is still the preferred one


async def test_unreachable_server_and_bad_key_fail_clearly():
    engine = RemoteVeenaEngine("ws://127.0.0.1:9", connect_timeout_s=0.3)
    with pytest.raises(ServerUnavailableError, match="pipecat-veena serve"):
        await engine.start()
    async with serving(FakeSpeechEngine(), ServerSettings(api_keys={"k": "bot"})) as server:
        engine = RemoteVeenaEngine(server.url, api_key="wrong")
        with pytest.raises(RemoteError, match="refused the API key") as info:
            await engine.start()
        assert not info.value.retryable
        async with RemoteVeenaEngine(server.url, api_key="k") as engine:
            assert len(await _speak(engine)) > 0


async def test_reconnects_after_a_server_restart():
    fake = FakeSpeechEngine(chunks=2)
    handle = await ServerHandle(create_app(fake, owns_engine=False)).start()
    port = handle.port
    engine = RemoteVeenaEngine(handle.url, connect_timeout_s=20)
    try:
        await engine.start()
        await handle.stop()  # closes the connection (1012)
        await until(lambda: not engine.stats()["connected"])
        with pytest.raises(ServerUnavailableError):  # nobody there for a while
            await RemoteVeenaEngine(handle.url, connect_timeout_s=0.2).start()
        handle = await ServerHandle(create_app(fake, owns_engine=False), port=port).start()
        assert len(await _speak(engine)) == 2 * CHUNK_BYTES
        assert engine.stats()["connects"] == 2
    finally:
        await engine.shutdown()
        await handle.stop()


async def test_a_server_lost_mid_utterance_fails_it_cleanly():
    fake = FakeSpeechEngine(endless=True, delay=0.01)
    handle = await ServerHandle(create_app(fake, owns_engine=False)).start()
    engine = RemoteVeenaEngine(handle.url)
    try:
        await engine.start()
        stream = engine.stream("Long.")
        await anext(stream)
        await handle.stop()
        with pytest.raises(RemoteError, match="after the first audio was sent"):
            async for _ in stream:
                pass
    finally:
        await engine.shutdown()
        await handle.stop()
    assert not fake.open


async def test_a_draining_server_hands_new_utterances_to_another_behind_one_url():
    """A rolling restart behind one URL (a Kubernetes Service: round robin over two servers):
    server A drains while a call speaks on it. The utterance in flight finishes on A, the next
    one goes to B through the same URL (a new connection), nothing fails, no audio twice."""
    first, second = FakeSpeechEngine(chunks=20, delay=0.02), FakeSpeechEngine(chunks=20)
    async with serving(first) as a, serving(second) as b:
        proxy = round_robin_proxy([a.port, b.port])
        async with proxy as url, RemoteVeenaEngine(url, connect_timeout_s=10) as engine:
            stream = engine.stream("In flight on A.")
            got = [await anext(stream)]
            assert first.open
            drain = asyncio.create_task(a.state.drain(30))
            await until(lambda: a.state.draining)
            for n in range(3):  # the call's next turns, while A drains
                assert len(await _speak(engine, f"Turn {n}.")) == 20 * CHUNK_BYTES
            got += [chunk async for chunk in stream]
            assert sum(len(c.pcm) for c in got) == 20 * CHUNK_BYTES
            assert await drain == 0  # the in-flight one completed, the connection closed
            assert len(first.calls) == 1 and len(second.calls) == 3  # each spoken once
            assert engine.stats()["connects"] == 2


async def test_an_utterance_refused_by_a_draining_server_is_retried_elsewhere():
    """Without waiting for the goaway: a speak that reaches a draining server (refused with
    server_draining) goes to a new connection, i.e. another server behind the URL."""
    first, second = FakeSpeechEngine(chunks=2), FakeSpeechEngine(chunks=2)
    async with serving(first) as a, serving(second) as b:
        proxy = round_robin_proxy([a.port, b.port])
        async with proxy as url, RemoteVeenaEngine(url, connect_timeout_s=10) as engine:
            a.state.draining = True  # (the refusal alone, as a server before goaway sent it)
            assert len(await _speak(engine)) == 2 * CHUNK_BYTES
            assert not first.calls and len(second.calls) == 1
            a.state.draining = False


def test_reconnect_backoff_is_jittered():
    delays = [jittered(1.0) for _ in range(200)]
    assert all(0.5 <= d <= 1.5 for d in delays) and max(delays) - min(delays) > 0.5


async def test_check_voice_takes_the_openai_names_the_server_takes():
    for settings in (ServerSettings(), ServerSettings(voice_map={"alloy": "male"})):
        async with serving(FakeSpeechEngine(), settings) as server:
            async with RemoteVeenaEngine(server.url) as engine:
                for name in OPENAI_VOICES:
                    assert engine.check_voice(name) == server.state.resolve_voice(name)
                assert engine.check_voice("ALLOY") == server.state.resolve_voice("alloy")
                with pytest.raises(UnknownVoiceError, match="offers"):
                    engine.check_voice("robot")
                chunks = [c async for c in engine.stream("Hi.", engine.check_voice("alloy"))]
                assert chunks


async def test_a_later_server_with_new_fields_and_messages_still_works():
    """A compatible server addition (a new field in ready and done, a new message type) must
    not break this client: it ignores what it does not know."""

    async def later_server(ws) -> None:
        ready = {"type": "ready", "protocol": 1, "model": "later", "sample_rate": RATE,
                 "voices": ["female"], "default_voice": "female", "voice_levels": False,
                 "limits": {}, "emotion_tags": [], "region": "ap-south-1"}  # fmt: skip
        await ws.send(json.dumps(ready))
        speak = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "progress", "id": speak["id"], "percent": 0}))
        await ws.send(encode_audio_frame(speak["id"], 10, b"\x01\x00" * 100))
        done = {"type": "done", "id": speak["id"], "reason": "completed", "tokens": 10,
                "audio_seconds": 0.01, "ttfa_ms": 1.0, "elapsed_ms": 2.0, "sample_rate": RATE,
                "request_id": "x", "words": 1}  # fmt: skip
        await ws.send(json.dumps(done))
        await ws.wait_closed()

    async with websockets.serve(later_server, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with RemoteVeenaEngine(f"ws://127.0.0.1:{port}", connect_timeout_s=3) as engine:
            assert engine.model_name == "later"
            assert await _speak(engine) == b"\x01\x00" * 100


async def test_pipecat_service_over_a_remote_engine():
    fake = FakeSpeechEngine(chunks=4, delay=0.005)
    async with serving(fake) as server, RemoteVeenaEngine(server.url) as engine:
        down, up = await run_test(
            VeenaTTSService(engine, voice="male"),
            frames_to_send=[TTSSpeakFrame("Hello there.")],
            pipeline_params=PipelineParams(audio_out_sample_rate=RATE),
        )
        audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
        assert sum(len(f.audio) for f in audio) == 4 * CHUNK_BYTES
        assert not [f for f in up if isinstance(f, ErrorFrame)] and fake.calls[-1][1] == "male"
        fake.endless = True
        down, up = await run_test(
            VeenaTTSService(engine),
            frames_to_send=[TTSSpeakFrame("Long."), SleepFrame(0.2), InterruptionFrame()],
            pipeline_params=PipelineParams(audio_out_sample_rate=RATE),
        )
        await until(lambda: not fake.open and server.state.slots.active == 0)
        fake.endless, fake.fail_at, fake.failures = False, 2, len(fake.calls) + 1
        down, up = await run_test(
            VeenaTTSService(engine),
            frames_to_send=[TTSSpeakFrame("Fails half way.")],
            pipeline_params=PipelineParams(audio_out_sample_rate=RATE),
        )
        errors = [f for f in up if isinstance(f, ErrorFrame)]
        assert len(errors) == 1 and "generation failed" in errors[0].error
        assert not errors[0].fatal
