"""A Twilio phone bot: FastAPI serves TwiML and the media WebSocket; audio at 8 kHz mu-law.

One engine is started in the app's lifespan (once per process) and every call gets its own
pipeline and VeenaTTSService over it: a VeenaEngine in this process, or, with VEENA_SERVER_URL
set, a RemoteVeenaEngine speaking to a ``pipecat-veena serve`` server that many bot processes
share (then this process loads no model at all). The pipeline here needs no API key: it greets
the caller, and after each turn the caller speaks (Silero VAD) it says a canned answer. A real
agent puts STT and an LLM in its place, e.g. ``[transport.input(), stt, user_aggregator, llm, tts,
transport.output(), assistant_aggregator]`` with any Pipecat STT (Deepgram, Whisper) and LLM
(OpenAI, a local vLLM).

Security: with ``TWILIO_AUTH_TOKEN`` set, the webhook checks Twilio's ``X-Twilio-Signature``
on every request (403 otherwise), so nobody else can make the engine talk by posting to it;
set ``PUBLIC_URL`` to the URL Twilio calls (e.g. your ngrok URL) when a proxy rewrites it. The
media WebSocket serves Twilio Media Streams only: any other client is closed with a reason.

Run:
    .venv/bin/pip install -e '.[twilio]'
    VEENA_MODEL=/models/Spark-TTS-0.5B TWILIO_AUTH_TOKEN=... \
        .venv/bin/uvicorn examples.twilio_bot:app --port 8765
    ngrok http 8765   # then set the Twilio number's voice webhook to POST https://<host>/

    # or against a speech server (pipecat-veena serve --model ... --port 8000 on the GPU box):
    VEENA_SERVER_URL=ws://tts-host:8000 VEENA_API_KEY=... .venv/bin/uvicorn examples.twilio_bot:app
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse
from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import Frame, TTSSpeakFrame, VADUserStoppedSpeakingFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
from pipecat.workers.runner import WorkerRunner

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.service import VeenaTTSService

TWILIO_RATE = 8000
GREETING = "नमस्ते! Thank you for calling. How can I help you today?"
ANSWER = "Ji, main samajh gayi. Let me check that for you."


class CannedAnswer(FrameProcessor):
    """Stands in for STT + LLM: says ``answer`` after each turn the caller speaks."""

    def __init__(self, answer: str = ANSWER) -> None:
        """Say ``answer`` at the end of every spoken user turn."""
        super().__init__()
        self._answer = answer

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Pass every frame on; queue the answer when the caller stops speaking."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            await self.push_frame(TTSSpeakFrame(self._answer))


def twilio_signature(auth_token: str, url: str, params: dict[str, str]) -> str:
    """Twilio's request signature: base64 HMAC-SHA1 of the URL and the sorted POST params."""
    payload = url + "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _checkpoint() -> Path:
    model = os.environ.get("VEENA_MODEL")
    if model:
        return Path(model)
    from pipecat_veena.demo import build_demo_checkpoint

    logger.warning("VEENA_MODEL is not set: using the demo checkpoint (sound, not words)")
    return build_demo_checkpoint("spark")


def make_engine() -> SpeechEngine:
    """A speech server's engine (VEENA_SERVER_URL, VEENA_API_KEY) or one in this process."""
    url = os.environ.get("VEENA_SERVER_URL")
    if url:
        from pipecat_veena.remote import RemoteVeenaEngine

        return RemoteVeenaEngine(url, api_key=os.environ.get("VEENA_API_KEY"))
    return VeenaEngine(EngineConfig(checkpoint=_checkpoint()))


def create_app(engine: SpeechEngine | None = None) -> FastAPI:
    """The bot's app; it starts (and later shuts down) its own engine unless given one."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        owned = engine is None
        app.state.engine = make_engine() if owned else engine
        await app.state.engine.start()  # once per process, before serving calls
        try:
            yield
        finally:
            if owned:
                await app.state.engine.shutdown()

    app = FastAPI(lifespan=lifespan)
    app.post("/")(twiml)
    app.websocket("/ws")(call)
    return app


async def twiml(request: Request) -> HTMLResponse:
    """Answer Twilio's webhook: stream the call's audio to our WebSocket.

    Raises:
        HTTPException: 403 when ``TWILIO_AUTH_TOKEN`` is set and the signature is wrong.
    """
    token = os.environ.get("TWILIO_AUTH_TOKEN")
    if token:
        url = os.environ.get("PUBLIC_URL") or str(request.url).replace("http://", "https://", 1)
        params = {k: str(v) for k, v in (await request.form()).items()}
        expected = twilio_signature(token, url, params)
        given = request.headers.get("x-twilio-signature", "")
        if not hmac.compare_digest(expected, given):
            logger.warning(f"rejected a webhook call without a valid Twilio signature for {url}")
            raise HTTPException(403, "invalid X-Twilio-Signature")
    host = request.headers.get("host")
    return HTMLResponse(
        f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
        f'<Stream url="wss://{host}/ws"></Stream></Connect><Pause length="40"/></Response>',
        media_type="application/xml",
    )


async def call(websocket: WebSocket) -> None:
    """One phone call: its own transport, pipeline and TTS service over the shared engine."""
    await websocket.accept()
    try:
        provider, call_data = await parse_telephony_websocket(websocket)
    except (WebSocketDisconnect, ValueError) as e:  # gone before its handshake
        logger.info(f"a media client left before its handshake ({type(e).__name__})")
        return
    if provider != "twilio":
        logger.warning(f"refused a {provider!r} client on the Twilio media endpoint")
        await websocket.close(code=1008, reason="this endpoint serves Twilio Media Streams only")
        return
    serializer = TwilioFrameSerializer(
        stream_sid=call_data["stream_id"],
        call_sid=call_data["call_id"],
        account_sid=os.environ.get("TWILIO_ACCOUNT_SID"),
        auth_token=os.environ.get("TWILIO_AUTH_TOKEN"),
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
    )
    transport = FastAPIWebsocketTransport(
        websocket=websocket,
        params=FastAPIWebsocketParams(
            audio_in_enabled=True, audio_out_enabled=True, serializer=serializer
        ),
    )
    tts = VeenaTTSService(websocket.app.state.engine, voice=os.environ.get("VEENA_VOICE"))
    worker = PipelineWorker(
        Pipeline(
            [
                transport.input(),
                VADProcessor(vad_analyzer=SileroVADAnalyzer(sample_rate=TWILIO_RATE)),
                # stt, user_aggregator, llm (in place of CannedAnswer)
                CannedAnswer(),
                tts,
                transport.output(),
                # assistant_aggregator
            ]
        ),
        params=PipelineParams(
            audio_in_sample_rate=TWILIO_RATE,
            audio_out_sample_rate=TWILIO_RATE,
            enable_metrics=True,
            enable_usage_metrics=True,
        ),
    )

    @transport.event_handler("on_client_connected")
    async def on_connected(transport, client):
        await worker.queue_frames([TTSSpeakFrame(GREETING)])

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


app = create_app()
