"""Word timings through the real engine and a real Pipecat pipeline that plays in real time.

The engine reports the words of the text as written, each once its audio exists; the service
hands them to Pipecat's word-timestamp path, so that when the caller interrupts, Pipecat's own
``LLMAssistantAggregator`` keeps the words that had played: not the whole sentence, not nothing.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest
import pytest_asyncio
from server_fakes import RawClient, serving
from test_word_offsets import utf16_slice, words_until_done

from benchmarks.interruption import ENGLISH, HINDI, MIXED, interrupted_turn, judge, kept_words
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.text import utf16_length
from pipecat_veena.timing import split_words

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module")
async def engine(spark_tiny_checkpoint, spark_generator):
    engine = VeenaEngine(EngineConfig(checkpoint=spark_tiny_checkpoint), generator=spark_generator)
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_engine_reports_written_words_once_their_audio_exists(engine):
    """Every written word (₹1,250 is one), in order, inside the audio, never ahead of it."""
    text = "Hello there, your OTP is 4821. आपका बिल ₹1,250 है। Please pay by Monday, thank you."
    small = VeenaEngine(
        EngineConfig(checkpoint=engine.config.checkpoint, max_part_chars=40, warmup=False),
        generator=engine._generator,
    )
    await small.start()
    try:
        seconds, words = 0.0, []
        async for chunk in small.stream(text, seed=11):
            seconds += chunk.duration
            for w in chunk.words:
                assert w.end <= seconds + 1e-3, f"{w.word!r} reported before its audio existed"
            words += chunk.words
    finally:
        await small.shutdown()
    assert [w.word for w in words] == [text[a:b] for a, b in split_words(text)]
    assert "₹1,250" in [w.word for w in words]
    starts = [w.start for w in words]
    assert starts == sorted(starts) and starts[0] >= 0.0
    assert all(w.start <= w.end for w in words)
    assert words[-1].end <= seconds + 1e-3
    assert words[-1].end > 0.5 * seconds  # spread over the utterance, not bunched at its start
    assert [text[w.offset : w.offset + len(w.word)] for w in words] == [w.word for w in words]


async def test_whole_turn_without_interruption_is_in_context(engine):
    """Every word (of a sentence the loop guard cut short, those it timed: ``judge``)."""
    said, spoken, played = await interrupted_turn(engine, MIXED, None)
    assert len(spoken.cut) < len(spoken.sentences)
    assert said == kept_words(MIXED, spoken)
    assert spoken.seconds > 0.5 and played == pytest.approx(spoken.seconds, abs=0.05)


@pytest.mark.parametrize("text", [ENGLISH, HINDI, MIXED], ids=["en", "hi", "mixed"])
async def test_interrupted_turn_keeps_the_words_that_played(engine, text):
    """Four random moments per language: the context holds the played words, within one word,
    never one that had not started playing (on the old service the interrupted sentence was
    missing entirely)."""
    rng = random.Random(len(text))
    failures = []
    moments = [rng.uniform(0.1, 5.0) for _ in range(4)]
    for at in moments:
        said, spoken, played = await interrupted_turn(engine, text, at)
        problem = judge(said, text, spoken, played, strict=False)
        if problem:
            failures.append(f"interrupt at {at:.2f} s ({played:.2f} s played): {problem}")
    assert not failures, "\n".join(failures)


async def test_server_word_offsets_point_into_the_text_as_sent(engine):
    """Through the real server (real sockets) on the real engine, over the WebSocket and SSE:
    every reported word is ``text[offset:offset + len(word)]`` of the text as sent, and
    ``offset_utf16`` indexes it as JavaScript does, through emoji, CRLF and blank lines, runs of
    spaces, decomposed accents and Devanagari (before: offsets into the normalised text)."""
    text = (
        "Hello 👋 there!\r\n\r\nCafe\u0301 is   open, 😀😀 come in. "
        "आपका \u0958िला बिल ₹1,250 है।\n\n\tThanks 🙏🏽 a lot."
    )
    options = {"seed": 7}
    async with serving(engine) as server:
        async with RawClient.connect(server.ws_url) as client:
            await client.send(
                {"type": "speak", "id": "o", "text": text, "words": True, "options": options}
            )
            ws_words, end = await words_until_done(client, "o")
        assert end.type == "done", end
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm",
                    "stream_format": "sse", "seed": 7}  # fmt: skip
            response = await http.post("/v1/audio/speech", json=body)
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    sse_words = [w for e in events if e["type"] == "speech.words" for w in e["words"]]
    written = [(a, text[a:b]) for a, b in split_words(text)]
    for words in (ws_words, sse_words):
        assert words, "no word timings came"
        for w in words:
            assert text[w["offset"] : w["offset"] + len(w["word"])] == w["word"], w
            assert utf16_slice(text, w["offset_utf16"], utf16_length(w["word"])) == w["word"], w
        # the caller's words, in order (a part the loop guard cut short reports none)
        reported = [(w["offset"], w["word"]) for w in words]
        assert reported == [pair for pair in written if pair in reported]
    assert any(w["offset_utf16"] > w["offset"] for w in ws_words)  # (past an emoji)
