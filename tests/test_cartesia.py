"""The Cartesia endpoints over a fake engine on a real socket: message shapes, buffering,
encodings, refusals, cancel and close. The stock clients on the real engine:
test_cartesia_real.py."""

from __future__ import annotations

import asyncio
import base64
import json
import warnings

import httpx
import numpy as np
import pytest
import websockets
from server_fakes import RATE, FakeSpeechEngine, serving, until

from pipecat_veena.server.cartesia import encode_pcm
from pipecat_veena.server.settings import ServerSettings

KNOWN_TYPES = {"chunk", "timestamps", "done", "error", "flush_done"}
FORMAT = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE}


def _msg(context_id: str, transcript: str, more: bool = True, **extra) -> str:
    return json.dumps(
        {"context_id": context_id, "transcript": transcript, "continue": more,
         "voice": {"mode": "id", "id": "female"}, "output_format": FORMAT, **extra}
    )  # fmt: skip


def _url(handle) -> str:
    return f"ws://127.0.0.1:{handle.port}/tts/websocket"


async def _context(ws, context_id: str, limit_s: float = 10.0) -> list[dict]:
    """Messages of ``context_id`` up to its done or error (others are skipped)."""
    got = []
    async with asyncio.timeout(limit_s):
        while True:
            msg = json.loads(await ws.recv())
            assert msg["type"] in KNOWN_TYPES and "context_id" in msg, msg
            if msg["context_id"] != context_id:
                continue
            got.append(msg)
            if msg["type"] in ("done", "error"):
                return got


def _pcm(messages: list[dict]) -> bytes:
    return b"".join(base64.b64decode(m["data"]) for m in messages if m["type"] == "chunk")


def test_g711_matches_the_reference_encoder():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop
    x = np.concatenate([np.arange(-32768, 32768, 7), [-32768, -1, 0, 1, 32767]]).astype("<i2")
    pcm = x.tobytes()
    assert encode_pcm(pcm, "pcm_mulaw") == audioop.lin2ulaw(pcm, 2)
    assert encode_pcm(pcm, "pcm_alaw") == audioop.lin2alaw(pcm, 2)
    f32 = np.frombuffer(encode_pcm(pcm, "pcm_f32le"), "<f4")
    assert np.array_equal(f32, x / 32768.0)
    assert encode_pcm(pcm, "pcm_s16le") == pcm


async def test_a_context_is_one_utterance_cut_at_sentence_ends():
    """Pieces concatenated verbatim, spoken from sentence ends ("।" too); words come as the
    transcript has them, no later than the audio they describe; every message carries the
    context id and only types the clients know."""
    engine = FakeSpeechEngine(words=True, chunks=4)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            pieces = ["नमस्ते, बिल ₹1,", "499 है। Pay", " by Monday", "."]
            for piece in pieces:
                await ws.send(_msg("a", piece, add_timestamps=True))
            await ws.send(_msg("a", "", more=False, add_timestamps=True))
            got = await _context(ws, "a")
    assert [c[0] for c in engine.calls] == ["नमस्ते, बिल ₹1,499 है। ", "Pay by Monday."]
    assert got[-1] == {"type": "done", "done": True, "status_code": 206, "context_id": "a"}
    words = [w for m in got if m["type"] == "timestamps" for w in m["word_timestamps"]["words"]]
    assert words == ["नमस्ते,", "बिल", "₹1,499", "है।", "Pay", "by", "Monday."]
    seconds = 0.0
    for m in got:  # (the fake times word i over chunk i of its segment)
        if m["type"] == "chunk":
            seconds += len(base64.b64decode(m["data"])) / 2 / RATE
        elif m["type"] == "timestamps":
            stamps = m["word_timestamps"]
            assert len(stamps["words"]) == len(stamps["start"]) == len(stamps["end"])
            assert all(end <= seconds + 0.1 + 1e-6 for end in stamps["end"])
    assert len(_pcm(got)) == 2 * 4 * engine.chunk_samples * 2


async def test_buffer_delay_speaks_text_without_a_sentence_end():
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("t", "no sentence end yet", max_buffer_delay_ms=200))
            await until(lambda: engine.calls, 5)
            assert engine.calls[0][0] == "no sentence end yet"
            await ws.send(_msg("z", "each transcript", max_buffer_delay_ms=0))
            await until(lambda: len(engine.calls) == 2, 5)
            assert engine.calls[1][0] == "each transcript"
            for c in ("t", "z"):
                await ws.send(_msg(c, "", more=False))
                assert (await _context(ws, c))[-1]["type"] == "done"


@pytest.mark.parametrize(
    "encoding, width", [("pcm_s16le", 2), ("pcm_f32le", 4), ("pcm_mulaw", 1), ("pcm_alaw", 1)]
)
async def test_encodings_and_rates(encoding, width):
    engine = FakeSpeechEngine(chunks=2)
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": 8000}
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("e", "Hello there.", more=False, output_format=fmt))
            got = await _context(ws, "e")
    assert len(_pcm(got)) == width * 2 * engine.chunk_samples // 2


@pytest.mark.parametrize(
    "extra, code",
    [
        ({"voice": {"mode": "embedding", "embedding": [0.1] * 192}}, "unknown_voice"),
        ({"voice": {"mode": "id", "id": "nobody"}}, "unknown_voice"),
        ({"generation_config": {"speed": 2.5}}, "bad_options"),
        ({"generation_config": {"volume": 1.3}}, "bad_options"),
        ({"generation_config": {"emotion": "happy"}}, "bad_options"),
        ({"pronunciation_dict_id": "dict-1"}, "bad_message"),
        ({"output_format": {"container": "mp3", "sample_rate": 16000}}, "bad_message"),
        ({"output_format": {**FORMAT, "encoding": "pcm_s8"}}, "bad_message"),
        ({"output_format": {**FORMAT, "sample_rate": 96000}}, "unsupported_sample_rate"),
        ({"max_buffer_delay_ms": 9000}, "bad_message"),
    ],
)
async def test_refusals_name_the_problem(extra, code):
    engine = FakeSpeechEngine()
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("x", "Hello.", **extra))
            (msg,) = await _context(ws, "x")
    assert msg["type"] == "error" and msg["error_code"] == code, msg
    assert msg["title"] and msg["message"] and msg["status_code"] >= 400
    assert not engine.calls


async def test_accepted_fields_and_unknown_ones():
    """What the clients send that changes nothing here is accepted: model_id, speed 1.0,
    language (hi goes to the normaliser), use_normalized_timestamps, fields we never heard of."""
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            extra = {
                "model_id": "sonic-3", "language": "hi", "use_normalized_timestamps": False,
                "generation_config": {"speed": 1.0, "volume": 1}, "brand_new": {"x": 1},
            }  # fmt: skip
            await ws.send(_msg("k", "नमस्ते।", more=False, **extra))
            assert (await _context(ws, "k"))[-1]["type"] == "done"
    assert engine.calls[0][2] == {"language": "hi"}


async def test_generation_config_speed_reaches_the_engine():
    """generation_config.speed is the engine's speed option (0.5-2.0, pitch kept); outside
    the range a bad_options naming it."""
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("s", "Hello.", more=False, generation_config={"speed": 1.3}))
            assert (await _context(ws, "s"))[-1]["type"] == "done"
            await ws.send(_msg("t", "Hello.", more=False, generation_config={"speed": 0.3}))
            (msg,) = await _context(ws, "t")
    assert engine.calls[0][2] == {"speed": 1.3}
    assert msg["error_code"] == "bad_options" and "0.5 to 2.0" in msg["message"], msg


async def test_a_context_keeps_its_voice_and_format():
    engine = FakeSpeechEngine(chunks=2, delay=0.01)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("v", "Hello. "))
            # (a message may leave out the voice and format: the context keeps its own)
            await ws.send(json.dumps({"context_id": "v", "transcript": "Hi. ", "continue": True}))
            await until(lambda: [c[0] for c in engine.calls] == ["Hello. ", "Hi. "], 5)
            await ws.send(_msg("v", "More. ", voice={"mode": "id", "id": "male"}))
            msg = await _until_error(ws)
            assert (msg["error_code"], msg["context_id"]) == ("bad_message", "v")
            assert "keeps the voice" in msg["message"]
            await ws.send(json.dumps({"context_id": "v", "cancel": True}))
            assert (await _context(ws, "v"))[-1]["type"] == "done"
            await until(lambda: not engine.open, 5)


async def _until_error(ws) -> dict:
    async with asyncio.timeout(10):
        while (msg := json.loads(await ws.recv()))["type"] != "error":
            pass
    return msg


async def test_cancel_and_close_abort_generation():
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("a", "Speak for ever.", more=False))
            await ws.send(_msg("b", "And this one too.", more=False))
            await until(lambda: len(engine.open) == 2, 5)
            await ws.send(json.dumps({"context_id": "a", "cancel": True}))
            await until(lambda: len(engine.open) == 1, 5)
            await ws.send(json.dumps({"context_id": "gone-long-ago", "cancel": True}))  # no-op
            await ws.send(_msg("ended-before", " ", more=False))  # its end again: a done
            assert await _context(ws, "ended-before") == [
                {"type": "done", "done": True, "status_code": 206, "context_id": "ended-before"}
            ]
        await until(lambda: not engine.open and not handle.state.slots.active, 5)
        text = handle.state.metrics.render().decode()
        assert 'veena_cancels_total{api="ws",by="client"} 1.0' in text


async def test_bad_key_is_refused_in_the_handshake():
    settings = ServerSettings(api_keys={"right-key": "team"})
    async with serving(FakeSpeechEngine(), settings) as handle:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(_url(handle), additional_headers={"X-API-Key": "no"}):
                pass
        assert refused.value.response.status_code == 401
        body = json.loads(refused.value.response.body)
        assert body["error_code"] == "unauthorized" and "X-API-Key" in body["message"]
        async with websockets.connect(_url(handle), additional_headers={"X-API-Key": "right-key"}):
            pass
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{handle.url}/tts/bytes", json={"transcript": "Hi."})
        assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"


async def test_drain_closes_the_socket_once_its_contexts_end():
    """Cartesia has no drain message: a busy socket closes (1012) after its last done, an idle
    one at once, and new ones are refused (503) while the server drains."""
    engine = FakeSpeechEngine(chunks=3, delay=0.05)
    async with serving(engine) as handle:
        async with (
            websockets.connect(_url(handle)) as ws,
            websockets.connect(_url(handle)) as idle,
        ):
            await ws.send(_msg("d", "Finish me.", more=False))
            await until(lambda: engine.open, 5)
            handle.state.begin_drain()
            got = await _context(ws, "d")
            assert got[-1]["type"] == "done" and _pcm(got)
            for socket in (ws, idle):
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(socket.recv(), 10)
                assert closed.value.rcvd.code == 1012
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(_url(handle)):
                pass
        assert refused.value.response.status_code == 503


@pytest.mark.parametrize(
    "fmt, media, width",
    [
        ({"container": "raw", "encoding": "pcm_s16le", "sample_rate": 8000}, "audio/pcm", 2),
        ({"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}, "audio/pcm", 1),
        ({"container": "wav", "encoding": "pcm_s16le", "sample_rate": 8000}, "audio/wav", 2),
    ],
)
async def test_bytes_endpoint(fmt, media, width):
    engine = FakeSpeechEngine(chunks=2)
    async with serving(engine) as handle:
        async with httpx.AsyncClient() as http:
            body = {"model_id": "sonic-3", "transcript": "Hello there.", "output_format": fmt,
                    "voice": {"mode": "id", "id": "alloy"}, "language": "en"}  # fmt: skip
            r = await http.post(f"{handle.url}/tts/bytes", json=body)
            assert r.status_code == 200 and r.headers["content-type"].startswith(media)
            head = 44 if fmt["container"] == "wav" else 0
            assert len(r.content) == head + width * engine.chunk_samples  # 2 chunks at 8 kHz
            r = await http.post(f"{handle.url}/tts/bytes", json={**body, "transcript": 5})
            assert r.status_code == 400 and r.json()["type"] == "error"


def test_x_api_key_owns_the_same_voices_as_the_bearer_key():
    """A voice enrolled with ``Authorization: Bearer K`` is the voice of ``X-API-Key: K``."""
    from starlette.requests import Request

    from pipecat_veena.server.limits import voice_owner

    settings = ServerSettings(api_keys={"k1": "a", "k2": "b"})

    def request(headers: dict[str, str]) -> Request:
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        return Request({"type": "http", "headers": raw, "query_string": b""})

    bearer = voice_owner(settings, request({"Authorization": "Bearer k1"}))
    assert voice_owner(settings, request({"X-API-Key": "k1"})) == bearer
    assert voice_owner(settings, request({"X-API-Key": "k2"})) != bearer


async def test_per_key_cap_counts_cartesia_contexts():
    """Contexts take stream slots of the caller's key like our own utterances do."""
    settings = ServerSettings(api_keys={"k1": "a"}, max_streams_per_key=1)
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine, settings) as handle:
        headers = {"X-API-Key": "k1"}
        async with websockets.connect(_url(handle), additional_headers=headers) as ws:
            await ws.send(_msg("one", "Speak for ever.", more=False))
            await ws.send(_msg("two", "No slot for me.", more=False))
            msg = await _until_error(ws)
            assert (msg["error_code"], msg["context_id"]) == ("too_many_streams", "two")
            assert msg["status_code"] == 429 and "'a'" in msg["message"]
        await until(lambda: not engine.open and not handle.state.slots.active, 5)


async def test_flush_done_follows_the_audio_of_the_flushed_text():
    """``flush: true`` speaks the text so far now; its ``flush_done`` (flush_id 1, 2, ...) comes
    after that text's audio and before the audio of text sent after it."""
    engine = FakeSpeechEngine(chunks=2, delay=0.01)
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("f", "no sentence end", flush=True))
            await ws.send(_msg("f", "then more", more=False, flush=True))
            got = await _context(ws, "f")
    kinds = [m["type"] for m in got]
    assert kinds == ["chunk", "chunk", "flush_done", "chunk", "chunk", "flush_done", "done"], kinds
    assert [m["flush_id"] for m in got if m["type"] == "flush_done"] == [1, 2]
    assert got[2] == {"type": "flush_done", "flush_done": True, "flush_id": 1, "done": False,
                      "status_code": 206, "context_id": "f"}  # fmt: skip


@pytest.mark.parametrize("rate", [22050, 44100, 8000, 48000])
async def test_any_output_rate_from_8_to_48_khz(rate):
    """output_format.sample_rate takes any whole number of Hz from 8000 to 48000 (the resampler
    takes any pair): the audio is as long as the engine's at that rate."""
    engine = FakeSpeechEngine(chunks=2)
    fmt = {**FORMAT, "sample_rate": rate}
    async with serving(engine) as handle:
        async with websockets.connect(_url(handle)) as ws:
            await ws.send(_msg("r", "Hello there.", more=False, output_format=fmt))
            got = await _context(ws, "r")
    assert got[-1]["type"] == "done"
    expected = 2 * engine.chunk_samples * rate / RATE
    assert abs(len(_pcm(got)) // 2 - expected) <= 2
