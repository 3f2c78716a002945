"""The speech server over the real engine (vLLM CPU on the demo checkpoint, torch BiCodec) and
real sockets: the WebSocket protocol, the three third-party clients users already have (the
``openai`` client, Pipecat's OpenAITTSService, LiveKit's openai plugin), RemoteVeenaEngine under
VeenaTTSService and LiveKit's VeenaTTS, retries, reconnects, and ``pipecat-veena serve`` as a
process with a drain on SIGTERM.

The servers run with uvicorn on loopback in the test session's event loop, over a VeenaEngine
that shares the session's vLLM engine through ``RecordingGenerator`` (no second vLLM engine), so
every audio length is checked against the tokens the server's requests generated.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from contextlib import aclosing

import httpx
import numpy as np
import openai
import psutil
import pytest
import pytest_asyncio
from decoded import decoded_samples
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSTextFrame,
)
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test
from recording import RecordingGenerator
from server_fakes import (
    ROOT,
    RawClient,
    cut_off_body,
    openai_tts_service_speaks,
    pcm_of,
    send_invalid_utf8,
    until_ready,
)
from servers import assert_ended, engine_behind_server, kill_leftovers, semantic_samples, serve_app

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine.voices import PRINTS_FORMAT
from pipecat_veena.errors import GenerationError
from pipecat_veena.interface import WordTiming
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.remote.protocol import CLOSE_GOING_AWAY, AudioFrame, ErrorCode, GoAway
from pipecat_veena.server import ServerHandle, create_app
from pipecat_veena.service import VeenaTTSService

pytestmark = pytest.mark.vllm
LONG = "This answer keeps going on and on, so that generation takes a good while. " * 3


@pytest_asyncio.fixture(scope="module")
async def real(spark_tiny_checkpoint, spark_generator):
    """(engine, recorder, server): one real engine behind one server on a free port."""
    recorder = RecordingGenerator(spark_generator)
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048)
    async with engine_behind_server(config, recorder) as (engine, handle):
        yield engine, recorder, handle


def _samples_of(engine: VeenaEngine, recorder: RecordingGenerator, rids) -> int:
    """Samples the codec makes from the semantic tokens of the given engine requests."""
    return semantic_samples(engine, recorder.outputs, rids)


#: What an mp3 stream decodes to beyond its PCM: the encoder's delay and last-frame padding.
MP3_SLACK = 2400


def _requests_of(recorder: RecordingGenerator, prefix: str) -> list[str]:
    return [rid for rid in recorder.outputs if rid.startswith(f"{prefix}-")]


async def _settled(engine: VeenaEngine, server: ServerHandle) -> None:
    """Wait (bounded) until nothing is in flight on the server or in vLLM."""
    for _ in range(1000):
        stats = engine.stats()
        if not stats["unfinished_requests"] and not server.state.slots.active:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still in flight: {engine.stats()}, {server.state.slots.active}")


# -- the WebSocket -------------------------------------------------------------------------
async def test_ws_audio_is_the_length_its_tokens_say(real):
    engine, recorder, server = real
    async with RawClient.connect(server.ws_url) as client:
        assert client.ready.sample_rate == engine.sample_rate
        assert client.ready.voices == engine.voices
        await client.send({"type": "speak", "id": "a", "text": "नमस्ते! Your order has shipped.",
                           "options": {"seed": 5}})  # fmt: skip
        frames, done = await client.until_end("a")
        rids = _requests_of(recorder, done.request_id)
        assert len(pcm_of(frames)) // 2 == _samples_of(engine, recorder, rids) > 0
        assert done.tokens == sum(len(recorder.outputs[r]) for r in rids)
        assert done.reason == "completed" and done.ttfa_ms > 0
        await client.send({"type": "speak", "id": "b", "text": "Hello at 24 kHz.",
                           "sample_rate": 24000, "options": {"seed": 6}})  # fmt: skip
        frames, done = await client.until_end("b")
        native = _samples_of(engine, recorder, _requests_of(recorder, done.request_id))
        assert abs(len(pcm_of(frames)) // 2 - native * 3 // 2) <= 2
        # incremental text, as an LLM writes it: each complete sentence is its own request
        await client.send(
            {"type": "speak", "id": "c", "text": "The first sentence", "final": False}
        )
        await client.send({"type": "append", "id": "c", "text": " is here. And the second"})
        await client.send({"type": "append", "id": "c", "text": " one follows"})
        await client.send({"type": "end", "id": "c"})
        frames, done = await client.until_end("c")
        rids = _requests_of(recorder, done.request_id)
        assert len(rids) >= 2 and len(pcm_of(frames)) // 2 == _samples_of(engine, recorder, rids)
    await _settled(engine, server)


async def test_cancel_and_disconnect_leave_no_unfinished_request(real):
    engine, _, server = real
    async with RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "long", "text": LONG})
        assert isinstance(await client.recv(), AudioFrame)
        await client.send({"type": "cancel", "id": "long"})
        _, done = await client.until_end("long")
        assert done.reason == "cancelled"
        await _settled(engine, server)
        for uid in ("x", "y"):
            await client.send({"type": "speak", "id": uid, "text": LONG})
        assert isinstance(await client.recv(), AudioFrame)
    await _settled(engine, server)  # the connection closed with two utterances in flight


# -- clients users already have ---------------------------------------------------------------
async def test_openai_python_client_streams_pcm_and_sse(real):
    engine, recorder, server = real
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused")
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Hello from the OpenAI client.", response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        pcm = b"".join([chunk async for chunk in response.iter_bytes()])
        rid = response.headers["x-request-id"]
    native = _samples_of(engine, recorder, _requests_of(recorder, rid))
    assert native > 0 and abs(len(pcm) // 2 - native * 3 // 2) <= 2  # 24 kHz, OpenAI's rate
    async with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="coral", input="And now as events.",
        response_format="pcm", stream_format="sse",
    ) as response:  # fmt: skip
        lines = [line async for line in response.iter_lines()]
        rid = response.headers["x-request-id"]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    assert {e["type"] for e in events} == {
        "speech.audio.delta",
        "speech.words",
        "speech.audio.done",
    }
    audio, words = b"", []
    for event in events:  # our speech.words events: each after the audio covering its words
        if event["type"] == "speech.audio.delta":
            audio += base64.b64decode(event["audio"])
        elif event["type"] == "speech.words":
            assert event["estimated"] is True
            assert all(w["end"] <= len(audio) / 2 / 24000 + 1e-4 for w in event["words"])
            words += event["words"]
    assert [w["word"] for w in words] == "And now as events.".split()
    assert [w["offset"] for w in words] == [0, 4, 8, 11]
    native = _samples_of(engine, recorder, _requests_of(recorder, rid))
    assert abs(len(audio) // 2 - native * 3 // 2) <= 2
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="OpenAI's default format is mp3."
    ) as response:  # no response_format: mp3, as OpenAI's
        assert response.headers["content-type"] == "audio/mpeg"
        mp3 = await response.read()
        rid = response.headers["x-request-id"]
    native = _samples_of(engine, recorder, _requests_of(recorder, rid))
    assert native * 3 // 2 <= decoded_samples(mp3, 24000) <= native * 3 // 2 + MP3_SLACK
    with pytest.raises(openai.BadRequestError, match="response_format 'ogg' is not supported"):
        await client.audio.speech.create(
            model="tts-1", voice="alloy", input="Hi", response_format="ogg"
        )
    await client.close()
    await _settled(engine, server)


async def test_pipecat_openai_tts_service_in_a_real_pipeline(real):
    engine, recorder, server = real
    before = set(recorder.outputs)
    down, up = await openai_tts_service_speaks(
        server.url, "Pipecat's own OpenAI service, pointed at Veena."
    )
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {24000}
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    native = _samples_of(engine, recorder, set(recorder.outputs) - before)
    assert abs(sum(len(f.audio) for f in audio) // 2 - native * 3 // 2) <= 2
    await _settled(engine, server)


@pytest.mark.parametrize(
    "model, response_format",
    [("tts-1", "pcm"), ("gpt-4o-mini-tts", "pcm"),  # raw audio, then SSE
     ("tts-1", None), ("tts-1", "opus")],  # the plugin's default (mp3), and Ogg Opus
)  # fmt: skip
async def test_livekit_openai_plugin(real, model, response_format):
    from livekit.plugins import openai as lk_openai

    engine, recorder, server = real
    before = set(recorder.outputs)
    extra_args = {"response_format": response_format} if response_format else {}
    tts = lk_openai.TTS(
        base_url=f"{server.url}/v1", api_key="unused", model=model, voice="alloy", **extra_args
    )
    try:
        frame = await tts.synthesize("LiveKit's OpenAI plugin, pointed at Veena.").collect()
    finally:
        await tts.aclose()
    native = _samples_of(engine, recorder, set(recorder.outputs) - before)
    assert frame.sample_rate == 24000 and native > 0
    samples = np.frombuffer(bytes(frame.data), dtype="<i2")
    # the plugin's emitter ends a synthesize() with one 10 ms frame of silence of its own
    extra = frame.samples_per_channel - native * 3 // 2
    if response_format == "pcm":
        assert -2 <= extra <= 240 + 2
        assert not samples[native * 3 // 2 + 2 :].any()
    else:  # a lossy codec's priming and padding on top (mp3's is not signalled in a stream)
        # LiveKit's decoder drops an Opus stream's last 20 ms (ours decodes to the exact length
        # with PyAV: test_encode); mp3 is exact or longer
        floor = -480 if response_format == "opus" else 0
        assert floor - 2 <= extra <= MP3_SLACK + 240
        assert np.abs(samples.astype(np.float32)).mean() > 10  # sound, not silence
    await _settled(engine, server)


# -- RemoteVeenaEngine ------------------------------------------------------------------------
async def test_remote_engine_under_the_pipecat_service(real):
    engine, recorder, server = real
    async with RemoteVeenaEngine(server.url) as remote:
        before = set(recorder.outputs)
        down, up = await run_test(
            VeenaTTSService(remote, seed=9),
            frames_to_send=[TTSSpeakFrame("Through the server and back.")],
            pipeline_params=PipelineParams(audio_out_sample_rate=16000),
        )
        audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
        assert sum(len(f.audio) for f in audio) // 2 == _samples_of(
            engine, recorder, set(recorder.outputs) - before
        ) > 0  # fmt: skip
        assert not [f for f in up if isinstance(f, ErrorFrame)]
        down, up = await run_test(
            VeenaTTSService(remote),
            frames_to_send=[
                TTSSpeakFrame(LONG),
                SleepFrame(0.6),
                InterruptionFrame(),
                SleepFrame(0.2),
                TTSSpeakFrame("After the interruption."),
            ],
            pipeline_params=PipelineParams(audio_out_sample_rate=8000),
        )
        last = max(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
        assert [f for f in down[last:] if isinstance(f, TTSAudioRawFrame)]
        assert not [f for f in up if isinstance(f, ErrorFrame)]
        await _settled(engine, server)  # the interruption reached the server as a cancel


async def test_remote_engine_under_livekit_veena_tts(real):
    from pipecat_veena.livekit import VeenaTTS

    engine, recorder, server = real
    async with RemoteVeenaEngine(server.url) as remote:
        tts = VeenaTTS(remote, seed=4)
        before = set(recorder.outputs)
        frame = await tts.synthesize("LiveKit over the remote engine.").collect()
        native = _samples_of(engine, recorder, set(recorder.outputs) - before)
        assert frame.sample_rate == engine.sample_rate and frame.samples_per_channel == native > 0
        assert tts.model == engine.model_name
    await _settled(engine, server)


class _WordRecorder:
    """The real engine, recording the words its streams' chunks carry (by request id)."""

    def __init__(self, inner: VeenaEngine) -> None:
        self.inner = inner
        self.words: dict[str, list[WordTiming]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def stream(self, text, voice=None, *, request_id=None, **kwargs):
        words = self.words.setdefault(request_id, [])
        async with aclosing(self.inner.stream(text, voice, request_id=request_id, **kwargs)) as c:
            async for chunk in c:
                words += chunk.words
                yield chunk


WORDS_TEXT = "Your OTP is 4821. आपका बिल ₹1,250 है।"


async def test_remote_engine_reports_the_in_process_words_to_pipecat_and_livekit(real):
    """Over the server (real sockets, real engine) RemoteVeenaEngine times words as the engine
    does in-process: the same words with the same times, and VeenaTTSService and LiveKit's
    VeenaTTS over it report them word by word, as they do over the in-process engine."""
    from livekit.agents import APIConnectOptions
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

    from pipecat_veena.livekit import VeenaTTS

    engine, recorder, server = real
    words_of = _WordRecorder(engine)
    async with serve_app(create_app(words_of, owns_engine=False)) as url:
        async with RemoteVeenaEngine(url, response_timeout_s=300) as remote:  # (slow machine)
            assert remote.times_words
            chunks = [c async for c in remote.stream(WORDS_TEXT, seed=5)]
            (served,) = words_of.words.values()
            got = [w for c in chunks for w in c.words]
            assert [(w.word, w.offset) for w in got] == [(w.word, w.offset) for w in served]
            assert [w.word for w in got] == WORDS_TEXT.split()
            for mine, theirs in zip(got, served, strict=True):  # (the wire keeps 0.1 ms)
                assert (mine.start, mine.end) == pytest.approx((theirs.start, theirs.end), abs=1e-4)
            local = [w async for c in engine.stream(WORDS_TEXT, seed=5) for w in c.words]
            assert [(w.word, w.offset) for w in local] == [(w.word, w.offset) for w in got]

            said = {}
            for name, tts_engine in (("in-process", engine), ("remote", remote)):
                down, up = await run_test(
                    VeenaTTSService(tts_engine, seed=5),
                    frames_to_send=[TTSSpeakFrame(WORDS_TEXT)],
                    pipeline_params=PipelineParams(audio_out_sample_rate=16000),
                )
                assert not [f for f in up if isinstance(f, ErrorFrame)]
                said[name] = [f.text.strip() for f in down if isinstance(f, TTSTextFrame)]
            assert said["remote"] == said["in-process"] == WORDS_TEXT.split()

            tts = VeenaTTS(remote, seed=5)
            assert tts.capabilities.aligned_transcript
            patient = APIConnectOptions(timeout=300)  # (a shared test machine can be slow)
            async with tts.stream(conn_options=patient) as stream:
                stream.push_text(WORDS_TEXT)
                stream.flush()
                frames = [ev async for ev in stream]
            seconds, timed = 0.0, []
            for ev in frames:
                seconds += ev.frame.duration
                for word in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                    assert word.end_time <= seconds + 0.011, f"{word!r} came before its audio"
                    timed.append(word.strip())
            assert timed == WORDS_TEXT.split()
    await _settled(engine, server)


class _Faulty:
    """The real engine, with injected faults: the first ``before`` streams fail before any
    audio, the next ``after`` fail after their first chunk. Everything else is delegated."""

    def __init__(self, inner: VeenaEngine, *, before: int = 0, after: int = 0) -> None:
        self.inner, self.before, self.after = inner, before, after
        self.streams = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def stream(self, text, voice=None, **kwargs):
        self.streams += 1
        if self.before > 0:
            self.before -= 1
            raise GenerationError("injected: failed before the first audio")
        fail = self.after > 0
        self.after -= fail
        async with aclosing(self.inner.stream(text, voice, **kwargs)) as chunks:
            async for chunk in chunks:
                yield chunk
                if fail:
                    raise GenerationError("injected: failed after the first audio")


async def test_retry_before_first_audio_on_another_server_and_clean_error_after(real):
    engine, recorder, server = real
    faulty = _Faulty(engine, before=1)
    broken = await ServerHandle(create_app(faulty, owns_engine=False)).start()
    try:
        async with RemoteVeenaEngine([broken.url, server.url]) as remote:
            before = set(recorder.outputs)
            pcm = b"".join([c.pcm async for c in remote.stream("Retried elsewhere.", seed=3)])
            assert faulty.streams == 1 and remote.stats()["retries"] == 1
            assert len(pcm) // 2 == _samples_of(engine, recorder, set(recorder.outputs) - before)
        async with RemoteVeenaEngine(broken.url) as remote:
            faulty.before = 1  # same server, retried once
            assert len(b"".join([c.pcm async for c in remote.stream("Retried here.")])) > 0
            faulty.after = 1
            down, up = await run_test(
                VeenaTTSService(remote),
                frames_to_send=[TTSSpeakFrame("This one breaks after its first audio.")],
                pipeline_params=PipelineParams(audio_out_sample_rate=16000),
            )
            errors = [f for f in up if isinstance(f, ErrorFrame)]
            # the client is told the code's line, never the server's exception text
            assert len(errors) == 1 and "generation failed on the server" in errors[0].error
            assert "injected" not in errors[0].error
            assert [f for f in down if isinstance(f, TTSAudioRawFrame)]
    finally:
        await broken.stop()
    await _settled(engine, server)


async def test_remote_engine_reconnects_after_a_server_restart(real):
    engine, recorder, server = real
    second = await ServerHandle(create_app(engine, owns_engine=False)).start()
    port = second.port
    remote = RemoteVeenaEngine(second.url, connect_timeout_s=30)
    try:
        await remote.start()
        assert len(b"".join([c.pcm async for c in remote.stream("Before.")])) > 0
        await second.stop(drain=True)
        second = await ServerHandle(create_app(engine, owns_engine=False), port=port).start()
        assert len(b"".join([c.pcm async for c in remote.stream("After the restart.")])) > 0
        assert remote.stats()["connects"] == 2
    finally:
        await remote.shutdown()
        await second.stop()
    await _settled(engine, server)


async def test_metrics_after_real_traffic(real):
    engine, _, server = real
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(
            "/v1/audio/speech", json={"input": "Metrics.", "response_format": "wav"}
        )
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        text = (await http.get("/metrics")).text
    assert "veena_engine_unfinished_requests 0.0" in text
    count = next(line for line in text.splitlines() if line.startswith(
        'veena_time_to_first_audio_seconds_count{api="http"}'))  # fmt: skip
    assert float(count.split()[-1]) >= 1
    assert 'veena_requests_total{api="ws",outcome="cancelled"}' in text


# -- the command ----------------------------------------------------------------------------
async def test_serve_command_drains_on_sigterm_and_leaves_nothing_behind(
    spark_tiny_checkpoint, tmp_path
):
    """One server process with its own engine: SIGTERM mid-utterance drains it (ready 503, new
    streams refused, the in-flight one completes), then it exits 0 and its engine is gone.

    The same process checks ``serve --log-format json`` (one engine start for both): every line
    of its stderr and stdout is JSON (its ``ready``, ``playground`` and ``stopped`` lines were
    plain text on stdout), and the engine's line about an utterance carries the WebSocket speak
    id as request_id; and a ``--voice-map`` whose target was deleted, with a corrupt entry in
    its ``--voices-file``: the server starts (warnings) and the alias answers unknown_voice
    saying why (both were serve processes of their own in test_observability_real.py and
    test_voice_owners_real.py)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out, log = tmp_path / "out.log", tmp_path / "err.log"
    # `--voice-map alloy=asha` after `asha` was deleted, and a corrupt entry in the voices file:
    # the server starts (warnings), and `alloy` answers unknown_voice saying why
    voices = tmp_path / "voices.json"
    voices.write_text(json.dumps({"format": PRINTS_FORMAT, "voices": {}, "enrolled": {
        "ravi": {"globals": [5] * 32}, "broken": {"globals": [1, 2, 3]}}}))  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_veena.cli", "serve", "--model", str(spark_tiny_checkpoint),
        "--port", str(port), "--drain-timeout", "120", "--log-format", "json",
        "--voice-map", "alloy=asha,echo=ravi", "--voices-file", str(voices),
        stdout=out.open("w"), stderr=log.open("w"), env=env, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    children: list[psutil.Process] = []
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            await until_ready(http, proc, log)
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children, "the vLLM engine process should be a child of the server"
            body = {"input": "Hello.", "voice": "alloy", "response_format": "pcm"}
            off = await http.post("/v1/audio/speech", json=body, timeout=60)
            assert off.status_code == 400 and off.json()["error"]["code"] == "unknown_voice"
            assert "'alloy' maps to 'asha'" in off.json()["error"]["message"]
            body["voice"] = "echo"  # the other alias, to an enrolled voice that is there
            assert (await http.post("/v1/audio/speech", json=body, timeout=60)).status_code == 200
            async with RawClient.connect(f"ws://127.0.0.1:{port}/v1/audio/stream") as client:
                # a cap on tokens well under what the text asks (22 ids, 88 semantic tokens):
                # the engine warns (at the default level) that it cut the part
                speak = {"type": "speak", "id": "json-7", "text": "Logged as JSON, cut short.",
                         "options": {"max_tokens": 40}}  # fmt: skip
                await client.send(speak)
                assert (await client.until_end("json-7"))[1].warning == "token_cap"
                await client.send({"type": "speak", "id": "inflight", "text": LONG * 3})
                assert isinstance(await client.recv(), AudioFrame)
                proc.send_signal(signal.SIGTERM)
                for _ in range(200):  # the drain begins
                    r = await http.get("/ready")
                    if r.status_code == 503:
                        break
                    await asyncio.sleep(0.02)
                assert r.json()["status"] == "server_draining"
                await client.send({"type": "speak", "id": "late", "text": "Too late."})
                ends = {}
                while len(ends) < 2:
                    message = await client.recv(wait_s=120)
                    if not isinstance(message, AudioFrame | GoAway):
                        ends[message.id] = message
                assert ends["late"].code == ErrorCode.SERVER_DRAINING
                assert ends["inflight"].type == "done" and ends["inflight"].reason == "completed"
                assert await client.closed(wait_s=60) == CLOSE_GOING_AWAY  # after its done
        await asyncio.wait_for(proc.wait(), 120)
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert_ended(children)
    finally:
        await kill_leftovers(proc, children)
    said = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [m["event"] for m in said] == ["ready", "playground", "stopped"], said
    assert said[0]["message"].startswith("ready: ") and said[0]["ws_url"].startswith("ws://")
    assert said[-1]["status"] == 0
    records = []
    for line in log.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line)["record"])  # raises on a line that is not JSON
    messages = [r["message"] for r in records]
    assert any("speech server: ready" in m for m in messages), messages
    about = [r for r in records if r["extra"].get("request_id") == "json-7"]
    assert any("hit the runaway cap" in r["message"] for r in about), messages
    assert any("voice map alloy=asha" in m for m in messages), messages
    assert any("'broken' skipped" in m for m in messages), messages


async def test_serve_command_writes_no_key_and_no_variable_to_its_log(
    spark_tiny_checkpoint, tmp_path
):
    """``pipecat-veena serve -v`` with a key file: the report's trigger (a repetition_penalty of
    Infinity, which vLLM raises on: ``internal``, or ``bad_options`` once options are checked
    for it) on both APIs, the key in a WebSocket URL, bad keys, a cut-off body, invalid UTF-8
    and two SIGTERMs. The key appears nowhere in the log, no traceback shows variables (on the
    old main its CLI frame showed ``ServerSettings(api_keys=...)``), and nothing a client did is
    an ERROR."""
    import socket

    key = "sk-veena-real-5c1d9e7a"
    keys = tmp_path / "keys"
    keys.write_text(f"alice {key}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_veena.cli", "serve", "--model", str(spark_tiny_checkpoint),
        "--port", str(port), "--api-key-file", str(keys), "-v",
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    bearer = {"Authorization": f"Bearer {key}"}
    infinite = {"repetition_penalty": float("inf")}
    ws_url = f"ws://127.0.0.1:{port}/v1/audio/stream"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=bearer) as http:
            await until_ready(http, proc, log)
            async with RawClient.connect(f"{ws_url}?api_key={key}") as client:
                speak = {"type": "speak", "id": "inf", "text": "Hi.", "options": infinite}
                await client.send(speak)
                _, end = await client.until_end("inf")
                assert end.code in (ErrorCode.INTERNAL, ErrorCode.BAD_OPTIONS), end
                assert "Traceback" not in end.message and "vllm" not in end.message.lower()
            body = json.dumps({"input": "Hi.", **infinite})  # (httpx's json= refuses Infinity)
            r = await http.post("/v1/audio/speech", content=body)
            assert r.status_code in (400, 500), r.text
            r = await http.post("/v1/audio/speech", json={"input": "Hi."}, headers={
                "Authorization": f"Bearer {key}x"})  # fmt: skip
            assert r.status_code == 401
            async with RawClient.connect(f"{ws_url}?api_key={key}x", ready=False) as refused:
                assert (await refused.recv()).code == ErrorCode.UNAUTHORIZED
            await cut_off_body(port, bearer)
            await send_invalid_utf8(port, f"/v1/audio/stream?api_key={key}")
            async with RawClient.connect(ws_url, api_key=key) as client:
                await client.send({"type": "speak", "id": "long", "text": LONG * 3})
                assert isinstance(await client.recv(), AudioFrame)
                proc.send_signal(signal.SIGTERM)
                for _ in range(200):
                    if "draining" in log.read_text():
                        break
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                assert await client.closed(wait_s=60) in (1000, 1001, 1006, 1012)
        await asyncio.wait_for(proc.wait(), 120)
    finally:
        await kill_leftovers(proc, [])
    text = log.read_text()
    assert text.count(key) == 0, [line for line in text.splitlines() if key in line]
    assert "api_key=<redacted>" in text  # uvicorn logged the URL, without its key
    assert "└ " not in text, "a traceback printed variables"
    errors = [line for line in text.splitlines() if "ERROR" in line]
    assert all("speech server: utterance" in line for line in errors), errors
    assert "ClientDisconnect" not in text and "Application shutdown complete" in text
