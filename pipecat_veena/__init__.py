"""pipecat_veena: self-hosted streaming LLM-TTS (BiCodec and SNAC) for Pipecat voice agents.

Public names are imported lazily so that ``import pipecat_veena`` stays cheap and the engine
never drags Pipecat (or vLLM) in with it.
"""

from pipecat_veena.lazy import lazy_names

__version__ = "0.1.0"

_PUBLIC = {
    "AudioChunk": "pipecat_veena.interface",
    "EngineConfig": "pipecat_veena.engine",
    "VeenaEngine": "pipecat_veena.engine",
    "StreamConfig": "pipecat_veena.streaming",
    "StreamDecoder": "pipecat_veena.streaming",
    "VeenaTTSService": "pipecat_veena.service",
    "RemoteVeenaEngine": "pipecat_veena.remote",
    "SpeechEngine": "pipecat_veena.interface",
    "build_demo_checkpoint": "pipecat_veena.demo",
}

__all__ = ["__version__", *_PUBLIC]

__getattr__ = lazy_names(__name__, _PUBLIC)
