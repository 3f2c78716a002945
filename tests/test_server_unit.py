"""The speech server over a fake engine (tests/server_fakes.py), through uvicorn on loopback:
the WebSocket protocol and its edge cases (bad messages, limits, keys, slow and idle clients),
the OpenAI routes, health/ready/metrics, drain, and a fuzz of malformed input. The same server
runs over the real vLLM engine in test_server_real.py."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx
import protocol_fuzz
import pytest
from decoded import decoded_samples
from server_fakes import CHUNK_BYTES, RATE, FakeSpeechEngine, RawClient, pcm_of, serving, until

from pipecat_veena.remote.protocol import CLOSE_GOING_AWAY, AudioFrame, ErrorCode, GoAway, Words
from pipecat_veena.server import ServerSettings


async def _expect_error(client: RawClient, code: str, *, ended: bool | None = None):
    message = await client.recv()
    assert message.type == "error" and message.code == code, message
    if ended is not None:
        assert message.ended is ended
    return message


async def _speak_ok(client: RawClient, uid: str, text: str = "Still fine.") -> None:
    await client.send({"type": "speak", "id": uid, "text": text})
    frames, end = await client.until_end(uid)
    assert end.type == "done" and end.reason == "completed" and len(pcm_of(frames)) > 0


# -- the stream ---------------------------------------------------------------------------
async def test_ready_speak_done_and_rates():
    engine = FakeSpeechEngine(chunks=3)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        ready = client.ready
        assert (ready.type, ready.protocol, ready.model, ready.sample_rate) == (
            "ready", 1, "fake-veena", RATE,
        )  # fmt: skip
        assert ready.voices == ["female", "male"] and ready.voice_levels
        assert ready.limits["max_text_chars"] == ServerSettings().max_text_chars
        await client.send({"type": "speak", "id": "u1", "text": "Hello.", "voice": "male",
                           "options": {"temperature": 0.5, "seed": 3}})  # fmt: skip
        frames, done = await client.until_end("u1")
        assert len(pcm_of(frames)) == 3 * CHUNK_BYTES and frames[-1].tokens == 30
        assert (done.reason, done.tokens, done.sample_rate) == ("completed", 30, RATE)
        assert done.audio_seconds == pytest.approx(0.3) and done.ttfa_ms is not None
        assert engine.calls[-1] == ("Hello.", "male", {"temperature": 0.5, "seed": 3})
        await client.send({"type": "speak", "id": "u2", "text": "Slow.", "sample_rate": 8000})
        frames, done = await client.until_end("u2")
        assert abs(len(pcm_of(frames)) // 2 - 3 * 1600 // 2) <= 2 and done.sample_rate == 8000


async def _until_end(client: RawClient, uid: str) -> list:
    """Every message and frame of ``uid`` up to the one that ended it (included)."""
    messages = []
    while True:
        message = await client.recv()
        if getattr(message, "id", None) == uid:
            messages.append(message)
            if getattr(message, "type", None) == "done" or getattr(message, "ended", False):
                return messages


def _heard_words(messages: list, rate: int) -> list:
    """The words of ``words`` messages, each checked to follow the audio covering its end."""
    heard, words = 0.0, []
    for message in messages:
        if isinstance(message, AudioFrame):
            heard += len(message.pcm) / 2 / rate
        elif isinstance(message, Words):
            assert message.estimated
            for word in message.timings():
                assert word.end <= heard + 1e-9, f"{word} came ahead of its audio ({heard} s)"
                words.append(word)
    return words


async def test_word_timings_for_a_speak_that_asks_after_their_audio_and_nothing_new_otherwise():
    """docs/protocol.md, ``words``: only a speak with ``"words": true`` gets them (a client of
    before them gets the same messages as ever), each message after the audio covering its
    words' ends (at 8 kHz the resampler holds 4 ms back: the chunk's last word waits), in the
    utterance's time and text also when it came in pieces."""
    text = "one two three four"
    async with serving(FakeSpeechEngine(words=True)) as server:
        async with RawClient.connect(server.ws_url) as client:
            assert client.ready.words is True
            await client.send({"type": "speak", "id": "old", "text": text})
            messages = await _until_end(client, "old")
            assert all(isinstance(m, AudioFrame) for m in messages[:-1])  # as ever: audio, done
            assert messages[-1].type == "done" and len(messages) == 5
            for rate in (16000, 8000):
                uid = f"new-{rate}"
                await client.send(
                    {"type": "speak", "id": uid, "text": text, "words": True, "sample_rate": rate}
                )
                words = _heard_words(await _until_end(client, uid), rate)
                assert [(w.word, w.offset) for w in words] == [
                    ("one", 0), ("two", 4), ("three", 8), ("four", 14)
                ]  # fmt: skip
                assert [w.start for w in words] == pytest.approx([0.0, 0.1, 0.2, 0.3])
            await client.send(
                {"type": "speak", "id": "inc", "text": "Alpha beta. ", "final": False,
                 "words": True}
            )  # fmt: skip
            await client.send({"type": "append", "id": "inc", "text": "Gamma delta."})
            await client.send({"type": "end", "id": "inc"})
            words = _heard_words(await _until_end(client, "inc"), RATE)
            whole = "Alpha beta. Gamma delta."
            assert [whole[w.offset : w.offset + len(w.word)] for w in words] == whole.split()
            assert [w.start for w in words] == pytest.approx([0.0, 0.1, 0.4, 0.5])
    async with serving(FakeSpeechEngine()) as server:  # an engine that does not time words
        async with RawClient.connect(server.ws_url) as client:
            assert client.ready.words is False
            await client.send({"type": "speak", "id": "u", "text": text, "words": True})
            messages = await _until_end(client, "u")
            assert messages[-1].type == "done" and not [m for m in messages if isinstance(m, Words)]


async def test_incremental_text_is_spoken_sentence_by_sentence():
    engine = FakeSpeechEngine(chunks=2)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send(
            {"type": "speak", "id": "llm", "text": "Hello there. How", "final": False}
        )
        await until(lambda: len(engine.calls) == 1)
        await client.send({"type": "append", "id": "llm", "text": " are you? Fine"})
        await until(lambda: len(engine.calls) == 2)
        await client.send({"type": "append", "id": "llm", "text": " thanks"})
        await client.send({"type": "flush", "id": "llm"})
        await client.send({"type": "append", "id": "llm", "text": "नमस्ते। "})
        await client.send({"type": "end", "id": "llm"})
        frames, done = await client.until_end("llm")
        texts = [call[0] for call in engine.calls]
        assert texts == ["Hello there. ", "How are you? ", "Fine thanks", "नमस्ते। "]
        assert done.reason == "completed" and len(pcm_of(frames)) == 4 * 2 * CHUNK_BYTES
        await client.send({"type": "append", "id": "llm", "text": "late"})
        await _expect_error(client, ErrorCode.UNKNOWN_ID, ended=False)


async def test_appended_text_is_not_cut_after_an_abbreviation():
    """An LLM's words appended one by one are cut where the engine's splitter cuts the whole
    text: "Rs. ", "Dr. " and "a.m. " end no sentence (they did, and each half was a prompt)."""
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "w", "text": "", "final": False})
        for word in "Please pay Rs. 500 to Dr. Rao by 10 a.m. tomorrow. Thanks!".split(" "):
            await client.send({"type": "append", "id": "w", "text": word + " "})
        await until(lambda: len(engine.calls) == 2)  # "Thanks! " is complete as it arrives
        await client.send({"type": "end", "id": "w"})
        _, done = await client.until_end("w")
        assert done.reason == "completed"
        assert [call[0] for call in engine.calls] == [
            "Please pay Rs. 500 to Dr. Rao by 10 a.m. tomorrow. ",
            "Thanks! ",
        ]


async def test_cancel_stops_the_engine_stream_and_says_cancelled():
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "long", "text": "A very long story."})
        assert isinstance(await client.recv(), AudioFrame)
        await client.send({"type": "cancel", "id": "long"})
        _, done = await client.until_end("long")
        assert done.type == "done" and done.reason == "cancelled"
        await until(lambda: not engine.open)
        await client.send({"type": "cancel", "id": "long"})  # idempotent: no answer
        engine.endless = False
        await _speak_ok(client, "next")


async def test_disconnect_aborts_every_utterance_of_the_connection():
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as server:
        async with RawClient.connect(server.ws_url) as client:
            for uid in ("a", "b", "c"):
                await client.send({"type": "speak", "id": uid, "text": "Talk."})
            await until(lambda: len(engine.open) == 3)
        await until(lambda: not engine.open and server.state.slots.active == 0)


async def test_each_bad_message_gets_a_clear_error_and_the_connection_carries_on():
    engine = FakeSpeechEngine(chunks=2)
    settings = ServerSettings(max_text_chars=50, max_message_bytes=2000)
    async with serving(engine, settings) as server, RawClient.connect(server.ws_url) as client:
        cases = [
            ("{oops", ErrorCode.BAD_JSON, "not valid JSON"),
            ('{"type": "sing", "id": "x"}', ErrorCode.UNKNOWN_TYPE, "valid: speak"),
            ('{"type": "speak", "id": "x", "text": 12}', ErrorCode.BAD_MESSAGE, "'text' must be"),
            ('{"type": "speak", "id": "x", "text": "Hi", "options": {"top_k": "many"}}',
             ErrorCode.BAD_OPTIONS, "'top_k' must be"),
            (b"\x01\x02binary", ErrorCode.BINARY_NOT_EXPECTED, "send JSON text"),
            ('{"type": "speak", "id": "x", "text": "Hi", "voice": "robot"}',
             ErrorCode.UNKNOWN_VOICE, "offers: female, male"),
            ('{"type": "speak", "id": "x", "text": "' + "y" * 60 + '"}', ErrorCode.TEXT_TOO_LONG,
             "cap of 50"),
            ('{"type": "speak", "id": "x", "text": "' + "y" * 3000 + '"}',
             ErrorCode.MESSAGE_TOO_LARGE, "several 'append'"),
            ('{"type": "speak", "id": "x", "text": "Hi", "options": {"temperature": 9}}',
             ErrorCode.BAD_OPTIONS, "temperature must be in [0, 2]"),
            ('{"type": "flush", "id": "nobody"}', ErrorCode.UNKNOWN_ID, "no utterance 'nobody'"),
        ]  # fmt: skip
        for raw, code, words in cases:
            await client.send(raw)
            error = await _expect_error(client, code)
            assert words in error.message, error
        await client.send({"type": "speak", "id": "dup", "text": "One.", "final": False})
        await client.send({"type": "speak", "id": "dup", "text": "Two."})
        await _expect_error(client, ErrorCode.DUPLICATE_ID, ended=False)
        await client.send({"type": "append", "id": "dup", "text": "z" * 60})
        _, end = await client.until_end("dup")
        assert end.code == ErrorCode.TEXT_TOO_LONG and end.ended
        await _speak_ok(client, "after")
        assert server.state.slots.active == 0


async def test_stream_caps_total_and_per_key(tmp_path):
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    keys = {"key-a": "alice", "key-b": "bob"}
    settings = ServerSettings(api_keys=keys, max_streams=3, max_streams_per_key=2)
    async with serving(engine, settings) as server:
        async with RawClient.connect(server.ws_url, api_key="key-a") as alice, \
                RawClient.connect(server.ws_url, api_key="key-b") as bob:  # fmt: skip
            for uid in ("a1", "a2"):
                await alice.send({"type": "speak", "id": uid, "text": "Talk."})
            await until(lambda: len(engine.open) == 2)
            await alice.send({"type": "speak", "id": "a3", "text": "Talk."})
            _, refused = await alice.until_end("a3")
            assert refused.code == ErrorCode.TOO_MANY_STREAMS and "alice" in refused.message
            await bob.send({"type": "speak", "id": "b1", "text": "Talk."})
            await until(lambda: len(engine.open) == 3)
            await bob.send({"type": "speak", "id": "b2", "text": "Talk."})
            _, refused = await bob.until_end("b2")
            assert refused.code == ErrorCode.TOO_MANY_STREAMS and "cap of 3" in refused.message
            async with httpx.AsyncClient() as http:
                r = await http.post(
                    f"{server.url}/v1/audio/speech",
                    json={"input": "Hi", "voice": "alloy", "response_format": "pcm"},
                    headers={"Authorization": "Bearer key-b"},
                )
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_streams"
            assert r.headers["retry-after"] == "1"
            await alice.send({"type": "cancel", "id": "a1"})
            await alice.until_end("a1")
            await bob.send({"type": "speak", "id": "b3", "text": "Talk."})
            await until(lambda: len(engine.open) == 3)


async def test_api_keys_on_both_apis():
    settings = ServerSettings(api_keys={"s3cret": "bot"})
    async with serving(FakeSpeechEngine(), settings) as server:
        for key in (None, "wrong"):
            async with RawClient.connect(server.ws_url, api_key=key, ready=False) as client:
                error = await _expect_error(client, ErrorCode.UNAUTHORIZED)
                assert "key" in error.message
                assert await client.closed() == 1008
        async with RawClient.connect(f"{server.ws_url}?api_key=s3cret") as client:
            await _speak_ok(client, "q")
        async with httpx.AsyncClient(base_url=server.url) as http:
            body = {"input": "Hi", "voice": "alloy", "response_format": "pcm"}
            r = await http.post("/v1/audio/speech", json=body)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            r = await http.post("/v1/audio/speech", json=body, headers={"Authorization": "s3cret"})
            assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
            r = await http.get("/v1/models", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
            auth = {"Authorization": "Bearer s3cret"}
            r = await http.post("/v1/audio/speech", json=body, headers=auth)
            assert r.status_code == 200 and len(r.content) == 4 * 2400 * 2
            assert (await http.get("/health")).status_code == 200  # probes need no key


async def _stalled_client(port: int, request: bytes) -> socket.socket:
    """A TCP client with a tiny receive buffer that sends ``request`` and then never reads."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


def _masked_text_frame(payload: bytes) -> bytes:
    mask = b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert len(payload) < 126
    return bytes((0x81, 0x80 | len(payload))) + mask + masked


async def test_a_client_that_stops_reading_is_dropped_and_its_requests_aborted():
    engine = FakeSpeechEngine(endless=True, chunk_samples=16000)  # 32 kB chunks, no pause
    settings = ServerSettings(slow_client_timeout_s=0.5, send_buffer_bytes=64 * 1024)
    loop = asyncio.get_running_loop()
    async with serving(engine, settings) as server:
        handshake = (
            b"GET /v1/audio/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        stalled = await _stalled_client(server.port, handshake)
        try:
            assert (await loop.sock_recv(stalled, 12)).startswith(b"HTTP/1.1 101")
            speak = json.dumps({"type": "speak", "id": "s", "text": "Never read."}).encode()
            await loop.sock_sendall(stalled, _masked_text_frame(speak))
            await until(lambda: engine.closed_streams >= 1, wait_s=60)  # aborted
            await until(lambda: not engine.open and server.state.slots.active == 0)
            async with RawClient.connect(server.ws_url) as other:  # everyone else carries on
                engine.endless = False
                await _speak_ok(other, "fine")
        finally:
            stalled.close()
        engine.endless = True
        body = json.dumps({"input": "Never read.", "response_format": "pcm"}).encode()
        closed = engine.closed_streams
        http_stalled = await _stalled_client(
            server.port,
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
        )
        try:
            await until(lambda: engine.closed_streams > closed, wait_s=60)
        finally:
            http_stalled.close()
        await until(lambda: server.state.slots.active == 0)
        text = server.state.metrics.render().decode()
        assert 'veena_requests_total{api="ws",outcome="disconnected"} 1.0' in text
        assert 'veena_requests_total{api="http",outcome="disconnected"} 1.0' in text


async def test_idle_connection_is_closed_with_a_reason():
    settings = ServerSettings(idle_timeout_s=0.3)
    async with serving(FakeSpeechEngine(), settings) as server:
        async with RawClient.connect(server.ws_url) as client:
            await _speak_ok(client, "one")
            error = await _expect_error(client, ErrorCode.IDLE_TIMEOUT)
            assert "reconnect" in error.message
            assert await client.closed() == 1000


# -- OpenAI routes ------------------------------------------------------------------------
async def test_openai_speech_formats():
    engine = FakeSpeechEngine(chunks=4)
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "tts-1", "input": "Hello.", "voice": "nova"}
        r = await http.post("/v1/audio/speech", json={**body, "response_format": "pcm"})
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        assert len(r.content) == 4 * 1600 * 3 // 2 * 2  # 16 kHz -> 24 kHz
        assert engine.calls[-1][1] == "female" and r.headers["x-request-id"].startswith("http-")
        r = await http.post("/v1/audio/speech", json={**body, "voice": "onyx", "speed": 1.0,
                            "instructions": "calm", "response_format": "WAV"})  # fmt: skip
        assert r.headers["content-type"] == "audio/wav" and r.content[:4] == b"RIFF"
        assert len(r.content) == 44 + 4 * 2400 * 2 and engine.calls[-1][1] == "male"
        r = await http.post("/v1/audio/speech", json={**body, "voice": "male:high",
                            "response_format": "pcm", "sample_rate": 16000, "seed": 4})  # fmt: skip
        assert len(r.content) == 4 * CHUNK_BYTES
        assert engine.calls[-1][1:] == ("male:high", {"seed": 4})
        r = await http.post("/v1/audio/speech", json={**body, "voice": {"id": "female"},
                            "response_format": "pcm", "stream_format": "sse"})  # fmt: skip
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events[-2:]] == ["speech.audio.delta", "speech.audio.done"]
        import base64

        audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert len(audio) == 4 * 2400 * 2 and events[-1]["usage"]["output_tokens"] == 40


@pytest.mark.parametrize(
    "fmt, media_type, magic",
    [(None, "audio/mpeg", b"\xff"), ("opus", "audio/ogg", b"OggS"), ("aac", "audio/aac", b"\xff"),
     ("flac", "audio/flac", b"fLaC")],
)  # fmt: skip
async def test_openai_compressed_formats(fmt, media_type, magic):
    """mp3 by default (OpenAI's), and opus / aac / flac: each decodes to the tone it carries."""
    engine = FakeSpeechEngine(chunks=4)
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "tts-1", "input": "Hello.", "voice": "nova"}
        if fmt:
            body["response_format"] = fmt
        r = await http.post("/v1/audio/speech", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == media_type
        assert r.content.startswith(magic)
        samples = decoded_samples(r.content, 24000)
        # 4 chunks at 24 kHz, plus what a lossy encoder adds (its priming and last-frame padding)
        assert 4 * 2400 <= samples <= 4 * 2400 + 2400


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"input": "Hi", "response_format": "ogg"}, 400, "use one of pcm, wav, mp3, opus"),
        ({"input": "Hi", "response_format": "opus", "sample_rate": 22050}, 400, "12000, 16000"),
        ({"input": "Hi", "speed": 2.5}, 400, "speed must be from 0.5 to 2.0"),
        ({"input": "Hi", "voice": "robot"}, 400, "unknown voice 'robot'"),
        ({"input": "Hi", "stream_format": "chunks"}, 400, "'audio' or 'sse'"),
        ({"voice": "alloy"}, 400, "'input'"),
        ({"input": "...!"}, 400, "nothing to say"),
        ({"input": "x" * 5000}, 400, "cap of 4096"),
        ({"input": "Hi", "temperature": "hot"}, 400, "'temperature'"),
        ({"input": "Hi", "temperature": 7.0}, 400, "temperature must be in [0, 2]"),
        ({"input": "Hi", "sample_rate": 1000}, 400, "8000, 11025, 12000"),
    ],
)
async def test_openai_speech_errors_name_the_fix(body, status, words):
    async with (
        serving(FakeSpeechEngine()) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        r = await http.post("/v1/audio/speech", json=body)
        assert r.status_code == status and words in r.json()["error"]["message"], r.text


async def test_openai_errors_before_and_after_first_audio():
    engine = FakeSpeechEngine(chunks=4, fail_at=0, failures=1)
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        body = {"input": "Hello.", "response_format": "pcm"}
        r = await http.post("/v1/audio/speech", json=body)
        assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
        r = await http.post("/v1/audio/speech", content=b"{nope")
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
        engine.fail_at, engine.failures = 2, 3
        received = bytearray()
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            async with http.stream("POST", "/v1/audio/speech", json=body) as r:
                assert r.status_code == 200
                async for piece in r.aiter_bytes():
                    received += piece
        assert 0 < len(received) <= 2 * 2400 * 2  # cut short, and the transfer says so
        lines = []
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            sse = {**body, "stream_format": "sse"}
            async with http.stream("POST", "/v1/audio/speech", json=sse) as r:
                async for line in r.aiter_lines():
                    lines.append(line)
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        error = events[-1]["error"]
        assert events[-1]["type"] == "error" and error["code"] == "generation_failed"
        assert error["message"].startswith("generation failed on the server (request http-")
        assert error["message"].endswith("(cut short after 0.20 s of audio)")
        await until(lambda: server.state.slots.active == 0)  # released just after the body


async def test_models_voices_health_ready_metrics():
    async with (
        serving(FakeSpeechEngine()) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        models = (await http.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]][:2] == ["fake-veena", "tts-1"]
        voices = (await http.get("/v1/audio/voices")).json()
        assert voices["voices"] == ["female", "male"] and voices["default"] == "female"
        assert voices["openai_aliases"]["shimmer"] == "female"
        assert voices["openai_aliases"]["echo"] == "male" and len(voices["openai_aliases"]) == 13
        assert (await http.get("/health")).json()["status"] == "ok"
        assert (await http.get("/ready")).status_code == 200
        await http.post("/v1/audio/speech", json={"input": "Hi", "response_format": "pcm"})
        text = (await http.get("/metrics")).text
        for name in (
            'veena_active_streams{api="http"} 0.0',
            'veena_requests_total{api="http",outcome="completed"} 1.0',
            "veena_time_to_first_audio_seconds_bucket",
            "veena_real_time_factor_count",
            "veena_engine_unfinished_requests 0.0",
            "veena_decode_batch_size",
            "veena_ready 1.0",
        ):
            assert name in text, name


async def test_voice_map_is_configurable_and_checked():
    settings = ServerSettings(voice_map={"alloy": "male"})
    async with serving(FakeSpeechEngine(), settings) as server:
        assert server.state.voice_map["alloy"] == "male"
        assert server.state.voice_map["nova"] == "female"  # unmapped names: the default voice
    bad = ServerSettings(voice_map={"alloy": "robot"})
    async with serving(FakeSpeechEngine(), bad) as server:  # a bad map never fails the start
        assert server.state.ready
        with pytest.raises(ValueError, match="'alloy' maps to 'robot' .* no voice here") as off:
            server.state.resolve_voice("alloy")  # the alias is off, and says why
        assert off.value.code == ErrorCode.UNKNOWN_VOICE
        assert server.state.resolve_voice("nova") == "female"


class _SlowStart(FakeSpeechEngine):
    """A fake engine whose start waits for ``go`` (or fails with ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.start_error = error

    async def start(self) -> None:
        await self.go.wait()
        if self.start_error is not None:
            raise self.start_error
        await super().start()


@pytest.mark.parametrize("fails", [False, True])
async def test_health_is_live_while_the_engine_loads_and_ready_after(fails):
    from pipecat_veena.server import ServerHandle, create_app

    engine = _SlowStart(RuntimeError("no GPU memory left") if fails else None)
    handle = await ServerHandle(create_app(engine)).start()
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            assert (await http.get("/health")).status_code == 200
            r = await http.get("/ready")
            assert r.status_code == 503 and r.json()["status"] == "server_starting"
            async with RawClient.connect(handle.ws_url, ready=False) as client:
                await _expect_error(client, ErrorCode.SERVER_STARTING)
                assert await client.closed() == 1013
            engine.go.set()
            await asyncio.gather(handle.state.wait_started(), return_exceptions=True)
            health, ready = await http.get("/health"), await http.get("/ready")
            if fails:
                assert health.status_code == 503 and "failed to start" in health.json()["detail"]
                assert "no GPU memory" in handle.state.failed  # the log and the CLI say it
                assert ready.status_code == 503 and ready.json()["status"] == "engine_unavailable"
            else:
                assert health.status_code == ready.status_code == 200
    finally:
        await handle.stop()
    assert not engine.is_running  # the app owned it


async def test_drain_finishes_in_flight_refuses_new_then_cancels_the_rest():
    engine = FakeSpeechEngine(chunks=30, delay=0.02)
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        async with RawClient.connect(server.ws_url) as client:
            await client.send({"type": "speak", "id": "inflight", "text": "Keep going."})
            assert isinstance(await client.recv(), AudioFrame)
            drain = asyncio.create_task(server.state.drain(30))
            await until(lambda: server.state.draining)
            r = await http.get("/ready")
            assert r.status_code == 503 and r.json()["status"] == "server_draining"
            await client.send({"type": "speak", "id": "new", "text": "Hello."})
            ends = {}
            while len(ends) < 2:
                message = await client.recv()
                if not isinstance(message, AudioFrame | GoAway):
                    ends[message.id] = message
            assert ends["inflight"].type == "done" and ends["inflight"].reason == "completed"
            assert ends["new"].code == ErrorCode.SERVER_DRAINING and ends["new"].ended
            r = await http.post("/v1/audio/speech", json={"input": "Hi"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "server_draining"
            assert await drain == 0
    engine = FakeSpeechEngine(endless=True, delay=0.01)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "forever", "text": "Never ends."})
        assert isinstance(await client.recv(), AudioFrame)
        assert await server.state.drain(0.2) == 1
        _, end = await client.until_end("forever")
        assert end.code == ErrorCode.SERVER_DRAINING and end.ended
        assert not engine.open


async def test_drain_tells_every_connection_to_go_and_closes_each_once_idle():
    """On drain each WebSocket gets a goaway at once; an idle one is closed with 1012 at once,
    a busy one as soon as its utterance in flight has ended (with all its audio and its done),
    so that clients redial another server before they need one."""
    engine = FakeSpeechEngine(chunks=30, delay=0.02)
    async with serving(engine) as server:
        async with (
            RawClient.connect(server.ws_url) as idle,
            RawClient.connect(server.ws_url) as busy,
        ):
            await busy.send({"type": "speak", "id": "inflight", "text": "Keep going."})
            assert isinstance(await busy.recv(), AudioFrame)
            drain = asyncio.create_task(server.state.drain(30))
            goaway = await idle.recv()
            assert isinstance(goaway, GoAway) and goaway.code == ErrorCode.SERVER_DRAINING
            assert await idle.closed() == CLOSE_GOING_AWAY
            assert not drain.done()  # the busy connection is still speaking
            seen = []
            while not seen or getattr(seen[-1], "type", None) != "done":
                seen.append(await busy.recv())
            kinds = ["audio" if isinstance(m, AudioFrame) else m.type for m in seen]
            assert "goaway" in kinds and kinds[-1] == "done" and seen[-1].reason == "completed"
            assert kinds.index("goaway") < len(kinds) - 1  # told before its utterance ended
            frames = 1 + kinds.count("audio")
            assert frames == 30
            assert await busy.closed() == CLOSE_GOING_AWAY
            assert await drain == 0
            async with RawClient.connect(server.ws_url, ready=False) as late:  # new ones: 1013
                refused = await late.recv()
                assert refused.code == ErrorCode.SERVER_DRAINING
                assert await late.closed() == 1013


async def test_fuzz_every_malformed_message_and_request_gets_an_error():
    """250 malformed WebSocket messages and 150 malformed HTTP requests, while another client
    speaks: each gets an error, the victim's audio is whole, the server stays healthy."""
    engine = FakeSpeechEngine(chunks=6, delay=0.005)
    rng = random.Random(2024)
    ws_cases, http_cases = protocol_fuzz.ws_cases(rng, 250), protocol_fuzz.http_cases(rng, 150)
    async with serving(engine) as server:

        async def victim() -> list[int]:
            sizes = []
            async with RawClient.connect(server.ws_url) as client:
                for i in range(8):
                    await client.send({"type": "speak", "id": f"v{i}", "text": "Good."})
                    frames, done = await client.until_end(f"v{i}")
                    assert done.type == "done" and done.reason == "completed"
                    sizes.append(len(pcm_of(frames)))
            return sizes

        async def fuzz_ws() -> int:
            answered = 0
            async with RawClient.connect(server.ws_url) as client:
                for case in ws_cases:
                    await client.send(case)
                    message = await client.recv()
                    assert message.type == "error" and message.code and message.message, case
                    speak_id = _speak_id(case)
                    if speak_id is not None:  # a refused speak ends its utterance
                        assert (message.id, message.ended) == (speak_id, True), case[:200]
                    answered += 1
                for i, text in enumerate(protocol_fuzz.HOSTILE_TEXTS):  # spoken, or refused
                    await client.send({"type": "speak", "id": f"h{i}", "text": text, "options": {
                        "seed": 2**63 - 1, "top_k": -1, "repetition_penalty": 1e9}})  # fmt: skip
                    _, end = await client.until_end(f"h{i}")
                    assert end.type == "done" or (end.ended and end.code != "internal"), end
            return answered

        async def fuzz_http() -> int:
            answered = 0
            async with httpx.AsyncClient(base_url=server.url) as http:
                for method, path, body in http_cases:
                    r = await http.request(method, path, content=body)
                    assert 400 <= r.status_code < 500, (r.status_code, body[:80])
                    error = r.json()
                    assert error.get("error", {}).get("message") or error.get("detail"), r.text
                    answered += 1
            return answered

        sizes, ws_answered, http_answered = await asyncio.gather(victim(), fuzz_ws(), fuzz_http())
        assert sizes == [6 * CHUNK_BYTES] * 8
        assert ws_answered + http_answered == 400
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/health")).status_code == 200
        assert server.state.slots.active == 0 and not engine.open


def _speak_id(case: str | bytes) -> str | None:
    """The string id of a fuzz case that is a ``speak`` (its refusal must end that id)."""
    if isinstance(case, bytes):
        return None
    try:
        data = json.loads(case)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, dict) and data.get("type") == "speak" and isinstance(data.get("id"), str):
        return data["id"]
    return None


async def test_server_sockets_disable_nagle():
    """A small message (a done) followed by audio must not wait for a delayed ACK (~40 ms):
    the listening socket says TCP and sets TCP_NODELAY, which accepted sockets inherit."""
    async with serving(FakeSpeechEngine()) as server:
        (listener,) = server._server.servers[0].sockets
        assert listener.proto == socket.IPPROTO_TCP
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
