"""A Daily (WebRTC) room bot speaking with VeenaTTSService over one shared engine.

The engine runs in this process (VEENA_MODEL), or on a ``pipecat-veena serve`` speech server
that many bot processes share (VEENA_SERVER_URL, with VEENA_API_KEY when it has keys).

Needs the Daily transport: ``.venv/bin/pip install -e '.[daily]'`` and a room URL (and token
for private rooms). As in twilio_bot.py the pipeline only speaks; a full agent adds STT and an
LLM between ``transport.input()`` and the TTS.

Run:
    DAILY_ROOM_URL=https://you.daily.co/room VEENA_MODEL=/models/Spark-TTS-0.5B \
        .venv/bin/python examples/daily_bot.py
    DAILY_ROOM_URL=https://you.daily.co/room VEENA_SERVER_URL=ws://tts-host:8000 \
        .venv/bin/python examples/daily_bot.py
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from loguru import logger
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.workers.runner import WorkerRunner

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.service import VeenaTTSService

GREETING = "नमस्ते! Welcome to the room. Main aapki kya madad kar sakti hoon?"


def _daily_transport(room_url: str, token: str | None):
    try:
        from pipecat.transports.daily.transport import DailyParams, DailyTransport
    except ImportError as e:
        raise SystemExit(
            f"the Daily transport is not installed ({e}): pip install -e '.[daily]'"
        ) from e
    return DailyTransport(
        room_url, token, "Veena bot", DailyParams(audio_in_enabled=True, audio_out_enabled=True)
    )


def make_engine() -> SpeechEngine:
    """A speech server's engine (VEENA_SERVER_URL, VEENA_API_KEY) or one in this process."""
    url = os.environ.get("VEENA_SERVER_URL")
    if url:
        from pipecat_veena.remote import RemoteVeenaEngine

        return RemoteVeenaEngine(url, api_key=os.environ.get("VEENA_API_KEY"))
    model = os.environ.get("VEENA_MODEL")
    if model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        logger.warning("VEENA_MODEL is not set: using the demo checkpoint (sound, not words)")
        model = build_demo_checkpoint("spark")
    return VeenaEngine(EngineConfig(checkpoint=Path(model)))


async def main() -> None:
    """Start the engine once, then join the room and greet each participant."""
    room_url = os.environ.get("DAILY_ROOM_URL")
    if not room_url:
        raise SystemExit("set DAILY_ROOM_URL to a Daily room URL")
    engine = make_engine()
    await engine.start()
    try:
        transport = _daily_transport(room_url, os.environ.get("DAILY_TOKEN"))
        tts = VeenaTTSService(engine, voice=os.environ.get("VEENA_VOICE"))
        worker = PipelineWorker(
            Pipeline([transport.input(), tts, transport.output()]),
            params=PipelineParams(audio_out_sample_rate=24000, enable_metrics=True),
        )

        @transport.event_handler("on_first_participant_joined")
        async def on_joined(transport, participant):
            await worker.queue_frames([TTSSpeakFrame(GREETING)])

        @transport.event_handler("on_participant_left")
        async def on_left(transport, participant, reason):
            await worker.cancel()

        runner = WorkerRunner()
        await runner.add_workers(worker)
        await runner.run()
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
