"""A Twilio phone bot: FastAPI serves TwiML and the media WebSocket; audio at 8 kHz mu-law.

One engine is started in the app's lifespan (once per process) and every call gets its own
pipeline and VeenaTTSService over it: a VeenaEngine in this process, or, with VEENA_SERVER_URL
set, a RemoteVeenaEngine speaking to a ``pipecat-veena serve`` server that many bot processes
share (then this process loads no model at all). The pipeline here only speaks (a greeting and
an answer) so it runs without any API key; a real agent puts STT and an LLM between
transport.input() and the TTS, e.g. ``[transport.input(), stt, user_aggregator, llm, tts,
transport.output(), assistant_aggregator]`` with any Pipecat STT (Deepgram, Whisper) and LLM
(OpenAI, a local vLLM).

Run:
    .venv/bin/pip install -e '.[twilio]'
    VEENA_MODEL=/models/Spark-TTS-0.5B .venv/bin/uvicorn examples.twilio_bot:app --port 8765
    ngrok http 8765   # then set the Twilio number's voice webhook to POST https://<host>/

    # or against a speech server (pipecat-veena serve --model ... --port 8000 on the GPU box):
    VEENA_SERVER_URL=ws://tts-host:8000 VEENA_API_KEY=... .venv/bin/uvicorn examples.twilio_bot:app
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse
from loguru import logger
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
from pipecat.workers.runner import WorkerRunner

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.service import VeenaTTSService

TWILIO_RATE = 8000
GREETING = "नमस्ते! Thank you for calling. How can I help you today?"


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


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the one shared engine before serving calls; shut it down at exit."""
    app.state.engine = make_engine()
    await app.state.engine.start()
    try:
        yield
    finally:
        await app.state.engine.shutdown()


app = FastAPI(lifespan=lifespan)


@app.post("/")
async def twiml(request: Request) -> HTMLResponse:
    """Answer Twilio's webhook: stream the call's audio to our WebSocket."""
    host = request.headers.get("host")
    return HTMLResponse(
        f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
        f'<Stream url="wss://{host}/ws"></Stream></Connect><Pause length="40"/></Response>',
        media_type="application/xml",
    )


@app.websocket("/ws")
async def call(websocket: WebSocket) -> None:
    """One phone call: its own transport, pipeline and TTS service over the shared engine."""
    await websocket.accept()
    _, call_data = await parse_telephony_websocket(websocket)
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
        Pipeline([transport.input(), tts, transport.output()]),
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
