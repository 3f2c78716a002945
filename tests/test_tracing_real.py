"""One trace from the bot to the engine, through the real parts: the real engine (vLLM CPU on the
demo checkpoint) in-process under a Pipecat pipeline (``enable_tracing``) and under LiveKit's
VeenaTTS, and behind a real server on real sockets reached by RemoteVeenaEngine (WebSocket,
``speak.traceparent``) and by HTTP (``traceparent`` header). Spans are read from an in-memory
exporter (tests/otel.py).
"""

from __future__ import annotations

import httpx
import pytest
import test_observability_real
from opentelemetry import trace
from otel import by_name, collect, events, parent_of, pipeline_says
from server_fakes import until

from pipecat_veena import tracing
from pipecat_veena.remote import RemoteVeenaEngine

pytestmark = pytest.mark.vllm

served = test_observability_real.served  # (engine, server): the real engine behind a server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _check_engine_span(span) -> None:
    a = span.attributes
    assert a["veena.tokens"] > 0 and a["veena.audio_seconds"] > 0
    assert 0 <= a["veena.queue_seconds"] <= a["veena.ttfa_seconds"]
    assert a["veena.ttfa_seconds"] * 1e9 <= span.end_time - span.start_time
    assert a["veena.cancelled"] is False and "veena.real_time_margin_seconds" in a
    names = events(span)
    assert names.index("prompt") < names.index("first_token") < names.index("first_audio")


async def test_pipecat_tts_span_holds_the_engines_utterance(served):
    engine, _ = served
    with collect() as spans:
        assert await pipeline_says(engine, "Tracing one turn.") > 0
    finished = spans.get_finished_spans()
    (tts,) = by_name(finished, "tts")
    (utterance,) = by_name(finished, tracing.UTTERANCE_SPAN)
    assert parent_of(finished, utterance) is tts
    assert tts.attributes["gen_ai.request.model"] == engine.model_name
    assert tts.attributes["metrics.character_count"] == len("Tracing one turn.")
    _check_engine_span(utterance)


async def test_one_trace_from_the_bot_through_the_server_to_the_engine(served):
    """Pipecat's ``tts`` span -> the server's ``veena.speech`` -> the engine's utterance."""
    _, server = served
    async with RemoteVeenaEngine(server.url) as remote:
        with collect() as spans:
            assert await pipeline_says(remote, "Across the wire.") > 0
    finished = spans.get_finished_spans()
    (tts,) = by_name(finished, "tts")
    (speech,) = by_name(finished, tracing.SERVER_SPAN)
    (utterance,) = by_name(finished, tracing.UTTERANCE_SPAN)
    assert parent_of(finished, utterance) is speech and parent_of(finished, speech) is tts
    assert speech.parent.is_remote and speech.kind == trace.SpanKind.SERVER
    assert len({s.context.trace_id for s in (tts, speech, utterance)}) == 1
    assert tts.start_time <= speech.start_time <= utterance.start_time
    assert utterance.end_time <= speech.end_time
    assert speech.attributes["veena.api"] == "ws" and speech.attributes["veena.outcome"] == (
        "completed"
    )
    # the server's first audio comes after the engine's, within the server span
    assert speech.attributes["veena.ttfa_seconds"] >= utterance.attributes["veena.ttfa_seconds"]
    _check_engine_span(utterance)


async def test_http_speech_continues_the_traceparent_header(served):
    _, server = served
    with collect() as spans:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            r = await http.post(
                "/v1/audio/speech",
                json={"input": "Traced over HTTP."},
                headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
            )
        assert r.status_code == 200 and r.content
        # the server closes its utterance once the response is sent: a moment after the client
        await until(lambda: by_name(spans.get_finished_spans(), tracing.SERVER_SPAN))
    finished = spans.get_finished_spans()
    (speech,) = by_name(finished, tracing.SERVER_SPAN)
    (utterance,) = by_name(finished, tracing.UTTERANCE_SPAN)
    assert speech.context.trace_id == int(TRACE_ID, 16)
    assert speech.parent.span_id == int(PARENT_ID, 16)
    assert parent_of(finished, utterance) is speech and speech.attributes["veena.api"] == "http"


async def test_livekit_tts_request_holds_the_engines_utterance(served):
    from livekit.agents import APIConnectOptions

    from pipecat_veena.livekit import VeenaTTS

    engine, _ = served
    tts = VeenaTTS(engine, seed=5)
    with collect() as spans:
        options = APIConnectOptions(max_retry=0, timeout=120)  # first audio on a loaded CPU
        frame = await tts.synthesize("LiveKit traces too.", conn_options=options).collect()
    assert frame.duration > 0
    finished = spans.get_finished_spans()
    (run,) = by_name(finished, "tts_request_run")
    (utterance,) = by_name(finished, tracing.UTTERANCE_SPAN)
    assert parent_of(finished, utterance) is run
    assert run.parent is not None  # LiveKit's tts_request (ended by LiveKit later)
    _check_engine_span(utterance)
