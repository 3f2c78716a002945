"""Word offsets point into the caller's text exactly as sent (issue 37 item 4).

The engine splits and times the normalised text (NFC, white space folded, control strings
dropped); the offsets it reports, and the words, are the caller's: ``text[offset:offset +
len(word)] == word`` for every word, in Python code points, and the speech server adds
``offset_utf16`` (JavaScript string indices) to the words it sends. Before, the offsets counted
the normalised text: each blank line, CRLF or run of spaces, each decomposed accent moved every
later word, and each emoji moved a browser's by one more.

Units here (``SourceWords``), the engine on fakes (scripted generator, numpy codec), and the real
server (real sockets) over a fake engine; the real engine through the real server is in
test_words_real.py.
"""

from __future__ import annotations

import json
import unicodedata

import httpx
import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from server_fakes import FakeSpeechEngine, RawClient, serving

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.streaming import StreamConfig
from pipecat_veena.text import normalize, utf16_length
from pipecat_veena.timing import SourceWords, split_words

EMOJI = "Hi 👋 there 😀! Your OTP 😀😀 is 4821. Thanks 🙏🏽 a lot."
CRLF = "First line.\r\n\r\nSecond   line,\twith tabs.\n\n\n  Third\u00a0line.\r\n"
DECOMPOSED = "Cafe\u0301 au lait, re\u0301sume\u0301 e\u0301te\u0301. Ångström \u212bngstro\u0308m."
# क़ as U+0958 (NFC decomposes it: it is excluded from composition), ऩ as न + nukta (NFC
# composes it), and plain Devanagari with a danda.
DEVANAGARI = "आपका \u0958िला \u0928\u093cया है। बिल ₹1,250 है।\n\nधन्यवाद 🙏!"
TEXTS = {"emoji": EMOJI, "crlf": CRLF, "decomposed": DECOMPOSED, "devanagari": DEVANAGARI}


def utf16_slice(text: str, start: int, length: int) -> str:
    """``text.slice(start, start + length)`` as JavaScript reads it (UTF-16 indices)."""
    units = text.encode("utf-16-le", "surrogatepass")
    return units[2 * start : 2 * (start + length)].decode("utf-16-le", "surrogatepass")


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_source_words_finds_each_normalised_word_in_the_callers_text(text):
    normalised = normalize(text)
    assert normalised != text or text == EMOJI  # (emoji change only the UTF-16 indices)
    finder = SourceWords(text)
    spans = [finder.find(normalised[a:b]) for a, b in split_words(normalised)]
    assert spans == split_words(text)  # the caller's words, in order, each where it is
    for (a, b), (na, nb) in zip(spans, split_words(normalised), strict=True):
        assert unicodedata.normalize("NFC", text[a:b]) == normalised[na:nb]


def test_source_words_skips_control_strings_and_gives_up_on_a_stranger():
    text = "<|task_tts|>Hello<|end_content|>world  again"
    finder = SourceWords(text)
    assert finder.find("Hello") == (12, 17)
    assert finder.find("world") == (32, 37)
    assert finder.find("missing") is None  # not there: the cursor stays
    assert finder.find("again") == (39, 44)


def test_utf16_length_counts_surrogate_pairs():
    assert utf16_length("abc") == 3
    assert utf16_length("😀") == 2 and len("😀") == 1
    assert utf16_length("🙏🏽") == 4
    assert utf16_length("e\u0301") == 2 and utf16_length("नमस्ते") == 6


# -- the engine (fakes) ------------------------------------------------------------------------
async def _engine(tmp_path) -> VeenaEngine:
    script = well_formed(spark_ids(), voice_globals=list(range(40, 72)), semantics=30)
    config = EngineConfig(
        checkpoint=make_checkpoint(tmp_path),
        warmup=False,
        max_part_chars=24,  # several parts, several timed groups
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
    )
    engine = VeenaEngine(config, generator=ScriptedGenerator(script), codec=FakeBiCodec())
    await engine.start()
    return engine


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
async def test_engine_offsets_point_into_the_callers_text(tmp_path, text):
    engine = await _engine(tmp_path)
    try:
        words = [w for chunk in [c async for c in engine.stream(text)] for w in chunk.words]
    finally:
        await engine.shutdown()
    assert [w.word for w in words] == [text[a:b] for a, b in split_words(text)]
    assert [w.offset for w in words] == [a for a, _ in split_words(text)]
    for w in words:
        assert text[w.offset : w.offset + len(w.word)] == w.word


async def test_engine_offsets_skip_dropped_control_strings(tmp_path):
    text = "Say <|task_tts|> this,\n\nand <|end_content|>that."
    engine = await _engine(tmp_path)
    try:
        words = [w for chunk in [c async for c in engine.stream(text)] for w in chunk.words]
    finally:
        await engine.shutdown()
    assert [(w.word, w.offset) for w in words] == [
        ("Say", 0), ("this,", text.index("this")), ("and", text.index("and")),
        ("that.", text.index("that")),
    ]  # fmt: skip


# -- the server (real sockets, a fake engine that times each word of its text) ----------------
async def words_until_done(client: RawClient, uid: str) -> tuple[list[dict], object]:
    """The ``words`` of utterance ``uid`` as sent (JSON objects) and the message that ended it."""
    words = []
    while True:
        message = await client.recv()
        if not hasattr(message, "type"):  # an audio frame
            continue
        if message.type == "words" and message.id == uid:
            words += message.words
        elif getattr(message, "id", None) == uid and (
            message.type == "done" or getattr(message, "ended", False)
        ):
            return words, message


async def test_server_words_carry_utf16_offsets_over_websocket_and_sse():
    engine = FakeSpeechEngine(chunks=12, words=True)
    text = EMOJI
    async with serving(engine) as server:
        async with RawClient.connect(server.ws_url) as client:
            await client.send({"type": "speak", "id": "w", "text": text, "words": True})
            ws_words, end = await words_until_done(client, "w")
        async with httpx.AsyncClient(base_url=server.url) as http:
            body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm",
                    "stream_format": "sse"}  # fmt: skip
            response = await http.post("/v1/audio/speech", json=body)
    assert end.type == "done"
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    sse_words = [w for e in events if e["type"] == "speech.words" for w in e["words"]]
    expected = [text[a:b] for a, b in split_words(text)]
    for words in (ws_words, sse_words):
        assert [w["word"] for w in words] == expected
        for w in words:
            assert text[w["offset"] : w["offset"] + len(w["word"])] == w["word"]
            js_length = utf16_length(w["word"])
            assert utf16_slice(text, w["offset_utf16"], js_length) == w["word"]
    # after the emoji, the two indices part: JavaScript counts each emoji twice
    assert ws_words[-1]["offset_utf16"] - ws_words[-1]["offset"] == 6  # 👋 😀 😀😀 🙏🏽


async def test_incremental_text_keeps_offsets_through_a_flush_of_white_space():
    """Appended pieces, one of them only white space and flushed: later offsets count it."""
    engine = FakeSpeechEngine(chunks=4, words=True)
    pieces = ["Hello 😀", "\n\n", "again, friend."]
    text = "".join(pieces)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "i", "text": "", "final": False,
                           "words": True})  # fmt: skip
        for piece in pieces:
            await client.send({"type": "append", "id": "i", "text": piece})
            await client.send({"type": "flush", "id": "i"})
        await client.send({"type": "end", "id": "i"})
        words, end = await words_until_done(client, "i")
    assert end.type == "done"
    assert [w["word"] for w in words] == ["Hello", "again,", "friend."]
    for w in words:
        assert text[w["offset"] : w["offset"] + len(w["word"])] == w["word"]
        assert utf16_slice(text, w["offset_utf16"], utf16_length(w["word"])) == w["word"]
