"""ElevenLabs' multi-context socket over a fake engine on a real socket: message shapes, the
alignment's time scheme, flush / close_context / close_socket, formats, refusals, caps and
drain. The stock clients on the real engine: test_elevenlabs_real.py."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets
from server_fakes import RATE, FakeSpeechEngine, serving, until

from pipecat_veena.interface import WordTiming
from pipecat_veena.server.elevenlabs import alignment
from pipecat_veena.server.settings import ServerSettings


def _url(handle, voice: str = "female", query: str = f"output_format=pcm_{RATE}") -> str:
    return f"ws://127.0.0.1:{handle.port}/v1/text-to-speech/{voice}/multi-stream-input?{query}"


def _send(context_id: str, text: str | None = None, **extra) -> str:
    message = {"context_id": context_id, **extra}
    if text is not None:
        message["text"] = text
    return json.dumps(message)


async def _context(ws, context_id: str, limit_s: float = 10.0) -> list[dict]:
    """Messages of ``context_id`` up to its isFinal (others are skipped)."""
    got = []
    async with asyncio.timeout(limit_s):
        while True:
            msg = json.loads(await ws.recv())
            assert "contextId" in msg, msg
            if msg["contextId"] != context_id:
                continue
            got.append(msg)
            if msg.get("isFinal") is True:
                return got


def _pcm(messages: list[dict]) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in messages if m.get("audio"))


def _pipecat_words(messages: list[dict]) -> list[tuple[str, float]]:
    """Word start times as Pipecat reads them (relative times, its running clock)."""
    from pipecat.services.elevenlabs.tts_base import calculate_word_times

    clock, partial, partial_at, words = 0.0, "", 0.0, []
    for m in messages:
        if m.get("isFinal") or not m.get("alignment"):
            continue
        got, partial, partial_at = calculate_word_times(m["alignment"], clock, partial, partial_at)
        words += got
        starts, durations = m["alignment"]["charStartTimesMs"], m["alignment"]["charDurationsMs"]
        clock += (starts[-1] + durations[-1]) / 1000
    return words


def _livekit_words(messages: list[dict]) -> list[tuple[str, float]]:
    """Word start times as LiveKit reads them (absolute times, words from its tokenizer)."""
    from livekit.agents.tokenize.basic import split_words

    chars, starts = [], []
    for m in messages:
        if m.get("normalizedAlignment"):
            chars += m["normalizedAlignment"]["chars"]
            starts += m["normalizedAlignment"]["charStartTimesMs"]
    text = "".join(chars)
    return [(w, starts[a] / 1000) for w, a, _ in split_words(text, ignore_punctuation=False)]


def test_alignment_keeps_a_relative_clock_at_zero():
    """Every message ends with a space at 0 + 0 ms, so Pipecat's running clock stays at 0 and
    both clients read the same absolute times (to the millisecond)."""
    words = [WordTiming("₹1,499", 0.5, 0.9, 0), WordTiming("है।", 0.9, 1.2, 7)]
    got = alignment(words, closing_ms=1250)
    assert "".join(got["chars"]) == "₹1,499 है।  "
    assert got["charStartTimesMs"][0] == 500 and got["charStartTimesMs"][7] == 900
    assert (got["charStartTimesMs"][6], got["charDurationsMs"][6]) == (0, 0)
    assert (got["charStartTimesMs"][-1], got["charDurationsMs"][-1]) == (1250, 0)
    assert len(got["chars"]) == len(got["charStartTimesMs"]) == len(got["charDurationsMs"])


async def test_a_context_speaks_its_words_as_written_with_both_time_bases():
    """Texts concatenated verbatim and spoken from sentence ends; every message carries the
    contextId; alignment and normalizedAlignment carry the caller's words; Pipecat's and
    LiveKit's reading of the times agree with the engine's (the fake times word i over chunk i)."""
    engine = FakeSpeechEngine(words=True, chunks=4)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_send("a", " ", voice_settings={"stability": 0.5}))
            for piece in ["नमस्ते, बिल ₹1,", "499 है। Pay", " by Monday", "."]:
                await ws.send(_send("a", piece))
            await ws.send(_send("a", flush=True))
            await ws.send(_send("a", close_context=True))
            got = await _context(ws, "a")
    assert [c[0] for c in engine.calls] == [" नमस्ते, बिल ₹1,499 है। ", "Pay by Monday."]
    assert got[-1] == {"isFinal": True, "contextId": "a"}
    expected = ["नमस्ते,", "बिल", "₹1,499", "है।", "Pay", "by", "Monday."]
    chunk_s = engine.chunk_samples / RATE
    truth = [i % 4 * chunk_s + (i // 4) * 4 * chunk_s for i in range(7)]  # (word i: chunk i)
    for read in (_pipecat_words(got), _livekit_words(got)):
        assert [w.strip() for w, _ in read] == expected
        assert max(abs(t - e) for (_, t), e in zip(read, truth, strict=True)) <= 0.0011
    assert all(m["alignment"] == m["normalizedAlignment"] for m in got if "alignment" in m)
    assert len(_pcm(got)) == 2 * 4 * engine.chunk_samples * 2


async def test_auto_mode_speaks_each_text_as_it_comes():
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as handle:
        async with websockets.connect(
            _url(handle, query="output_format=pcm_16000&auto_mode=true")
        ) as ws:
            await ws.send(_send("t", "no sentence end"))
            await until(lambda: engine.calls, 5)
            assert engine.calls[0][0] == "no sentence end"
            await ws.send(_send("t", "", flush=True))
            await ws.send(_send("t", close_context=True))
            assert (await _context(ws, "t"))[-1]["isFinal"] is True


async def test_close_context_without_a_flush_is_a_barge_in():
    """close_context after text that was not flushed, or for a context already closed (Pipecat
    closes twice when interrupted after its turn's end), aborts generation at once; after an
    empty flush it ends the input and the queued text is still spoken."""
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_send("a", "Speak for ever. "))
            await ws.send(_send("b", "And this one. ", flush=True))
            await until(lambda: len(engine.open) == 2, 5)
            await ws.send(_send("a", close_context=True))  # mid-input: a barge-in
            assert (await _context(ws, "a"))[-1]["isFinal"] is True
            await until(lambda: len(engine.open) == 1, 5)
            await ws.send(_send("b", "", flush=True))
            await ws.send(_send("b", close_context=True))  # the end of b's input
            await asyncio.sleep(0.2)
            assert len(engine.open) == 1  # b still speaks
            await ws.send(_send("b", close_context=True))  # the second close: a barge-in
            assert (await _context(ws, "b"))[-1]["isFinal"] is True
            await ws.send(_send("gone", close_context=True))  # unknown: a no-op
            await ws.send(json.dumps({"text": ""}))  # a socket keep-alive
        await until(lambda: not engine.open and not handle.state.slots.active, 5)
        text = handle.state.metrics.render().decode()
        assert 'veena_cancels_total{api="ws",by="client"} 2.0' in text


async def test_close_socket_aborts_every_context_and_closes():
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            for c in ("a", "b", "c"):
                await ws.send(_send(c, "Speak for ever. "))
            await until(lambda: len(engine.open) == 3, 5)
            await ws.send(json.dumps({"close_socket": True}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                async with asyncio.timeout(5):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd.code == 1000
        await until(lambda: not engine.open and not handle.state.slots.active, 5)


@pytest.mark.parametrize(
    "fmt, width, rate",
    [("pcm_8000", 2, 8000), ("pcm_22050", 2, 22050), ("pcm_44100", 2, 44100),
     ("ulaw_8000", 1, 8000), ("alaw_8000", 1, 8000)],
)  # fmt: skip
async def test_output_formats(fmt, width, rate):
    engine = FakeSpeechEngine(chunks=2)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle, query=f"output_format={fmt}")) as ws:
            await ws.send(_send("e", "Hello there.", flush=True))
            await ws.send(_send("e", close_context=True))
            got = await _context(ws, "e")
    expected = 2 * engine.chunk_samples * rate / RATE
    assert abs(len(_pcm(got)) / width - expected) <= 2


async def test_mp3_output_is_one_mpeg_stream():
    engine = FakeSpeechEngine(chunks=4)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle, query="output_format=mp3_22050_32")) as ws:
            await ws.send(_send("m", "Hello there.", flush=True))
            await ws.send(_send("m", close_context=True))
            got = await _context(ws, "m")
    data = _pcm(got)
    assert data[:2] in (b"\xff\xf3", b"\xff\xf2", b"\xff\xfb") and len(data) > 200


@pytest.mark.parametrize(
    "voice, query, status",
    [
        ("nobody", "output_format=pcm_16000", 400),
        ("female", "output_format=opus_48000_64", 400),
        ("female", "output_format=pcm_96000", 400),
        ("female", "output_format=pcm_16000&enable_ssml_parsing=true", 400),
    ],
)
async def test_refused_in_the_handshake(voice, query, status):
    async with serving(FakeSpeechEngine()) as handle:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(_url(handle, voice, query)):
                pass
    assert refused.value.response.status_code == status
    body = json.loads(refused.value.response.body)
    assert body["detail"]["status"] and body["detail"]["message"]


async def test_keys_in_the_header_or_the_query():
    settings = ServerSettings(api_keys={"right-key": "team"})
    async with serving(FakeSpeechEngine(), settings) as handle:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(_url(handle), additional_headers={"xi-api-key": "no"}):
                pass
        assert refused.value.response.status_code == 401
        body = json.loads(refused.value.response.body)
        assert body["detail"]["status"] == "unauthorized"
        assert "xi-api-key" in body["detail"]["message"]
        async with websockets.connect(_url(handle), additional_headers={"xi-api-key": "right-key"}):
            pass
        async with websockets.connect(_url(handle) + "&xi_api_key=right-key"):
            pass


async def test_messages_refused_name_the_problem():
    """Malformed JSON, text for a closed context still speaking, other voice_settings for an open
    one, a bad speed: an error with our code; the socket carries on."""
    engine = FakeSpeechEngine(chunks=3, delay=0.05)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send("{not json")
            msg = json.loads(await ws.recv())
            assert (msg["error"], msg["contextId"]) == ("bad_json", None) and msg["message"]
            await ws.send(_send("s", " ", voice_settings={"speed": 3.0}))
            msg = json.loads(await ws.recv())
            assert msg["error"] == "bad_options" and msg["isFinal"] is True
            await ws.send(_send("r", "One sentence. ", voice_settings={"speed": 1.1}))
            await ws.send(_send("r", "More. ", voice_settings={"speed": 1.2}))
            msg = json.loads(await ws.recv())
            assert (msg["error"], msg["contextId"]) == ("bad_message", "r")
            await ws.send(_send("r", "", flush=True))
            await ws.send(_send("r", close_context=True))
            await ws.send(_send("r", "Text after the close. "))
            got = await _context(ws, "r")
            errors = [m["error"] for m in got if "error" in m]
            assert errors == ["duplicate_id"] and got[-1] == {"isFinal": True, "contextId": "r"}
    assert engine.calls[0][2] == {"speed": 1.1}


async def test_per_key_cap_and_errors_end_the_context():
    """A context takes a stream slot of the caller's key; one refused gets an error that ends it
    (isFinal too, which is what Pipecat reads)."""
    settings = ServerSettings(api_keys={"k1": "a"}, max_streams_per_key=1)
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine, settings) as handle:
        headers = {"xi-api-key": "k1"}
        async with websockets.connect(_url(handle), additional_headers=headers) as ws:
            await ws.send(_send("one", "Speak for ever. ", flush=True))
            await ws.send(_send("two", "No slot for me. ", flush=True))
            (msg,) = await _context(ws, "two")
            assert msg["error"] == "too_many_streams" and msg["code"] == 429
            assert msg["isFinal"] is True and "'a'" in msg["message"]
        await until(lambda: not engine.open and not handle.state.slots.active, 5)


async def test_drain_closes_the_socket_once_its_contexts_end():
    engine = FakeSpeechEngine(chunks=3, delay=0.05)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_send("d", "Finish me.", flush=True))
            await ws.send(_send("d", close_context=True))
            await until(lambda: engine.open, 5)
            handle.state.begin_drain()
            got = await _context(ws, "d")
            assert got[-1]["isFinal"] is True and _pcm(got)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == 1012
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(_url(handle)):
                pass
        assert refused.value.response.status_code == 503
