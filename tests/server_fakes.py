"""Fakes and helpers for the speech server's tests: a scriptable SpeechEngine and a raw client.

``FakeSpeechEngine`` implements the SpeechEngine Protocol with a tone generator, so the server's
protocol edge cases (limits, slow clients, faults before and after first audio) can be driven
exactly and fast; test_server_real.py runs the same server over the real vLLM engine.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import websockets
from websockets.asyncio.client import connect

from pipecat_veena.engine import AudioChunk, Voice, VoiceBook, check_speed
from pipecat_veena.errors import EngineNotRunningError, GenerationError
from pipecat_veena.generation import SamplingOptions
from pipecat_veena.interface import WordTiming
from pipecat_veena.remote.protocol import AudioFrame, decode_audio_frame, parse_server_message
from pipecat_veena.server import ServerHandle, ServerSettings, create_app
from pipecat_veena.timing import split_words

RATE = 16000
#: Bytes of one fake chunk (1600 int16 samples: 0.1 s).
CHUNK_BYTES = 1600 * 2


class FakeSpeechEngine:
    """A fake SpeechEngine speaking a 220 Hz tone: ``chunks`` chunks of ``chunk_samples``.

    Each chunk counts 10 LLM tokens. ``delay`` is the wait before each chunk (``delays[i]``
    before chunk ``i`` where given); ``endless`` keeps
    speaking until closed. The first ``failures`` streams raise ``error`` just before chunk
    ``fail_at`` (0: before any audio). Open streams are tracked (``open``, ``stats()``), and
    every call is recorded (``calls``), so tests can see that closing a stream closed it here.
    With ``words`` it times words (``times_words``): chunk i carries the text's word i, timed
    to fill that chunk exactly (its end is the chunk's last sample).
    """

    model_name = "fake-veena"
    emotion_tags = ("<laugh>",)

    def __init__(
        self,
        *,
        chunks: int = 4,
        chunk_samples: int = CHUNK_BYTES // 2,
        delay: float = 0.0,
        delays: tuple[float, ...] = (),
        endless: bool = False,
        fail_at: int | None = None,
        failures: int = 1,
        error: Exception | None = None,
        words: bool = False,
    ) -> None:
        self.chunks, self.chunk_samples = chunks, chunk_samples
        self.times_words = words
        self.delay, self.delays, self.endless = delay, delays, endless
        self.fail_at, self.failures = fail_at, failures
        self.error = error or GenerationError("injected: the LLM request failed")
        self.calls: list[tuple[str, str | None, dict]] = []
        self.open: set[str] = set()
        self.closed_streams = 0
        self._running = False
        self._book = VoiceBook(
            {"female": Voice(name="female"), "male": Voice(name="male")}, "female",
            controllable=True,
        )  # fmt: skip

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def sample_rate(self) -> int:
        if not self._running:
            raise EngineNotRunningError("fake: not started")
        return RATE

    @property
    def voices(self) -> list[str]:
        return self._book.names

    async def start(self) -> None:
        self._running = True

    async def shutdown(self) -> None:
        self._running = False

    def check_voice(self, voice: str | None) -> str:
        return self._book.resolve(voice).name

    def check_options(self, **options) -> None:
        options.pop("normalize", None)
        if options.pop("language", "auto") not in ("auto", "hi", "en"):
            raise ValueError("language must be one of ('auto', 'hi', 'en')")
        max_tokens = options.pop("max_tokens", None)
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if options.get("speed") is not None:
            check_speed(options["speed"])
        options.pop("speed", None)
        SamplingOptions(**options)

    def stats(self) -> dict:
        return {"active_streams": len(self.open), "unfinished_requests": len(self.open)}

    async def abort(self, request_id: str) -> int:
        return 0

    async def stream(self, text, voice=None, *, request_id=None, **options):
        n = len(self.calls)
        self.calls.append((text, self.check_voice(voice), dict(options)))
        rid = f"{request_id}-{n}"
        self.open.add(rid)
        try:
            i = 0
            while self.endless or i < self.chunks:
                if n < self.failures and i == self.fail_at:
                    raise self.error
                await asyncio.sleep(self.delays[i] if i < len(self.delays) else self.delay)
                t = np.arange(i * self.chunk_samples, (i + 1) * self.chunk_samples) / RATE
                pcm = (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()
                words = ()
                if self.times_words and i < len(spans := split_words(text)):
                    (a, b), seconds = spans[i], self.chunk_samples / RATE
                    words = (WordTiming(text[a:b], i * seconds, (i + 1) * seconds, a),)
                i += 1
                yield AudioChunk(pcm, RATE, tokens=10 * i, words=words)
        finally:
            self.open.discard(rid)
            self.closed_streams += 1


@asynccontextmanager
async def serving(
    engine, settings: ServerSettings | None = None, *, owns_engine: bool = False, demo: bool = False
):
    """Serve ``engine`` on a free loopback port for the duration of the block."""
    handle = ServerHandle(create_app(engine, settings, owns_engine=owns_engine, demo=demo))
    await handle.start()
    try:
        await handle.state.wait_started()
        yield handle
    finally:
        await handle.stop()


class RawClient:
    """A bare protocol client (websockets) for tests: JSON out, parsed messages and frames in."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.ready = None

    @classmethod
    @asynccontextmanager
    async def connect(cls, url: str, *, api_key: str | None = None, ready: bool = True):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with connect(url, additional_headers=headers, compression=None) as ws:
            client = cls(ws)
            if ready:
                client.ready = await client.recv()
            yield client

    async def send(self, message: dict | str | bytes) -> None:
        await self.ws.send(json.dumps(message) if isinstance(message, dict) else message)

    async def recv(self, wait_s: float = 30.0):
        data = await asyncio.wait_for(self.ws.recv(), wait_s)
        return decode_audio_frame(data) if isinstance(data, bytes) else parse_server_message(data)

    async def until_end(self, uid: str, wait_s: float = 60.0):
        """Audio of ``uid`` and the message that ended it (done, or an error that ended it)."""
        frames = []
        while True:
            message = await self.recv(wait_s)
            if isinstance(message, AudioFrame):
                if message.id == uid:
                    frames.append(message)
            elif getattr(message, "id", None) == uid and (
                message.type == "done" or getattr(message, "ended", False)
            ):
                return frames, message

    async def until_all_end(self, uids: list[str], wait_s: float = 60.0) -> dict:
        """The message that ended each of ``uids`` (done, or an error that ended it), in
        whatever order the utterances finish (audio frames are skipped)."""
        ends: dict = {}
        while len(ends) < len(uids):
            message = await self.recv(wait_s)
            uid = getattr(message, "id", None)
            if (
                not isinstance(message, AudioFrame)
                and uid in uids
                and (message.type == "done" or getattr(message, "ended", False))
            ):
                ends[uid] = message
        return ends

    async def closed(self, wait_s: float = 30.0) -> int:
        """Read until the server closes; returns the close code."""
        try:
            while True:
                await asyncio.wait_for(self.ws.recv(), wait_s)
        except websockets.ConnectionClosed:
            return self.ws.close_code


def pcm_of(frames: list[AudioFrame]) -> bytes:
    return b"".join(f.pcm for f in frames)


ROOT = Path(__file__).resolve().parent.parent


async def until_ready(http, proc, log: Path, tries: int = 600) -> None:
    """Wait (bounded) until a ``serve`` process ``proc`` answers ``/ready`` with 200 on the
    ``http`` client; fails with the tail of its ``log`` if it exits first."""
    import httpx

    for _ in range(tries):
        assert proc.returncode is None, log.read_text()[-3000:]  # noqa: ASYNC240 (a failure)
        try:
            if (await http.get("/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError("the server never became ready")


async def until(predicate, wait_s: float = 10.0) -> None:
    """Wait (bounded, not a timing assertion) until ``predicate()`` holds."""
    for _ in range(int(wait_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def cut_off_body(port: int, headers: dict[str, str]) -> None:
    """POST a speech request that announces 1000 body bytes, send 10 and hang up."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000\r\n\r\n"
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request.encode() + b'{"input": ')
    await writer.drain()
    writer.close()


async def send_invalid_utf8(port: int, target: str) -> None:
    """Open a WebSocket on ``target`` (path and query) and send a text frame that is not UTF-8;
    returns once the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
    )
    await reader.readuntil(b"\r\n\r\n")  # 101 Switching Protocols
    payload, mask = b"\xff\xfe\xfd", b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    writer.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)  # FIN text, masked
    await writer.drain()
    await asyncio.wait_for(reader.read(), 30)  # the server closes (1007)
    writer.close()


async def openai_tts_service_speaks(url: str, text: str, voice: str = "alloy") -> tuple[list, list]:
    """Pipecat's own ``OpenAITTSService`` pointed at the server at ``url``, in a real pipeline
    at 24 kHz, speaking with ``voice``; returns the frames that went (down, up)."""
    from pipecat.frames.frames import TTSSpeakFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.tests.utils import run_test

    tts = OpenAITTSService(
        api_key="unused",
        base_url=f"{url}/v1",
        settings=OpenAITTSService.Settings(voice=voice, model="tts-1"),
    )
    return await run_test(
        tts,
        frames_to_send=[TTSSpeakFrame(text)],
        pipeline_params=PipelineParams(audio_out_sample_rate=24000),
    )
