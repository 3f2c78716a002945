"""examples/twilio_bot.py on real sockets and the real engine, driven by a Twilio Media Streams
client written from Twilio's public protocol (connected, start, media, stop; JSON over a
WebSocket, 8 kHz mu-law in base64): the greeting arrives whole, other clients are refused, a
client that leaves before its handshake harms nothing, and the webhook checks signatures."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import websockets
from recording import RecordingGenerator
from servers import serve_app

from pipecat_veena.engine import EngineConfig, VeenaEngine

pytestmark = pytest.mark.vllm
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _bot():
    spec = importlib.util.spec_from_file_location("twilio_bot", EXAMPLES / "twilio_bot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest_asyncio.fixture(scope="module")
async def twilio(spark_tiny_checkpoint, spark_generator):
    recorder = RecordingGenerator(spark_generator)
    engine = VeenaEngine(EngineConfig(checkpoint=spark_tiny_checkpoint), generator=recorder)
    await engine.start()
    module = _bot()
    try:
        async with serve_app(module.create_app(engine)) as url:
            yield module, url, engine, recorder
    finally:
        await engine.shutdown()


def _start_messages(stream_sid: str, call_sid: str) -> list[str]:
    start = {
        "accountSid": "AC00000000000000000000000000000000",
        "streamSid": stream_sid,
        "callSid": call_sid,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {},
    }
    return [
        json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
        json.dumps(
            {"event": "start", "sequenceNumber": "1", "start": start, "streamSid": stream_sid}
        ),
    ]


async def _call(url: str, *, seconds: float) -> tuple[bytes, float | None]:
    """One call: handshake, then collect the bot's mu-law audio for ``seconds``."""
    audio, first = b"", None
    started = time.monotonic()
    async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
        for message in _start_messages("MZtest", "CAtest"):
            await ws.send(message)
        deadline = started + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=left))
            except TimeoutError:
                break
            if message.get("event") == "media":
                assert message["streamSid"] == "MZtest"
                if first is None:
                    first = time.monotonic() - started
                audio += base64.b64decode(message["media"]["payload"])
        await ws.send(json.dumps({"event": "stop", "streamSid": "MZtest"}))
    return audio, first


async def test_the_greeting_reaches_a_twilio_client_whole(twilio):
    module, url, engine, recorder = twilio
    recorder.outputs.clear()
    audio, first = await _call(url, seconds=20)
    assert first is not None, "no audio reached the caller"
    ids = engine._format.ids
    semantics = sum(
        1 for out in recorder.outputs.values() for t in out if 0 <= t - ids.semantic_base < 8192
    )
    # mu-law: one byte per sample at 8 kHz; 320 samples at 16 kHz per semantic token
    assert len(audio) == pytest.approx(semantics * 160, abs=2)
    assert engine.stats()["unfinished_requests"] == 0


async def test_other_clients_are_refused_and_early_leavers_harm_nothing(twilio):
    _, url, engine, _ = twilio
    ws_url = url.replace("http", "ws") + "/ws"
    async with websockets.connect(ws_url) as ws:  # leaves before any handshake
        pass
    async with websockets.connect(ws_url) as ws:  # not Twilio: a browser-like client
        await ws.send(json.dumps({"hello": "world"}))
        await ws.send(json.dumps({"event": "unknown"}))
        with pytest.raises(websockets.ConnectionClosed) as info:
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
    assert "Twilio Media Streams only" in info.value.rcvd.reason
    audio, first = await _call(url, seconds=10)  # the bot still serves calls
    assert first is not None and audio
    assert engine.stats()["unfinished_requests"] == 0


async def test_webhook_checks_the_twilio_signature(twilio, monkeypatch):
    module, url, _, _ = twilio
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "secret-token")
    monkeypatch.setenv("PUBLIC_URL", "https://bot.example/")
    form = {"CallSid": "CAtest", "From": "+919876543210", "To": "+911234567890"}
    good = module.twilio_signature("secret-token", "https://bot.example/", form)
    async with httpx.AsyncClient(base_url=url) as client:
        body = urllib.parse.urlencode(form)
        headers = {"content-type": "application/x-www-form-urlencoded"}
        missing = await client.post("/", content=body, headers=headers)
        wrong = await client.post(
            "/", content=body, headers={**headers, "x-twilio-signature": "AAAA"}
        )
        right = await client.post(
            "/", content=body, headers={**headers, "x-twilio-signature": good}
        )
    assert missing.status_code == 403 and wrong.status_code == 403
    assert right.status_code == 200 and "<Stream url=" in right.text
