"""A LiveKit voice agent that speaks with VeenaTTS: self-hosted streaming LLM-TTS in-process.

One VeenaEngine per worker process, loaded in the worker's prewarm and kept in
``proc.userdata``. LiveKit runs prewarm before any event loop exists and gives every job a
new loop, while vLLM binds an engine to the loop it started in, so the engine runs in an
``EngineThread`` that serves every job's loop. Jobs run as threads of the one worker process
(``JobExecutorType.THREAD``): every call shares one copy of the weights. With the default
process executor each job process would load an engine of its own.

STT and LLM: the strings below go through LiveKit Inference (LiveKit Cloud credentials). Any
LiveKit STT/LLM plugin works instead, e.g. ``deepgram.STT(model="nova-3", language="multi")``
or ``sarvam.STT()`` for Hindi and Hinglish, and ``openai.LLM(base_url=...)`` pointed at a
self-hosted OpenAI-compatible server (vLLM, Ollama) for a fully self-hosted agent. Add a VAD
(``livekit-plugins-silero``) for snappier turn-taking. Ask the LLM for plain sentences: the
session's default text transforms drop markdown and emoji before the TTS sees them.

Run (LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET set):
    VEENA_CHECKPOINT=/models/Spark-TTS-0.5B VEENA_VOICE=female python examples/livekit_agent.py dev
Without VEENA_CHECKPOINT the demo checkpoint is used (a random voice: sound, not words).
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

from livekit.agents import Agent, AgentServer, AgentSession, JobContext, JobExecutorType, cli
from loguru import logger

from pipecat_veena.engine import EngineConfig
from pipecat_veena.engine_thread import EngineThread
from pipecat_veena.livekit import VeenaTTS

STT_MODEL = os.environ.get("STT_MODEL", "deepgram/nova-3")
LLM_MODEL = os.environ.get("LLM_MODEL", "openai/gpt-4.1-mini")
INSTRUCTIONS = (
    "You are a friendly voice assistant. Answer in short spoken sentences, in the user's "
    "language (Hindi, English or a mix). No lists, markdown or emoji."
)

_engine: EngineThread | None = None
_engine_lock = threading.Lock()


def _checkpoint() -> Path:
    path = os.environ.get("VEENA_CHECKPOINT")
    if path:
        return Path(path)
    from pipecat_veena.demo import build_demo_checkpoint

    return build_demo_checkpoint("spark")


def prewarm(proc) -> None:
    """Worker prewarm: load this process's engine once (job threads share it)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            logger.info("loading the Veena engine (once per worker process)")
            _engine = EngineThread.launch(EngineConfig(checkpoint=_checkpoint()))
            atexit.register(_engine.close)
    proc.userdata["veena"] = _engine


server = AgentServer(
    setup_fnc=prewarm,
    job_executor_type=JobExecutorType.THREAD,
    initialize_process_timeout=600.0,  # the first prewarm loads vLLM and the codec
)


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    """One call: STT -> LLM -> VeenaTTS, speaking sentence by sentence as the LLM writes."""
    tts = VeenaTTS(ctx.proc.userdata["veena"], voice=os.environ.get("VEENA_VOICE"))
    session = AgentSession(stt=STT_MODEL, llm=LLM_MODEL, tts=tts)
    await session.start(agent=Agent(instructions=INSTRUCTIONS), room=ctx.room)
    await session.generate_reply(instructions="Greet the user and offer your help.")


if __name__ == "__main__":
    cli.run_app(server)
