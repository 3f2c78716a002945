"""OpenTelemetry spans of the engine (scripted generator, numpy codec: see engine_fakes.py), the
``speak.traceparent`` field, and a process without OpenTelemetry (nothing imported, same audio).
The same spans through the real vLLM engine, Pipecat, LiveKit, the server and RemoteVeenaEngine
are in test_tracing_real.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path

import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from otel import by_name, collect, events, parent_of

from pipecat_veena import tracing
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import NoAudioError
from pipecat_veena.remote.protocol import (
    ErrorCode,
    ProtocolError,
    Speak,
    parse_client_message,
    to_json,
)
from pipecat_veena.streaming import StreamConfig

IDS = spark_ids()
VOICE = list(range(40, 72))
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _engine(tmp_path, script) -> VeenaEngine:
    cfg = EngineConfig(
        checkpoint=make_checkpoint(tmp_path),
        warmup=False,
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=16),
    )
    engine = VeenaEngine(cfg, generator=ScriptedGenerator(script), codec=FakeBiCodec())
    await engine.start()
    return engine


async def test_one_span_per_utterance_with_its_milestones_and_figures(tmp_path):
    engine = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=57))
    text = "Hello world. A second sentence here."
    with collect() as spans:
        with trace.get_tracer("bot").start_as_current_span("turn") as turn:
            chunks = [c async for c in engine.stream(text, "female", request_id="t1")]
    await engine.shutdown()
    finished = spans.get_finished_spans()
    (span,) = by_name(finished, tracing.UTTERANCE_SPAN)
    assert parent_of(finished, span).context.span_id == turn.get_span_context().span_id
    a = span.attributes
    assert a["veena.request_id"].startswith("t1-") and a["veena.voice"] == "female"
    assert a["veena.model"] == engine.model_name and a["veena.characters"] == len(text)
    assert a["veena.tokens"] == chunks[-1].tokens and a["veena.prompt_tokens"] > 0
    audio_s = sum(len(c.pcm) for c in chunks) / 2 / 16000
    assert a["veena.audio_seconds"] == pytest.approx(audio_s)
    assert 0 <= a["veena.queue_seconds"] <= a["veena.ttfa_seconds"]
    assert a["veena.ttfa_seconds"] * 1e9 <= span.end_time - span.start_time
    assert "veena.real_time_margin_seconds" in a and len(chunks) > 2
    assert a["veena.cancelled"] is False and "veena.cut" not in a
    names = events(span)
    parts = a["veena.parts"]
    assert names.count("prompt") == names.count("part") == parts
    assert names.index("prompt") < names.index("first_token") < names.index("first_audio")
    assert names[-1] == "part"
    assert span.status.status_code == StatusCode.UNSET


async def test_a_closed_stream_is_cancelled_and_a_failure_is_an_error(tmp_path):
    engine = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=200))
    with collect() as spans:
        async with aclosing(engine.stream("Hello world.")) as chunks:
            await anext(chunks)
    (span,) = by_name(spans.get_finished_spans(), tracing.UTTERANCE_SPAN)
    assert span.attributes["veena.cancelled"] is True and events(span)[-1] == "abort"
    assert span.status.status_code == StatusCode.UNSET
    await engine.shutdown()

    def eos_only(prompt, options):
        return [IDS.marker("start_global_token"), *IDS.global_ids(VOICE),
                IDS.marker("end_global_token"), IDS.eos]  # fmt: skip

    engine = await _engine(tmp_path, eos_only)
    with collect() as spans, pytest.raises(NoAudioError):
        _ = [c async for c in engine.stream("Hello.")]
    (span,) = by_name(spans.get_finished_spans(), tracing.UTTERANCE_SPAN)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["veena.cancelled"] is False
    assert "exception" in events(span)
    await engine.shutdown()


async def test_no_span_recorded_unless_a_provider_samples(tmp_path):
    """Outside ``collect()`` the global provider drops every span: the engine keeps no trace."""
    assert tracing.utterance("r", "v", "m", 1, 1) is None
    with collect():
        assert tracing.utterance("r", "v", "m", 1, 1) is not None


def test_traceparent_follows_the_current_span():
    assert tracing.traceparent() is None  # no span
    with collect(), trace.get_tracer("bot").start_as_current_span("turn") as turn:
        ctx = turn.get_span_context()
        assert tracing.traceparent().startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
        span = tracing.server_span(TRACEPARENT, {"veena.api": "ws"})
    assert span.parent.trace_id == int(TRACEPARENT.split("-")[1], 16)
    assert span.parent.span_id == int(TRACEPARENT.split("-")[2], 16) and span.parent.is_remote


def test_speak_carries_a_w3c_traceparent():
    msg = parse_client_message(json.dumps({"type": "speak", "id": "a", "text": "Hi.",
                                           "traceparent": TRACEPARENT}))  # fmt: skip
    assert msg == Speak(id="a", text="Hi.", traceparent=TRACEPARENT)
    assert "traceparent" not in json.loads(to_json(Speak(id="a", text="Hi.")))
    assert json.loads(to_json(msg))["traceparent"] == TRACEPARENT
    for bad in ("00-xyz", TRACEPARENT.upper(), 7):
        with pytest.raises(ProtocolError) as e:
            parse_client_message(json.dumps({"type": "speak", "id": "a", "text": "Hi.",
                                             "traceparent": bad}))  # fmt: skip
        assert e.value.code == ErrorCode.BAD_MESSAGE and "traceparent" in str(e.value)


_WITHOUT_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
sys.path.insert(0, {tests!r})
from pathlib import Path
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from pipecat_veena import tracing
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.streaming import StreamConfig

async def main():
    ids = spark_ids()
    cfg = EngineConfig(checkpoint=make_checkpoint(Path({tmp!r})), warmup=False,
                       stream=StreamConfig(first_frames=4, lookahead_frames=4))
    script = well_formed(ids, voice_globals=list(range(40, 72)), semantics=57)
    engine = VeenaEngine(cfg, generator=ScriptedGenerator(script), codec=FakeBiCodec())
    await engine.start()
    pcm = b"".join([c.pcm async for c in engine.stream("Hello world.")])
    await engine.shutdown()
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m])
    print(len(pcm), tracing.available(), tracing.traceparent(), loaded)

asyncio.run(main())
"""


def test_without_opentelemetry_nothing_is_imported_and_the_audio_is_the_same(tmp_path):
    code = _WITHOUT_OTEL.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == f"{57 * 320 * 2} False None []"
