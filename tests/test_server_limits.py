"""Hostile WebSocket clients against the real server (uvicorn on loopback, fake engine): slot
holding with never-final utterances, one anonymous client taking every slot, odd output rates,
oversized handshakes, clients that never read. The defects live in the server, so the engine is
the fake of tests/server_fakes.py."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from server_fakes import FakeSpeechEngine, RawClient, pcm_of, serving, until
from websockets.asyncio.client import connect

from pipecat_veena.remote.protocol import SAMPLE_RATES, ErrorCode
from pipecat_veena.resample import _filter_bank
from pipecat_veena.server import ServerSettings
from pipecat_veena.server.speech import SpeechRun

_HANDSHAKE = (
    b"GET /v1/audio/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


def _frame(payload: bytes, opcode: int) -> bytes:
    """A masked client frame (payload under 126 bytes)."""
    mask = b"\x01\x02\x03\x04"
    assert len(payload) < 126
    return (
        bytes((0x80 | opcode, 0x80 | len(payload)))
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


def _speak(uid: str, **fields) -> dict:
    return {"type": "speak", "id": uid, "text": "", "final": False} | fields


async def _served(url: str, uid: str, *, local: str = "127.0.0.1") -> str:
    """Speak once from address ``local``; returns the outcome (``completed`` or an error code)."""
    async with connect(url, compression=None, local_addr=(local, 0)) as ws:
        client = RawClient(ws)
        client.ready = await client.recv()
        await client.send({"type": "speak", "id": uid, "text": "Hello there."})
        frames, end = await client.until_end(uid)
        return end.reason if end.type == "done" and pcm_of(frames) else end.code


# -- slots --------------------------------------------------------------------------------
async def test_never_final_utterances_on_one_connection_cannot_lock_others_out():
    """64 never-ending ``final: false`` speaks on one connection took every slot of an open
    server; now the connection holds at most ``max_open_utterances`` of them, and each ends
    with ``text_timeout`` once it waits for text too long."""
    settings = ServerSettings(open_utterance_timeout_s=1.0)
    async with serving(FakeSpeechEngine(chunks=2), settings) as server:
        async with RawClient.connect(server.ws_url) as attacker:
            for i in range(64):
                await attacker.send(_speak(f"a{i}"))
            refused = 0
            for _ in range(64 - settings.max_open_utterances):
                error = await attacker.recv()
                assert error.type == "error" and error.ended, error
                assert error.code == ErrorCode.TOO_MANY_OPEN_UTTERANCES, error
                refused += 1
            assert server.state.slots.active == settings.max_open_utterances
            assert await _served(server.ws_url, "victim") == "completed"
            timed_out = set()
            while len(timed_out) < settings.max_open_utterances:
                error = await attacker.recv()
                assert error.code == ErrorCode.TEXT_TIMEOUT and error.ended, error
                assert "end" in error.message
                timed_out.add(error.id)
            await until(lambda: server.state.slots.active == 0)


async def test_an_open_utterance_fed_text_or_speaking_does_not_time_out():
    settings = ServerSettings(open_utterance_timeout_s=0.4)
    engine = FakeSpeechEngine(chunks=6, delay=0.15)  # a sentence speaks for ~0.9 s
    async with serving(engine, settings) as server, RawClient.connect(server.ws_url) as client:
        await client.send(_speak("u", text="One"))
        for piece in (" two", " three", " four", " five"):  # text, no sentence end yet
            await asyncio.sleep(0.2)
            await client.send({"type": "append", "id": "u", "text": piece})
        await client.send({"type": "append", "id": "u", "text": ". Next"})
        await asyncio.sleep(0.2)
        await client.send({"type": "end", "id": "u"})
        frames, end = await client.until_end("u")
        assert end.type == "done" and end.reason == "completed", end
        assert [call[0] for call in engine.calls] == ["One two three four five. ", "Next"]


async def test_one_anonymous_client_cannot_take_every_slot():
    """Without API keys everyone shares one key: one address with many connections took all
    64 slots. Now each address gets ``max_streams_per_anonymous_client`` of them."""
    settings = ServerSettings(open_utterance_timeout_s=30.0)
    cap = settings.max_streams_per_anonymous_client
    async with serving(FakeSpeechEngine(chunks=2), settings) as server:
        attackers = [
            await connect(server.ws_url, compression=None, local_addr=("127.0.0.2", 0))
            for _ in range(64 // settings.max_open_utterances)
        ]
        try:
            codes = []
            for n, ws in enumerate(attackers):
                client = RawClient(ws)
                await client.recv()  # ready
                for i in range(settings.max_open_utterances):
                    await client.send(_speak(f"a{n}-{i}"))
                await asyncio.sleep(0.05)
            await until(lambda: server.state.slots.active == cap)
            for ws in attackers:
                while True:
                    try:
                        message = await RawClient(ws).recv(0.2)
                    except TimeoutError:
                        break
                    codes.append(message.code)
            assert codes == [ErrorCode.TOO_MANY_STREAMS] * (64 - cap)
            assert await _served(server.ws_url, "victim", local="127.0.0.3") == "completed"
            same_address = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(transport=same_address) as http:  # the same cap on HTTP
                r = await http.post(
                    f"{server.url}/v1/audio/speech",
                    json={"input": "Hi.", "response_format": "pcm"},
                )
            assert r.status_code == 429 and "address" in r.json()["error"]["message"]
        finally:
            for ws in attackers:
                await ws.close()
        await until(lambda: server.state.slots.active == 0)


# -- output rates ---------------------------------------------------------------------------
async def test_only_listed_output_rates_and_their_banks_are_built_once_off_the_loop():
    engine = FakeSpeechEngine(chunks=1)
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "odd", "text": "Hi.", "sample_rate": 47999})
        error = await client.recv()
        assert error.code == ErrorCode.UNSUPPORTED_SAMPLE_RATE and "44100" in error.message
        assert client.ready.limits["sample_rates"] == list(SAMPLE_RATES)
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{server.url}/v1/audio/speech",
                json={"input": "Hi.", "response_format": "pcm", "sample_rate": 47999},
            )
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_sample_rate"
        built = _filter_bank.cache_info().misses  # the server built every bank at start
        for rate in SAMPLE_RATES:
            await client.send({"type": "speak", "id": f"r{rate}", "text": "Hi.",
                               "sample_rate": rate})  # fmt: skip
            frames, done = await client.until_end(f"r{rate}")
            assert done.type == "done" and done.sample_rate == rate and pcm_of(frames)
        assert _filter_bank.cache_info().misses == built


async def test_a_resampler_that_cannot_be_built_leaks_no_slot():
    async with serving(FakeSpeechEngine()) as server:
        with pytest.raises(ValueError, match="sample rates must be positive"):
            SpeechRun(server.state, api="ws", key="anonymous", voice="female", options={},
                      out_rate=0, cancel=lambda code: None)  # fmt: skip
        assert server.state.slots.active == 0 and not server.state._runs


# -- the socket -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [9000, 70000])
async def test_a_handshake_with_an_oversized_header_is_answered_at_once(size):
    loop = asyncio.get_running_loop()
    async with serving(FakeSpeechEngine()) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.setblocking(False)
            await loop.sock_sendall(sock, _HANDSHAKE + b"X-Big: " + b"a" * size + b"\r\n\r\n")
            answer = await asyncio.wait_for(loop.sock_recv(sock, 200), 5)
            assert answer.startswith(b"HTTP/1.1 431 ")
            async with asyncio.timeout(5):  # and closed
                while await loop.sock_recv(sock, 4096):
                    pass


async def _stalled(port: int) -> socket.socket:
    """A WebSocket client with a tiny receive buffer that will never read."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, _HANDSHAKE + b"\r\n")
    assert (await loop.sock_recv(sock, 12)).startswith(b"HTTP/1.1 101")
    return sock


async def test_a_client_that_pings_but_never_reads_is_cut():
    """Pongs went into the server's write buffer whatever it held: 8 MiB of pings from a client
    that reads nothing became ~8 MiB of server memory. Now it is cut past send_buffer_bytes."""
    settings = ServerSettings(send_buffer_bytes=256 * 1024)
    loop = asyncio.get_running_loop()
    async with serving(FakeSpeechEngine(), settings) as server:
        sock = await _stalled(server.port)
        ping = _frame(b"p" * 125, 0x9)
        sent = 0
        try:
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                while sent < 8 << 20:
                    await asyncio.wait_for(loop.sock_sendall(sock, ping * 64), 10)
                    sent += len(ping) * 64
        finally:
            sock.close()


async def test_a_dropped_slow_client_does_not_keep_its_socket():
    """A client that never reads is dropped after slow_client_timeout_s; its socket (and its
    buffers) were then kept open forever, waiting to be written. Now it goes too."""
    settings = ServerSettings(slow_client_timeout_s=0.5, send_buffer_bytes=64 * 1024)
    engine = FakeSpeechEngine(endless=True, chunk_samples=16000)
    loop = asyncio.get_running_loop()
    async with serving(engine, settings) as server:
        connections = server._server.server_state.connections
        sock = await _stalled(server.port)
        try:
            speak = json.dumps({"type": "speak", "id": "s", "text": "Never read."}).encode()
            await loop.sock_sendall(sock, _frame(speak, 0x1))
            await until(lambda: engine.closed_streams >= 1, wait_s=30)  # dropped
            await until(lambda: not connections, wait_s=10)
        finally:
            sock.close()
