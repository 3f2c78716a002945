"""A local WebRTC voice bot: open a page, connect, and hear VeenaTTSService speak.

No Daily or Twilio account: Pipecat's ``SmallWebRTCTransport`` talks to the browser directly. One
VeenaEngine is started in the server's lifespan (once per process) and every connection gets its
own pipeline and VeenaTTSService over it. The bot greets the caller when they connect, speaks
whatever is typed into the page's text box, and gives a canned answer after each spoken turn
(Silero VAD). With an STT service and an LLM in the pipeline (the commented slots in
``build_pipeline``) it becomes a real agent.

Two pages, same bot:
- ``/``: a small self-contained page (``webrtc_client.html``) that fetches nothing from
  outside this server. Works on a closed network.
- ``/client/``: Pipecat's prebuilt client (``pipecat-ai-small-webrtc-prebuilt`` 2.5), with
  conversation and metrics panels. It loads Daily's media bundle from c.daily.co to reach the
  microphone, so it needs internet access: on a closed network it never connects.

Run:
    .venv/bin/pip install -e '.[webrtc]'
    .venv/bin/python examples/webrtc_bot.py            # then open http://localhost:7860/
    .venv/bin/python examples/webrtc_bot.py --model /models/Spark-TTS-0.5B --voice female

On the demo checkpoint (the default) the voice is random: you hear sound, not words.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import Frame, TTSSpeakFrame, VADUserStoppedSpeakingFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.processors.frameworks.rtvi.frames import RTVISendTextFrame
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.service import VeenaTTSService

try:
    from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
    from pipecat.transports.smallwebrtc.request_handler import (
        SmallWebRTCPatchRequest,
        SmallWebRTCRequest,
        SmallWebRTCRequestHandler,
    )
    from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
    from pipecat_ai_small_webrtc_prebuilt.frontend import SmallWebRTCPrebuiltUI
except ImportError as e:  # aiortc (pipecat-ai[webrtc]) or the prebuilt page is missing
    raise SystemExit(
        f"the WebRTC transport or its page is not installed ({e}): pip install -e '.[webrtc]'"
    ) from e

CLIENT_PAGE = Path(__file__).with_name("webrtc_client.html")
GREETING = "नमस्ते! Welcome to the pipecat-veena WebRTC demo. Type something and I will say it."
ANSWER = "Main sun rahi hoon. Type your text in the box and I will speak it."


class TextReplies(FrameProcessor):
    """Stands in for STT + LLM: speaks typed text, and a canned answer after each spoken turn.

    Both pages send typed text as an RTVI ``send-text`` message (``run_immediately``: the bot
    is interrupted first). Pipecat's RTVIProcessor, which PipelineWorker puts at the head of the
    pipeline, turns it into an ``LLMMessagesAppendFrame`` for an LLM (unused here) and an
    ``RTVISendTextFrame`` with the text, which is what this processor speaks.
    """

    def __init__(self, *, answer: str = ANSWER, **kwargs: Any) -> None:
        """Speak typed text as it is; ``answer`` (empty: none) after each spoken user turn."""
        super().__init__(**kwargs)
        self._answer = answer

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Pass every frame on; queue speech for typed text and for the end of a spoken turn."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, RTVISendTextFrame) and frame.text.strip():
            await self.push_frame(TTSSpeakFrame(frame.text))
        elif isinstance(frame, VADUserStoppedSpeakingFrame) and self._answer:
            await self.push_frame(TTSSpeakFrame(self._answer))


def build_pipeline(
    transport: SmallWebRTCTransport, tts: VeenaTTSService, *, answer: str = ANSWER
) -> Pipeline:
    """One connection's pipeline: browser audio in, VAD, replies, Veena TTS, browser audio out.

    A real agent replaces ``TextReplies`` with STT and an LLM (any Pipecat services; the
    RTVIProcessor already turns typed text into LLM context messages)::

        stt = DeepgramSTTService(api_key=...)        # or WhisperSTTService(...) locally
        llm = OpenAILLMService(api_key=..., model="gpt-4.1-mini")
        user_agg, assistant_agg = LLMContextAggregatorPair(LLMContext(...))
        Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])
    """
    return Pipeline(
        [
            transport.input(),
            VADProcessor(vad_analyzer=SileroVADAnalyzer()),
            # stt,
            TextReplies(answer=answer),
            # user_agg, llm,
            tts,
            transport.output(),
            # assistant_agg,
        ]
    )


async def run_bot(
    connection: SmallWebRTCConnection,
    engine: VeenaEngine,
    *,
    voice: str | None,
    greeting: str,
    answer: str,
) -> None:
    """Run one connection's pipeline until the browser hangs up."""
    transport = SmallWebRTCTransport(
        webrtc_connection=connection,
        params=TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    )
    tts = VeenaTTSService(engine, voice=voice)
    worker = PipelineWorker(
        build_pipeline(transport, tts, answer=answer),
        params=PipelineParams(enable_metrics=True, enable_usage_metrics=True),
    )

    @transport.event_handler("on_client_connected")
    async def on_connected(transport, client):
        if greeting:
            await worker.queue_frames([TTSSpeakFrame(greeting)])

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def create_app(
    checkpoint: Path,
    *,
    voice: str | None = None,
    greeting: str = GREETING,
    answer: str = ANSWER,
) -> FastAPI:
    """The web app: the two pages, ``POST /start`` and the WebRTC offer endpoints.

    The prebuilt client (2.5) posts to ``/start`` (answered with a session id), then sends its
    SDP offer (POST) and ICE candidates (PATCH) to ``/sessions/{id}/api/offer``. ``/api/offer``
    takes the same requests without a session, as ``/`` and Pipecat's other clients send
    them. No ICE servers are configured: host candidates only, nothing outside is contacted.

    Args:
        checkpoint: the checkpoint directory the engine loads (in the app's lifespan).
        voice: the voice every connection speaks with (None: the checkpoint's default).
        greeting: said when a browser connects ("": nothing).
        answer: said after each spoken user turn ("": nothing).
    """
    handler = SmallWebRTCRequestHandler()
    bots: set[asyncio.Task] = set()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = VeenaEngine(EngineConfig(checkpoint=checkpoint))
        await engine.start()  # once per process, shared by every connection
        app.state.engine = engine
        try:
            engine.check_voice(voice)  # a bad --voice fails here, naming the valid ones
            logger.info(f"WebRTC bot ready on {engine} (voices: {', '.join(engine.voices)})")
            yield
        finally:
            await handler.close()
            for task in list(bots):
                task.cancel()
            await asyncio.gather(*bots, return_exceptions=True)
            await engine.shutdown()

    def _bot_done(task: asyncio.Task) -> None:
        bots.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.opt(exception=task.exception()).error("a WebRTC bot session failed")

    app = FastAPI(lifespan=lifespan)

    @app.post("/start")
    async def start() -> dict[str, str]:
        """Open a session; the bot itself starts when the WebRTC offer arrives."""
        return {"sessionId": str(uuid.uuid4())}

    @app.post("/api/offer")
    @app.post("/sessions/{session_id}/api/offer")
    async def offer(request: SmallWebRTCRequest, session_id: str = "") -> dict[str, str]:
        """Answer an SDP offer; a new peer connection starts its own pipeline."""

        async def start_bot(connection: SmallWebRTCConnection) -> None:
            task = asyncio.create_task(
                run_bot(connection, app.state.engine, voice=voice, greeting=greeting, answer=answer)
            )
            bots.add(task)
            task.add_done_callback(_bot_done)

        sdp_answer = await handler.handle_web_request(request, start_bot)
        if sdp_answer is None:
            raise HTTPException(status_code=500, detail="the WebRTC connection gave no answer")
        return sdp_answer

    @app.patch("/api/offer")
    @app.patch("/sessions/{session_id}/api/offer")
    async def ice_candidates(
        request: SmallWebRTCPatchRequest, session_id: str = ""
    ) -> dict[str, str]:
        """Add the browser's trickled ICE candidates to its peer connection."""
        await handler.handle_patch_request(request)
        return {"status": "success"}

    @app.get("/", response_class=HTMLResponse)
    async def local_page() -> str:
        """The self-contained page: needs nothing outside this server."""
        return CLIENT_PAGE.read_text(encoding="utf-8")

    app.mount("/client", SmallWebRTCPrebuiltUI)  # Pipecat's runner serves it here too
    return app


def main() -> None:
    """Parse the command line and serve the bot until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="localhost", help="address to listen on")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    parser.add_argument("--voice", default=None, help="voice name (default: the model's)")
    parser.add_argument("--greeting", default=GREETING, help="said on connect ('' for none)")
    parser.add_argument("--answer", default=ANSWER, help="said after each spoken turn ('': none)")
    args = parser.parse_args()
    if args.model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        logger.warning("--model not given: using the demo checkpoint (sound, not words)")
        args.model = build_demo_checkpoint("spark")

    import uvicorn

    url = f"http://{args.host}:{args.port}"
    print("pipecat-veena WebRTC bot, once the engine is up (a few seconds to a minute):")
    print(f"  {url}/         self-contained page, works offline")
    print(f"  {url}/client/  Pipecat's prebuilt client (needs internet: Daily's media bundle)")
    app = create_app(args.model, voice=args.voice, greeting=args.greeting, answer=args.answer)
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
