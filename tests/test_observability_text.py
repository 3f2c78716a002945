"""No caller text in logs or spans unless the operator turns it on (``EngineConfig.log_text``,
``pipecat-veena serve --log-text``).

A no-audio failure used to put the first 60 characters of the caller's text into the server's
WARNING line and into both spans' recorded exception. Here a real server over the real engine
(vLLM CPU on the demo checkpoint) fails an utterance that way (``max_tokens: 1`` cannot reach
an audio token under the codec grammar), with a loguru sink and an in-memory span exporter
watching: by default neither holds the text, only its length and hash; turned on, both do.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from loguru import logger
from otel import by_name, collect
from server_fakes import RawClient

from pipecat_veena import tracing
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.logs import caller_text
from pipecat_veena.server import ServerHandle, ServerSettings, create_app

SECRET = "My card number is four two four two, call me Priya."


def test_caller_text_is_its_length_and_a_keyed_hash_unless_shown():
    hidden = caller_text(SECRET)
    assert "Priya" not in hidden and f"{len(SECRET)} characters" in hidden
    assert caller_text(SECRET) == hidden != caller_text(SECRET + "!")  # equal texts match
    assert caller_text(SECRET, show=True) == repr(SECRET)
    assert caller_text("x" * 100, show=True) == repr("x" * 60) + "..."
    assert "characters" in caller_text("\ud800 lone surrogate")  # any str, no error


@pytest_asyncio.fixture(scope="module", params=[False, True], ids=["default", "log_text"])
async def served(request, spark_tiny_checkpoint, spark_generator):
    config = EngineConfig(
        checkpoint=spark_tiny_checkpoint, warmup=False, pin_voices=False, log_text=request.param
    )
    engine = VeenaEngine(config, generator=spark_generator)
    await engine.start()
    handle = await ServerHandle(create_app(engine, ServerSettings(), owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        yield request.param, handle
    finally:
        await handle.stop()
        await engine.shutdown()


def _span_texts(span) -> list[str]:
    """Every string a span carries: attributes, events' attributes (the exception's message)."""
    texts = [str(v) for v in span.attributes.values()]
    for event in span.events:
        texts += [str(v) for v in (event.attributes or {}).values()]
    return texts + [span.status.description or ""]


@pytest.mark.vllm
async def test_a_no_audio_failure_logs_and_traces_caller_text_only_when_turned_on(served):
    shown, server = served
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG")
    try:
        with collect() as spans:
            async with RawClient.connect(server.ws_url) as client:
                await client.send({"type": "speak", "id": "t", "text": SECRET,
                                   "options": {"max_tokens": 1}})  # fmt: skip
                _, end = await client.until_end("t")
    finally:
        logger.remove(sink)
    assert end.type == "error" and end.code == "no_audio", end
    finished = spans.get_finished_spans()
    (engine_span,) = by_name(finished, tracing.UTTERANCE_SPAN)
    (server_span,) = by_name(finished, tracing.SERVER_SPAN)
    warning = [line for line in lines if "no audio for speakable text" in line]
    assert warning, lines  # the server's WARNING about the failure
    recorded = _span_texts(engine_span)
    assert any("no audio for speakable text" in t for t in recorded), recorded
    everything = lines + recorded + _span_texts(server_span)
    leaked = [t for t in everything if "card number" in t]
    if shown:
        assert any("card number" in line for line in warning)
        assert any("card number" in t for t in recorded)
    else:
        assert not leaked, leaked
        assert any(caller_text(SECRET) in line for line in warning)
