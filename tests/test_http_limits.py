"""The HTTP side on real sockets: truthful ends and the limits a hostile client meets.

A speech stream that cannot finish (generation failed after the first audio, the server
draining) must end as an incomplete transfer that the clients users have (the ``openai`` client,
Pipecat's OpenAITTSService in a pipeline, LiveKit's openai.TTS) report as an error, not as a
short, complete-looking 200. The limits (Content-Length, streamed size, body deadline, head
deadline, header size and count, connection cap) are driven with raw sockets, with small limits
so that every case ends in well under a second when the limit works. The server runs over the
fake engine (tests/server_fakes.py): the defects live in the HTTP layer.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import openai
import pytest
from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame
from server_fakes import FakeSpeechEngine, openai_tts_service_speaks, serving, until

from pipecat_veena.server import ServerSettings

SPEECH = "/v1/audio/speech"
BODY = {"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"}
#: Small limits: each case ends fast when the limit holds, and hangs past WAIT when it does not.
LIMITS = ServerSettings(
    max_message_bytes=4096, body_timeout_s=0.5, header_timeout_s=0.5, max_header_bytes=4096,
    max_headers=20, max_connections=10,
)  # fmt: skip
#: How long a raw client waits for an answer before calling it a hang.
WAIT = 5.0


def _failing_after_first_audio() -> FakeSpeechEngine:
    # 0.8 s of audio first: Pipecat's service pushes its first frame after 0.5 s
    return FakeSpeechEngine(chunks=12, fail_at=8, failures=1000)


# -- truthful HTTP ----------------------------------------------------------------------------
async def test_openai_client_reports_a_stream_cut_short():
    async with serving(_failing_after_first_audio()) as server:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        received = bytearray()
        with pytest.raises(Exception, match="incomplete chunked read"):  # the SDK's own httpx
            async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="Hello there.", response_format="pcm"
            ) as response:
                async for piece in response.iter_bytes():
                    received += piece
        assert received  # the first audio came, then the transfer broke off
        await client.close()
        await until(lambda: server.state.slots.active == 0)


async def test_pipecat_openai_tts_service_reports_a_stream_cut_short():
    async with serving(_failing_after_first_audio()) as server:
        down, up = await openai_tts_service_speaks(server.url, "Pipecat's own OpenAI service.")
        assert [f for f in up if isinstance(f, ErrorFrame)], "the cut went unnoticed"
        assert [f for f in down if isinstance(f, TTSAudioRawFrame)]  # the audio before it


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])  # raw audio, then SSE
async def test_livekit_openai_plugin_reports_a_stream_cut_short(model):
    from livekit.agents import APIConnectOptions, APIError
    from livekit.plugins import openai as lk_openai

    async with serving(_failing_after_first_audio()) as server:
        tts = lk_openai.TTS(
            base_url=f"{server.url}/v1", api_key="unused", model=model, voice="alloy",
            response_format="pcm",
        )  # fmt: skip
        try:
            with pytest.raises(APIError):
                await tts.synthesize(
                    "LiveKit's OpenAI plugin.", conn_options=APIConnectOptions(max_retry=0)
                ).collect()
        finally:
            await tts.aclose()


async def test_a_drain_mid_stream_aborts_the_transfer_and_sse_says_why():
    engine = FakeSpeechEngine(endless=True, delay=0.02)
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        lines: list[str] = []
        draining = None
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            async with http.stream("POST", SPEECH, json={**BODY, "stream_format": "sse"}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    lines.append(line)
                    if len(lines) == 4:
                        draining = asyncio.ensure_future(server.state.drain(deadline_s=0.01))
        await draining
        error = json.loads(lines[-2][6:])["error"]  # the last event, then the blank line
        assert error["code"] == "server_draining"
        assert error["message"].startswith("the server is shutting down; retry elsewhere")
        assert error["message"] != error["code"]


async def test_voice_objects_other_than_openais_custom_voice_are_refused():
    engine = FakeSpeechEngine()
    async with serving(engine) as server, httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(SPEECH, json={**BODY, "voice": {"name": "male"}})
        assert r.status_code == 400 and not engine.calls
        assert '{"id": <voice>}' in r.json()["error"]["message"]
        r = await http.post(SPEECH, json={**BODY, "voice": {"id": "voice_68a1c0ffee"}})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_voice"
        assert "voice_68a1c0ffee" in r.json()["error"]["message"] and not engine.calls
        r = await http.post(SPEECH, json={**BODY, "voice": {"id": "male"}})
        assert r.status_code == 200 and engine.calls[-1][1] == "male"


# -- body limits ----------------------------------------------------------------------------
async def _raw(url: str):
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _answer(reader: asyncio.StreamReader) -> tuple[int | None, bytes]:
    """The status and body the server sent before it closed (None: closed without a word)."""
    data = await asyncio.wait_for(reader.read(), WAIT)  # until the server closes
    if not data:
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _head(path: str = SPEECH, *, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n{extra}".encode()
    )


async def _drip(writer: asyncio.StreamWriter, pieces: list[bytes]) -> None:
    """A slow client: one piece every 0.1 s."""
    for piece in pieces:
        writer.write(piece)
        await asyncio.sleep(0.1)


async def test_a_declared_oversized_body_gets_413_at_once():
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        reader, writer = await _raw(server.url)
        writer.write(_head(extra="content-length: 100000000\r\n\r\n") + b"x" * 6000)
        status, body = await _answer(reader)  # old main: waits for the rest (a hang)
        assert status == 413 and b"100000000 bytes (Content-Length)" in body
        writer.close()


async def test_a_chunked_body_is_read_only_up_to_the_cap():
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        reader, writer = await _raw(server.url)
        writer.write(_head(extra="transfer-encoding: chunked\r\n\r\n"))
        for _ in range(3):  # 6 kB of a body that does not end
            writer.write(b"800\r\n" + b"x" * 0x800 + b"\r\n")
        status, body = await _answer(reader)  # old main: reads on until the body ends
        assert status == 413 and b"over this server's cap of 4096 bytes" in body
        writer.close()


async def test_a_slow_body_is_cut_at_the_deadline():
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        reader, writer = await _raw(server.url)
        writer.write(_head(extra="content-length: 100\r\n\r\n"))
        dripping = asyncio.ensure_future(_drip(writer, [b" "] * 100))
        status, body = await _answer(reader)  # old main: takes it all, 10 s later
        dripping.cancel()
        assert status == 408 and b"body_timeout_s" in body
        writer.close()


# -- the head and the connections ---------------------------------------------------------
async def test_slowloris_headers_are_cut_at_the_deadline():
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        reader, writer = await _raw(server.url)
        writer.write(_head())
        dripping = asyncio.ensure_future(_drip(writer, [b"x-%d: y\r\n" % i for i in range(100)]))
        status, body = await _answer(reader)  # old main: never
        dripping.cancel()
        assert status == 408 and b"header_timeout_s" in body
        writer.close()


@pytest.mark.parametrize(
    "headers, words",
    [("x-big: " + "y" * 10_000 + "\r\n", b"over this server's cap of 4096 bytes"),
     ("".join(f"x-{i}: y\r\n" for i in range(200)), b"202 header fields, over")],
)  # fmt: skip
async def test_oversized_heads_get_431(headers, words):
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        reader, writer = await _raw(server.url)
        writer.write(_head("/health").replace(b"POST", b"GET") + headers.encode() + b"\r\n")
        status, body = await _answer(reader)  # old main (httptools): 200
        assert status == 431 and words in body, body
        writer.close()


async def test_a_long_header_line_on_a_websocket_handshake_gets_431():
    async with serving(FakeSpeechEngine()) as server:
        reader, writer = await _raw(server.url)
        writer.write(
            b"GET /v1/audio/stream HTTP/1.1\r\nhost: test\r\nupgrade: websocket\r\n"
            b"connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"sec-websocket-version: 13\r\nx-big: " + b"y" * 9000 + b"\r\n\r\n"
        )
        status, body = await _answer(reader)  # old main: no answer, the socket stays open
        assert status == 431 and b"8192 bytes" in body
        writer.close()


@pytest.mark.parametrize("count, status", [(95, 101), (110, 431)])
async def test_a_websocket_handshake_takes_the_documented_header_count(count, status):
    """docs/protocol.md said 128 handshake headers in one place and 100 in another: the
    server's ``max_headers`` (100 by default) holds for handshakes too (tests/test_docs.py
    checks the docs quote it)."""
    async with serving(FakeSpeechEngine()) as server:
        reader, writer = await _raw(server.url)
        fields = "".join(f"x-{i}: y\r\n" for i in range(count - 5))  # + the 5 below
        writer.write(
            b"GET /v1/audio/stream HTTP/1.1\r\nhost: test\r\nupgrade: websocket\r\n"
            b"connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"sec-websocket-version: 13\r\n" + fields.encode() + b"\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert int(head.split(b" ", 2)[1]) == status, head
        if status == 431:
            assert b"over this server's cap of 100" in await asyncio.wait_for(reader.read(), WAIT)
        writer.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_connections_over_the_cap_are_refused_and_silent_ones_closed():
    async with serving(FakeSpeechEngine(), LIMITS) as server:
        before = _open_fds()
        silent = [await _raw(server.url) for _ in range(LIMITS.max_connections)]
        reader, writer = await _raw(server.url)  # one over the cap
        status, body = await _answer(reader)  # old main: accepted, held open
        assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
        writer.close()
        # the silent ones are closed at the head deadline (old main: never)
        answers = await asyncio.gather(*(_answer(r) for r, _ in silent))
        assert answers == [(None, b"")] * len(silent)
        for _, w in silent:
            w.close()
        await until(lambda: _open_fds() <= before)  # the server kept no socket
        async with httpx.AsyncClient(base_url=server.url) as http:  # and serves again
            assert (await http.post(SPEECH, json=BODY)).status_code == 200
