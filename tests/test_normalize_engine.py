"""Normalisation through the real engine (vLLM CPU on the demo Spark checkpoint) and a real Pipecat
pipeline: the model's prompt carries the spoken words and no digits, a request can turn it off,
and Pipecat still reports the user's original text as spoken (TTSTextFrame). Long text is made
ready off the event loop."""

from __future__ import annotations

import re
import threading
from contextlib import aclosing

import pytest
import pytest_asyncio
from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame, TTSTextFrame
from pipecat.tests.utils import run_test
from recording import RecordingGenerator

import pipecat_veena.normalize.ssml as ssml_module
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine.formats import load_tokenizer
from pipecat_veena.normalize import normalize
from pipecat_veena.service import VeenaTTSService

pytestmark = pytest.mark.vllm

TEXT = "आपका बिल ₹1,250 है, 05/08/2025 तक भुगतान करें।"
SPOKEN = "आपका बिल एक हज़ार दो सौ पचास रुपये है, पाँच अगस्त दो हज़ार पच्चीस तक भुगतान करें।"
#: The text of a prompt: after the start marker and any speaker tag, up to the end marker.
_CONTENT = re.compile(r"<\|start_content\|>(?:<\|[^<>|]*\|>)*(.*?)<\|end_content\|>", re.S)


@pytest_asyncio.fixture(scope="module")
async def engine(spark_tiny_checkpoint, spark_generator):
    recorder = RecordingGenerator(spark_generator)
    engine = VeenaEngine(
        EngineConfig(
            checkpoint=spark_tiny_checkpoint,
            warmup=False,
            lexicon={"en": {"EMI": "E M I"}},
        ),
        generator=recorder,
    )
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer(spark_tiny_checkpoint):
    return load_tokenizer(spark_tiny_checkpoint / "LLM")


def _prompt_texts(engine: VeenaEngine, tokenizer, request_id: str) -> list[str]:
    """The text inside each prompt of the engine requests started with ``request_id``."""
    prompts = engine._generator.prompts
    rids = sorted(
        (r for r in prompts if r.startswith(f"{request_id}-")),
        key=lambda r: int(r.rsplit("-", 1)[1]),
    )
    texts = []
    for rid in rids:
        decoded = tokenizer.decode(prompts[rid], skip_special_tokens=False)
        texts.extend(_CONTENT.findall(decoded))
    return texts


async def _speak(engine: VeenaEngine, text: str, request_id: str, **options) -> int:
    chunks = [c async for c in engine.stream(text, request_id=request_id, seed=1, **options)]
    return sum(c.num_samples for c in chunks)


async def test_prompt_has_the_words_and_no_digits(engine, tokenizer):
    assert await _speak(engine, TEXT, "norm-on") > 0
    (content,) = _prompt_texts(engine, tokenizer, "norm-on")
    assert content == SPOKEN
    assert not re.search(r"[0-9०-९₹]", content)


async def test_a_request_can_turn_it_off_or_force_a_language(engine, tokenizer):
    await _speak(engine, TEXT, "norm-off", normalize=False)
    assert _prompt_texts(engine, tokenizer, "norm-off") == [TEXT]
    await _speak(engine, "Your EMI is ₹500.", "norm-hi", language="hi")
    assert _prompt_texts(engine, tokenizer, "norm-hi") == ["Your EMI is पाँच सौ रुपये."]
    await _speak(engine, "Your EMI is ₹500.", "norm-en")
    assert _prompt_texts(engine, tokenizer, "norm-en") == ["Your E M I is five hundred rupees."]


async def test_bad_language_is_refused_before_any_work(engine):
    with pytest.raises(ValueError, match="language"):
        await _speak(engine, TEXT, "norm-bad", language="fr")
    with pytest.raises(ValueError, match="language"):
        engine.check_options(language="fr")
    engine.check_options(normalize=False, language="hi", temperature=0.7)
    assert not any(r.startswith("norm-bad-") for r in engine._generator.prompts)


async def test_pipecat_reports_the_original_text_while_the_model_reads_words(engine, tokenizer):
    down, up = await run_test(
        VeenaTTSService(engine, seed=2),
        frames_to_send=[TTSSpeakFrame(TEXT)],
    )
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    said = " ".join(f.text for f in down if isinstance(f, TTSTextFrame))
    assert said.split() == TEXT.split()
    (context_id,) = {f.context_id for f in down if isinstance(f, TTSTextFrame)}
    assert _prompt_texts(engine, tokenizer, context_id) == [SPOKEN]


async def test_long_text_is_normalised_off_the_event_loop(engine, monkeypatch):
    """16 KB of numbers and codes take about 0.2 s to normalise (10 us a character): that runs in
    a worker thread, not on the loop (it stalled every stream and the probes); a sentence stays
    on the loop. The real normaliser runs; the spy only notes the thread it runs on."""
    threads: list[int] = []

    def spy(*args, **kwargs):
        threads.append(threading.get_ident())
        return normalize(*args, **kwargs)

    monkeypatch.setattr(ssml_module, "normalize", spy)  # (the engine's parts: speech_parts)
    long = "Call (022) 2345 6789 or 1800-123-4567, ref 48 29 13, ₹1,250 on 05/08/2025. " * 220
    ran_on = {}
    for name, text in (("long", long), ("sentence", TEXT)):
        threads.clear()
        async with aclosing(engine.stream(text, request_id="norm-long", seed=1)) as chunks:
            await anext(chunks)  # the text was normalised and split before the first chunk
        ran_on[name] = set(threads)  # (the engine normalises sentence by sentence)
    loop = threading.get_ident()
    assert ran_on["long"] and loop not in ran_on["long"], ran_on
    assert ran_on["sentence"] == {loop}, ran_on
